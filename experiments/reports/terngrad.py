"""TernGrad's experiments in the report (Wen et al., NeurIPS 2017, arXiv:1705.07878).

The sections live beside this module, one per group of the paper's figures
and tables:

* :mod:`experiments.reports.terngrad_convergence`: TG-F3 (LeNet, Fig. 3) with
  its seed spread, logits-in-float ablation and mechanism; TG-F2 (Fig. 2's
  histograms, computed live by notebook 02);
* :mod:`experiments.reports.terngrad_tables`: TG-T1 (CifarNet, Table 1),
  TG-T2/TG-T3 (ImageNet, Tables 2 and 3) and TG-F4, drawn from TG-T2's
  N = 4 runs;
* :mod:`experiments.reports.terngrad_throughput`: TG-F5, the
  performance-model estimates of Fig. 5 (Appendix B).

The paper's numbers come from each config module's ``PAPER``.
"""

from __future__ import annotations

from experiments.reports.terngrad_convergence import render_tg_f2, render_tg_f3
from experiments.reports.terngrad_tables import render_tg_f4, render_tg_t1, render_tg_t2, render_tg_t3
from experiments.reports.terngrad_throughput import render_tg_f5

RENDERERS = {"TG-F3": render_tg_f3, "TG-T1": render_tg_t1, "TG-T2": render_tg_t2, "TG-T3": render_tg_t3,
             "TG-F2": render_tg_f2, "TG-F4": render_tg_f4, "TG-F5": render_tg_f5}
RUNS_FROM = {"TG-F4": "TG-T2"}
RENDER_WITHOUT_RUNS = ("TG-T2", "TG-T3", "TG-F2", "TG-F4", "TG-F5")
