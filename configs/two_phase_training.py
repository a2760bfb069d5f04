r"""Training with the two-phase exchange (this project's addition; TG-F3 and 3LC-T1 settings).

The two-phase exchange (``exchange="two_phase"``, :mod:`jaxcomp.exchange.two_phase`)
reduces in a compressed all-to-all and re-encodes each worker's shard of the
mean before a compressed all-gather, as Dryden et al. (MLHPC 2016, §3.4) and
3LC (MLSys 2019, §3: compressed pushes and pulls) do, so that a worker's
traffic does not grow with the number of workers. Its second quantization
adds error (unbiased for TernGrad, with its own residual for 3LC); these runs
check what that costs in accuracy against the all-gather exchange and float.

Two grids, one per argument:

* ``lenet`` (default): TG-F3's settings (LeNet, total batch 64, momentum SGD
  0.01, polynomial decay, weight decay 5e-4, TernGrad with 2.5σ clipping and
  the parameter EMA, ``configs/terngrad_lenet.py``) at N = 8 and 64 workers,
  REDUCED to :data:`LENET_STEPS` steps (the committed TG-F3 runs have 10,000;
  a 64-worker TernGrad run of them took two hours on this machine): float,
  all-gather TernGrad and two-phase TernGrad, the same steps and seed.
* ``resnet``: the reduced 3LC-T1 (``configs/threelc_resnet110.py:runlocal``:
  ResNet-8 on Fashion-MNIST, 10 workers x 32, 600 steps) with two-phase 3LC
  (s = 1.00: pushes and pulls compressed, as in the paper); its float and
  all-gather 3LC rows are 3LC-T1's committed runs (same steps and seed).
  Labelled rows ``.warmup<w>``: two-phase 3LC with a learning-rate warm-up
  over the first ``w`` steps (:data:`RESNET_WARMUPS`), and all-gather 3LC
  with one of them as the control (at the full scaled LR from step 0 the
  two-phase run falls behind in its first steps and does not catch up
  within 600; docs/results.md, TWO-PHASE).

Run::

  python -m experiments.sweep --config configs/two_phase_training.py --root runs --checkpoint_every 0
  python -m experiments.sweep --config configs/two_phase_training.py:resnet --root runs --checkpoint_every 0
"""

from __future__ import annotations

import ml_collections

from configs import common
from configs import resnet_cifar
from configs import terngrad_lenet
from configs import threelc_resnet110

LENET_WORKERS = (8, 64)
LENET_STEPS = 1000
LENET_DESIGNS = {
    "float": ("floating", {"compressor": "none"}),
    "terngrad": ("TernGrad, all-gather", {"compressor": "terngrad"}),
    "terngrad_two_phase": ("TernGrad, two-phase", {"compressor": "terngrad"}),
}
# Labelled rows: two-phase 3LC with a linear learning-rate warm-up over the first w steps, a
# small sweep (Goyal et al., arXiv:1706.02677, §2.2, warm up over 5 of 90 epochs, 5.6 %; the
# large-batch guideline 3LC §4.3 follows; 3LC-T1 itself starts at the full scaled LR), and
# all-gather 3LC with a 30-step warm-up as its control. The report picks the smallest w whose
# run is within RESNET_WITHIN points of the all-gather 3LC row (3LC-T1's, no warm-up).
RESNET_WARMUPS = (15, 30)
RESNET_CONTROL_WARMUP = 30
RESNET_WITHIN = 1.0


def _two_phase_3lc(warmup: int = 0) -> dict:
  d = resnet_cifar.design("threelc", sparsity=1.0, exchange="two_phase")
  return {**d, "lr_warmup_steps": warmup} if warmup else d


RESNET_DESIGNS = {
    "3lc_s1.00_two_phase": ("3LC (s=1.00), two-phase", _two_phase_3lc()),
    **{f"3lc_s1.00_two_phase.warmup{w}": (f"3LC (s=1.00), two-phase, {w}-step warm-up", _two_phase_3lc(w))
       for w in RESNET_WARMUPS},
    f"3lc_s1.00.warmup{RESNET_CONTROL_WARMUP}": (
        f"3LC (s=1.00), all-gather, {RESNET_CONTROL_WARMUP}-step warm-up",
        {**resnet_cifar.design("threelc", sparsity=1.0), "lr_warmup_steps": RESNET_CONTROL_WARMUP}),
}


def _exchange(name: str) -> dict:
  # compressor_kwargs as a whole (TernGrad's clipping kept beside the exchange).
  kwargs = {"clip_sigma": 2.5, "exchange": "two_phase"} if name.endswith("two_phase") else {"clip_sigma": 2.5}
  return {"compressor_kwargs": kwargs}


def get_sweep(arg: str | None = None) -> list[tuple]:
  args = common.parse_arg(arg, allowed=("lenet", "resnet"))
  if "resnet" in args:
    return [(name, dict(overrides), "resnet") for name, (_, overrides) in RESNET_DESIGNS.items()]
  runs = []
  for n in LENET_WORKERS:
    for name, (_, overrides) in LENET_DESIGNS.items():
      extra = _exchange(name) if overrides["compressor"] == "terngrad" else {}
      runs.append((f"lenet/N{n:02d}/{name}", {**overrides, **extra, "workers": n}))
  return runs


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, allowed=("lenet", "resnet"))
  if "resnet" in args:
    c = threelc_resnet110.get_config("runlocal")
  else:
    c = terngrad_lenet.get_config("runlocal")
    c.num_train_steps = LENET_STEPS
    c.log_every = 50
    c.eval_every = LENET_STEPS // 4
  c.experiment = "TWO-PHASE"
  return c
