r"""zoo_gpt: every registered compressor, and DiLoCo, on the same language-model run.

The zoo's second table (``docs/zoo.md``, by ``python -m experiments.zoo``): each entry of
:func:`jaxcomp.names` at run time trains a small GPT (``jaxcomp/models/gpt.py``) on the GCIDE
dictionary's English text (real, offline: Debian's ``dict-gcide``, byte-level tokens) with
``configs/gpt_text.py:runlocal``'s recipe (AdamW with β2 = 0.95 and decoupled weight decay 0.1
on the matrices, linear warm-up then cosine decay to a tenth, gradients clipped to global norm 1,
4 simulated workers, total batch 32 windows), for the same :data:`STEPS` steps with seeds
:data:`SEEDS`. DiLoCo (Douillard et al., arXiv:2311.08105) runs at H = 10 and 50 with float32 and
8-bit pseudo-gradients (:data:`DILOCO`).

REDUCED SCALE: a 0.12M-parameter GPT (context 64, width 64, 2 blocks) instead of
``gpt_text.py:runlocal``'s 0.8M (context 128, width 128, 4 blocks), and :data:`STEPS` steps
instead of its 1,000 at a larger batch, so that the whole table (about 30 rows x 3 seeds, one
process per run) fits in about an hour and a half of a 2-core CPU machine: measured here, the
small model trains at about 27 steps/s, the larger at about 4 (2026-11-28; 1.6 at a load of 10). The bits per byte rank the
methods after a short run; they are not converged values.

One rule for every row: every tensor goes through the compressor (no last-layer or bias
exception), except where a compressor's paper keeps small tensors in float (``min_size``, QSGD),
with the compressor's settings from the vision zoo (``configs/zoo.py:SETTINGS``: its paper's),
and AdamW after the exchange for every row (so the vision zoo's per-row optimizers, chosen for
momentum SGD on LeNet, do not apply), except 1-bit Adam, which is the optimizer itself: Adam's
own ε = 1e-8 and the recipe's β2, plain SGD after it applying the recipe's schedule, and no
gradient clipping after it (clipping would act on Adam's update, not on the gradient). Rows
that are weak at their papers' settings carry the measured cause (:data:`FINDINGS`, from the
runs of :data:`DIAGNOSES`) and a labelled row (:data:`LABELLED`) with the one change that
learned best.

Run::

  python -m experiments.zoo --config configs/zoo_gpt.py      # this table's steps only
  python -m experiments.sweep --config configs/zoo_gpt.py --root runs --checkpoint_every 0

Arguments (``configs/zoo_gpt.py:ARG``): ``runlocal``: a smoke test, labelled as such:
:data:`RUNLOCAL_NAMES`, :data:`RUNLOCAL_STEPS` steps, one seed. ``diloco``: DiLoCo's sweep of
H (:data:`DILOCO_H`) x outer learning rate (:data:`DILOCO_OUTER_LR`), seed 0, every step logged,
under ``runs/zoo_gpt_diloco/``. ``diagnose``: the weak rows with one piece changed
(:data:`DIAGNOSES`), seed 0, every step's norms logged, under ``runs/zoo_gpt_diagnosis/``. ``zero3``: the parameters sharded (ZeRO-3, :data:`ZERO3`), 3 seeds,
and :data:`ZERO3_PARTS`, seed 0, under ``runs/zoo_gpt_zero3/``.
"""

from __future__ import annotations

import ml_collections

from configs import common
from configs import gpt_text
from configs import zoo

STEPS = 1000
SEEDS = (0, 1, 2)
WORKERS = 4
RUNLOCAL_STEPS = 4
RUNLOCAL_NAMES = ("none", "terngrad")
ARGS = ("runlocal", "diloco", "diagnose", "zero3")
MODEL = {"context": 64, "width": 64, "depth": 2, "heads": 4}

# No throughput column (it does not depend on the model: the vision table has it); the step over
# the link is a whole training step of this config (benchmarks.train_step_link's ``gpt_zoo``).
THROUGHPUT_SIZE = None
LINK_CONFIG = "gpt_zoo"
LINK_PROCESSES = zoo.LINK_PROCESSES
LINK_RATE = zoo.LINK_RATE
LINK_TIMED_STEPS = 50  # one DiLoCo period at H = 50, five at H = 10
LINK_STATISTIC = "mean"  # over whole periods: a silent step and an exchanging one count as in a run
METRIC = "test_bits_per_byte"

# DiLoCo's rows: H inner AdamW steps, then the pseudo-gradients averaged in float32 or by the
# 8-bit int compressor with error feedback (as Streaming DiLoCo, arXiv:2501.18512, sends them),
# and applied by SGD with Nesterov momentum 0.9, LR 0.7 (the paper's §3).
DILOCO = {f"diloco.h{h}{'_int8' if ex else ''}": {"inner_steps": h, **({"exchange": ex} if ex else {})}
          for h in (10, 50) for ex in (None, "int8")}

# Streaming DiLoCo's rows (arXiv:2501.18512, Alg. 2): H inner AdamW steps, F fragments whose sends
# are staggered over them, each fragment's outer step τ inner steps after its send (the workers'
# fragments merged with α = 0.5), float32 or 4-bit E3M0 outer gradients. One factor at a time around
# a base row (STREAMING_BASE: H = 50, 4 fragments, τ = 1, float32): fragments 1 / 4 / one a tensor
# (the GPT has 28 tensors), τ 0 / 1 / 5, float32 / 4-bit; and the base at H = 10 (the best H of
# DiLoCo's sweep, DILOCO_FINDING), in float32 and 4-bit. F = 1, τ = 0 in float32 is diloco.h<H>.
STREAMING_BASE = {"inner_steps": 50, "fragments": 4, "delay": 1}
STREAMING_CHANGES = ({}, {"fragments": 1}, {"fragments": "tensors"}, {"delay": 0}, {"delay": 5},
                     {"exchange": "fp4"}, {"inner_steps": 10}, {"inner_steps": 10, "exchange": "fp4"})


def _streaming_name(kwargs: dict) -> str:
  return (f"diloco.h{kwargs['inner_steps']}.f{kwargs['fragments']}.t{kwargs['delay']}"
          + ("_fp4" if kwargs.get("exchange") else ""))


STREAMING = {_streaming_name(kw): kw for kw in ({**STREAMING_BASE, **change} for change in STREAMING_CHANGES)}

# The new rows set against their papers' claims (experiments.zoo fills in the figures from the table:
# {bpb:<row>} mean bits per byte, {bytes:<row>} and {peak:<row>} a worker's mean and largest step,
# {ratio:<row>} float32 bytes over the mean).
CLAIMS = {
    "Streaming DiLoCo: the peak bandwidth falls by the number of fragments (arXiv:2501.18512, §2.2).": (
        "Measured: with 4 fragments a worker's largest step is {peak:diloco.h50.f4.t1} against "
        "{peak:diloco.h50.f1.t1} with one, and {peak:diloco.h50.ftensors.t1} with one fragment a tensor (the "
        "largest tensor sets it), at the same mean ({bytes:diloco.h50.f4.t1} against {bytes:diloco.h50.f1.t1}) "
        "and the same quality ({bpb:diloco.h50.f4.t1}, {bpb:diloco.h50.f1.t1} and {bpb:diloco.h50.ftensors.t1} "
        "bits per byte). Fragments by layer are not equal in size here, so 4 of them divide the peak by less "
        "than 4."),
    "Streaming DiLoCo: an outer step applied τ steps late costs no quality for small τ (its Figs. 8-10).": (
        "Measured: {bpb:diloco.h50.f4.t1} at τ = 1 and {bpb:diloco.h50.f4.t5} at τ = 5, against "
        "{bpb:diloco.h50.f4.t0} at τ = 0 (4 fragments, H = 50): the late rows are better, not worse. Alg. 2's "
        "merge (α = 0.5) keeps half of each worker's own progress over the τ steps; that this is the cause was "
        "not isolated here. The wall-clock gain the paper simulates does not happen on XLA:CPU "
        "(docs/benchmarks.md, Streaming DiLoCo over a slow link)."),
    "Streaming DiLoCo: 4-bit outer gradients lose no quality (E3M0).": (
        "Measured: {bpb:diloco.h50.f4.t1_fp4} in 4 bits against {bpb:diloco.h50.f4.t1} in float32 at H = 50, "
        "{bpb:diloco.h10.f4.t1_fp4} against {bpb:diloco.h10.f4.t1} at H = 10: within the seeds' spread, as "
        "claimed."),
    "Streaming DiLoCo: about 400× less bandwidth than data-parallel at the same quality.": (
        "Measured: {ratio:diloco.h50.f4.t1_fp4} fewer bytes than float32 data-parallel at H = 50 in 4 bits, as "
        "the arithmetic gives (50 × 8), but not at the same quality after these 1,000 steps: "
        "{bpb:diloco.h50.f4.t1_fp4} against float's {bpb:none}; the best Streaming row, H = 10, reaches "
        "{bpb:diloco.h10.f4.t1} at {ratio:diloco.h10.f4.t1}. The paper's equal quality is at a far larger scale "
        "and a longer run."),
    "DeMo: up to 85× less data than AdamW with data-parallel, at comparable loss (arXiv:2411.19870).": (
        "Measured: the authors' defaults send {ratio:demo} less than float32 data-parallel ({bytes:demo} a "
        "worker a step) and end at {bpb:demo} against float AdamW's {bpb:none}; k = 8 sends {ratio:demo.k8} "
        "less and ends at {bpb:demo.k8}. At this scale (0.12M parameters, 1,000 steps) the loss is not "
        "comparable, and the seeds spread widely (the table)."),
}


# DeMo's rows (arXiv:2411.19870): the authors' defaults (top 32 of each 64x64 chunk's DCT) and a
# tighter k. DeMo is the optimizer: plain SGD after it applies the recipe's schedule to its signs,
# and no clipping after it (it would act on the signs), as for 1-bit Adam.
DEMO = {"demo": {}, "demo.k8": {"k": 8}}


# The vision zoo's "paper" texts that name the optimizer LeNet ran with: here it is AdamW.
METHODS = {
    "threshold": "Dryden et al. (MLHPC 2016) §3.2: fixed threshold τ = 0.001",
    "adaptive": "Dryden et al. (MLHPC 2016) §3.3: proportion π = 1/64, 128 samples",
    "signsgd": "signSGD with majority vote (Bernstein et al., ICML 2018, arXiv:1802.04434) Alg. 3",
    "ef_signsgd": "EF-SignSGD (Karimireddy et al., ICML 2019, arXiv:1901.09847) Alg. 1: scaled signs with "
                  "error feedback",
    "randomk": "random-k with memory (Stich et al., NeurIPS 2018, arXiv:1809.07599) Alg. 1: 1% of the "
               "values, error feedback",
    "signum": "Signum with majority vote (Bernstein et al., ICLR 2019, arXiv:1810.05291) Alg. 1: momentum "
              "0.9 inside",
    "dgc": "Deep Gradient Compression (Lin et al., ICLR 2018, arXiv:1712.01887) §3: 99.9% sparsity after "
           "its exponential warm-up (~5% of the steps), momentum correction 0.9",
}


# DiLoCo's dependence on H (``configs/zoo_gpt.py:diloco``): H x the outer learning rate, outer
# Nesterov momentum 0.9, float32 pseudo-gradients, seed 0, each run ``h<H>/outer_lr=<LR>``.
DILOCO_H = (1, 5, 10, 50)
DILOCO_OUTER_LR = (0.1, 0.3, 0.7, 1.0)
# and, to see what the outer momentum does, the plain average of the workers' parameters (outer
# SGD at LR 1 without momentum: the average of the inner updates, as local SGD / FedAvg), each run
# ``h<H>/average``: at H = 1 the mean of the workers' AdamW updates on every step.
DILOCO_AVERAGE_H = (1, 10)


# What the sweep shows (experiments.zoo fills in the figures from the committed runs: {bpb:<run>}
# bits per byte, {path:<run>} Σ ‖outer update‖, {amp:<run>} mean ‖outer update‖ / mean ‖mean Δ‖;
# none/paper is float AdamW of configs/zoo_gpt.py:diagnose, its path Σ ‖update‖).
DILOCO_FINDING = (
    "**Why H = 10 trails H = 50 at the paper's outer LR: the outer learning rate, not a defect.** At LR 0.7 "
    "the outer Nesterov step moves the shared parameters {amp:h10/outer_lr=0.7}× as far as the workers' "
    "mean pseudo-gradient at H = 10 ({amp:h50/outer_lr=0.7}× at H = 50; means over the outer steps), and "
    "H = 10 takes 100 such steps to H = 50's 20: its path, Σ ‖outer update‖, is {path:h10/outer_lr=0.7} "
    "against H = 50's {path:h50/outer_lr=0.7} and float AdamW's {path:none/paper}. At H = 10 and 50 the best "
    "Nesterov LR is the one whose path is nearest float's ({path:h10/outer_lr=0.3} at LR 0.3, "
    "{path:h50/outer_lr=0.7} at LR 0.7), and at its best LR H = 10 ({bpb:h10/outer_lr=0.3}) beats H = 50 "
    "({bpb:h50/outer_lr=0.7}), as fewer inner steps do in DiLoCo's ablation; the plain average does better "
    "still at H = 10 ({bpb:h10/average}, path {path:h10/average}). The paper's 0.7 goes with its H = 500. "
    "The outer step is Alg. 1's (`tests/test_diloco.py` checks it against a hand-written Nesterov step): H = 1 "
    "is far behind at every Nesterov LR ({bpb:h1/outer_lr=0.3} at its best), but the plain average at H = 1, "
    "the mean of the workers' AdamW steps, gives {bpb:h1/average} (float: {bpb:none/paper}): what H = 1 pays for is "
    "Nesterov's momentum stacked on AdamW's own at every step.")


def _diloco_sweep() -> list[tuple[str, dict]]:
  runs = [(f"h{h}/outer_lr={lr}", {"inner_steps": h, "outer_learning_rate": lr, "outer_momentum": 0.9})
          for h in DILOCO_H for lr in DILOCO_OUTER_LR]
  runs += [(f"h{h}/average", {"inner_steps": h, "outer_learning_rate": 1.0, "outer_momentum": 0.0})
           for h in DILOCO_AVERAGE_H]
  return [(name, {"compressor": "diloco", "seed": SEEDS[0], "compressor_kwargs": kwargs}) for name, kwargs in runs]



def _lr(lr: float) -> dict:
  """The recipe's schedule at peak LR ``lr``: the end of its cosine decay a tenth of it, as the recipe's."""
  return {"config": {"learning_rate": lr, "lr_end": round(lr / 10, 12)}}


# Runs that log every step's norms (config.log_norms) to show why a row is weak at its papers'
# settings (``configs/zoo_gpt.py:diagnose``): row -> {label: {"kwargs": ..., "config": ...} on
# top of the row's}, seed 0, each run ``<row>/<label>``; "paper" is the row as the table runs it.
# Each label changes one piece: the compressor's own setting (τ, density, fraction) or the
# learning rate of the AdamW after the exchange (peak and end of the cosine, scaled together).
DIAGNOSES = {
    "none": {"paper": {}},
    "threshold": {"paper": {}, "tau=0.01": {"kwargs": {"tau": 0.01}}, "tau=0.1": {"kwargs": {"tau": 0.1}},
                  "tau=0.03": {"kwargs": {"tau": 0.03}}},
    # clip_norm: DGC's local clipping (§3.2) at the recipe's global norm 1 (N^-1/2 per worker)
    # before accumulating; the row clips only after the exchange, as every row does.
    "dgc": {"paper": {}, "density=0.01": {"kwargs": {"density": 0.01}}, "density=0.1": {"kwargs": {"density": 0.1}},
            "clip_norm=1": {"kwargs": {"clip_norm": 1.0}}},
    "randomk": {"paper": {}, "fraction=0.1": {"kwargs": {"fraction": 0.1}}, "lr=0.01": _lr(0.01)},
    "signum": {"paper": {}, "lr=0.001": _lr(1e-3), "lr=0.0003": _lr(3e-4)},
    "ef_signsgd": {"paper": {}, "lr=0.001": _lr(1e-3), "lr=0.0003": _lr(3e-4)},
}


# What the diagnosis runs showed, per weak row (``experiments.zoo`` fills in the figures from the
# committed runs: {bpb:<run>} held-out bits per byte, {upd:<run>} mean ‖update‖, {res:<run>}
# ‖residual‖ at the end; <run> is ``<row>/<label>`` of ``configs/zoo_gpt.py:diagnose``).
FINDINGS: dict[str, str] = {
    "threshold": (
        "at τ = 0.001 most accumulated values are over τ at every step, only the capacity's 1/32 are sent, each "
        "as ±τ whatever its size, and AdamW turns those signs into full-size steps: ‖update‖ averages "
        "{upd:threshold/paper} (float's {upd:none/paper}) while the residual grows without bound to "
        "{res:threshold/paper}, and the model ends above the unigram entropy ({bpb:threshold/paper}). A larger τ "
        "lets error feedback catch up (residual {res:threshold/tau=0.1} at τ = 0.1) but sends too little to follow "
        "float in 1,000 steps ({bpb:threshold/tau=0.01} at τ = 0.01, {bpb:threshold/tau=0.03} at 0.03, "
        "{bpb:threshold/tau=0.1} at 0.1): τ at these settings, not a defect of ours."),
    "dgc": (
        "at 99.9% sparsity each worker sends about 120 of the 120,576 values a step, so a value goes out about "
        "once in a thousand steps of a worker: when the warm-up ends the accumulated velocity (the residual) "
        "grows a hundredfold (the plot), the update stays at {upd:dgc/paper} (float's {upd:none/paper}) and the "
        "model learns the byte frequencies only ({bpb:dgc/paper}). DGC's own local clipping at the recipe's norm "
        "1 keeps the residual two orders of magnitude smaller but learns no better ({bpb:dgc/clip_norm=1}); "
        "density does: {bpb:dgc/density=0.01} at 1%, {bpb:dgc/density=0.1} at 10%. The method at a 1,000-step "
        "run, not a defect of ours."),
    "randomk": (
        "1% of the values a step, at random, leaves each value unsent for about 100 steps: the residual ends "
        "at {res:randomk/paper} and the update stays at {upd:randomk/paper} (float's {upd:none/paper}), "
        "{bpb:randomk/paper}. A 3.3× larger AdamW learning rate does not help ({bpb:randomk/lr=0.01}: the "
        "normalised steps only get longer); 10% of the values does ({bpb:randomk/fraction=0.1}, residual "
        "{res:randomk/fraction=0.1}). The density at a 1,000-step run, not a defect of ours."),
    "signum": (
        "Signum votes with each worker's momentum, whose sign changes slowly, so the vote persists and AdamW, "
        "normalising it, moves nearly every weight by about its learning rate at every step: ‖update‖ averages "
        "{upd:signum/paper} (every weight moving by the LR would be 0.003 · √120,576 ≈ 1.04; float's "
        "{upd:none/paper}) and the run ends at {bpb:signum/paper}. A smaller AdamW learning rate is better "
        "({bpb:signum/lr=0.001} at 1e-3, {bpb:signum/lr=0.0003} at 3e-4): the recipe's LR, set for gradients, is "
        "too large for a persistent ±1 update. A setting of ours (the zoo's one rule), not a code defect."),
    "ef_signsgd": (
        "the error feedback works (the residual falls to {res:ef_signsgd/paper}) and ‖update‖ is float's size "
        "({upd:ef_signsgd/paper} against {upd:none/paper}), but AdamW normalises the averaged scaled signs into "
        "steps of about its learning rate on most weights, and at the recipe's 3e-3 seed 0 ends at "
        "{bpb:ef_signsgd/paper}. A third of the LR learns ({bpb:ef_signsgd/lr=0.001}, ‖update‖ "
        "{upd:ef_signsgd/lr=0.001}); a tenth is too slow ({bpb:ef_signsgd/lr=0.0003}). The AdamW learning rate, "
        "set for gradients, is too large for sign updates: a setting of ours (the zoo's one rule), not a code "
        "defect."),
}

# The labelled rows (3 seeds, in the table): name -> the diagnosis run whose one change it takes.
LABELLED: dict[str, str] = {
    "threshold.tau=0.1": "threshold/tau=0.1",
    "dgc.density=0.1": "dgc/density=0.1",
    "randomk.fraction=0.1": "randomk/fraction=0.1",
    "signum.lr=0.0003": "signum/lr=0.0003",
    "ef_signsgd.lr=0.001": "ef_signsgd/lr=0.001",
}


def _diagnoses() -> list[tuple[str, dict]]:
  out = []
  for name, runs in DIAGNOSES.items():
    for label, change in runs.items():
      o = overrides(name, SEEDS[0])
      if change.get("kwargs"):
        o["compressor_kwargs"] = {**o.get("compressor_kwargs", {}), **change["kwargs"]}
      out.append((f"{name}/{label}", {**o, **change.get("config", {})}))
  return out


def _row(name: str) -> dict:
  """The vision zoo's row for ``name``, with this zoo's optimizer rule (module docstring)."""
  row = zoo.SETTINGS[name]
  config = {k: v for k, v in row.get("config", {}).items() if k == "min_size"}
  out = {k: v for k, v in row.items() if k != "finding"}  # the findings are LeNet's
  return {**out, "config": config, "paper": METHODS.get(name, row["paper"])}


def _settings() -> dict[str, dict]:
  rows = {name: _row(name) for name, row in zoo.SETTINGS.items()
          if "compressor" not in row and name not in ("diloco", "dgc", "onebit_adam", "demo")}
  rows["dgc"] = {**_row("dgc"), "kwargs": {**zoo.SETTINGS["dgc"]["kwargs"],
                                           "warmup_steps": max(1, round(0.05 * STEPS))}}
  rows["onebit_adam"] = {
      "kwargs": {"freeze_step": round(0.15 * STEPS), "eps": 1e-8, "b2": 0.95},
      "timing": {"freeze_step": 1},
      "config": {"optimizer": "sgd", "grad_clip_norm": 0.0},
      "paper": "1-bit Adam (Tang et al., ICML 2021, arXiv:2102.02888): full Adam for the warm-up (15% of "
               "the steps), then 1-bit compressed momentum with frozen variance; Adam's own eps 1e-8 and "
               "the recipe's β2 0.95; it is the optimizer (plain SGD after it applies the recipe's schedule)"}
  for name, kwargs in DILOCO.items():
    rows[name] = {
        "compressor": "diloco", "kwargs": kwargs,
        "paper": f"DiLoCo (Douillard et al., arXiv:2311.08105) Alg. 1: H = {kwargs['inner_steps']} AdamW steps, "
                 + ("8-bit int pseudo-gradients with error feedback (as Streaming DiLoCo, arXiv:2501.18512)"
                    if "exchange" in kwargs else "float32 pseudo-gradients")
                 + ", outer SGD with Nesterov momentum 0.9, LR 0.7"}
  rows.update(_streaming_rows())
  rows.update(_demo_rows())
  for name, text in FINDINGS.items():
    rows[name] = {**rows[name], "finding": text}
  out = {}
  for name, row in rows.items():  # each labelled row after its paper-settings row
    out[name] = row
    out.update({label: _labelled(label, run, rows[name]) for label, run in LABELLED.items()
                if run.split("/")[0] == name})
  return out


def _streaming_rows() -> dict[str, dict]:
  """Streaming DiLoCo's rows (:data:`STREAMING`)."""
  rows = {}
  for name, kwargs in STREAMING.items():
    frags = "one a tensor" if kwargs["fragments"] == "tensors" else kwargs["fragments"]
    rows[name] = {
        "compressor": "diloco", "kwargs": kwargs,
        "paper": f"Streaming DiLoCo (Douillard et al., arXiv:2501.18512) Alg. 2: H = {kwargs['inner_steps']} AdamW "
                 f"steps, fragments: {frags}, outer step τ = {kwargs['delay']} steps after the send (merge "
                 "α = 0.5), " + ("4-bit E3M0" if "exchange" in kwargs else "float32") + " outer gradients, "
                 "outer SGD with Nesterov momentum 0.9, LR 0.7"}
  return rows


def _demo_rows() -> dict[str, dict]:
  """DeMo's rows (:data:`DEMO`)."""
  return {name: {
      **({"compressor": "demo"} if name != "demo" else {}), "kwargs": kwargs,
      "config": {"optimizer": "sgd", "grad_clip_norm": 0.0},
      "paper": f"DeMo (Peng et al., arXiv:2411.19870) Alg. 1: each worker's momentum (β 0.999), the top "
               f"{kwargs.get('k', 32)} DCT coefficients of each 64x64 chunk on the wire, what was sent subtracted, "
               "the sign of the mean; it is the optimizer (plain SGD after it applies the recipe's schedule, no "
               "clipping after it)" + ("" if name == "demo" else "; k tighter than the authors' 32")}
      for name, kwargs in DEMO.items()}


def _labelled(name: str, run: str, row: dict) -> dict:
  """The labelled row ``name``: its paper-settings row with the one change of diagnosis ``run``."""
  owner, label = run.split("/")
  change = DIAGNOSES[owner][label]
  return {"compressor": zoo.compressor_of(owner, {owner: row}), "kwargs": {**row["kwargs"], **change.get("kwargs", {})},
          "config": {**row.get("config", {}), **change.get("config", {})}, "diagnosis": run,
          **({"timing": row["timing"]} if "timing" in row else {}),  # e.g. DGC's warm-up ended for the link timing
          "paper": f"labelled row: `{owner}` with {label.replace('lr=', 'peak LR ')} (the best of its diagnosis runs, "
                   "seed 0; see the cause below), not its paper's setting"}


SETTINGS: dict[str, dict] = _settings()


def compressor_of(name: str) -> str:
  return zoo.compressor_of(name, SETTINGS)


def registered() -> list[str]:
  return zoo.registered(SETTINGS)


def overrides(name: str, seed: int) -> dict:
  return zoo.overrides(name, seed, SETTINGS)


# ZeRO-3 (``configs/zoo_gpt.py:zero3``): the recipe with the parameters sharded over the workers
# (config.shard_params), under runs/zoo_gpt_zero3/, each run ``<row>/seed<S>``: row -> (the zoo row
# it starts from, what it changes). Float32 both ways; ZeRO++'s qwZ + qgZ (Wang et al.,
# arXiv:2306.10209, §3.1 and §3.3: the weights' all-gather in int8 blocks, the gradients'
# reduce-scatter in int4 blocks); the zoo's TernGrad, 3LC and int8 gradient rows with qwZ's weights.
QWZ = {"param_gather": "blockint", "param_gather_kwargs": {"bits": 8}}
QGZ = {"compressor": "blockint", "compressor_kwargs": {"bits": 4}}
ZERO3 = {"none": ("none", {}),
         "qwz_qgz": ("none", {**QGZ, **QWZ}),
         # qgZ's int4 with a scale per 64 values (0.5 bits a value more than per 2,560)
         "qwz_qgz.block=64": ("none", {**QGZ, "compressor_kwargs": {"bits": 4, "block": 64}, **QWZ}),
         **{f"{name}_qwz": (name, QWZ) for name in ("terngrad", "threelc", "int8")}}

# qgZ's int4 keeps jaxcomp's error feedback (the zoo's replicated blockint row, as the paper, has none).
# And, seed 0 only, where qwZ + qgZ's gap to float comes from: each half alone, qgZ's int4 with blocks
# of 256 values (a scale per 256: 0.125 bits a value) instead of 2,560, and qgZ without error feedback.
ZERO3_PARTS = {"qgz": ("none", QGZ), "qwz": ("none", QWZ),
               "qwz_qgz.block=256": ("none", {**QGZ, "compressor_kwargs": {"bits": 4, "block": 256}, **QWZ}),
               "qwz_qgz.no_ef": ("none", {**QGZ, "compressor_kwargs": {"bits": 4, "error_feedback": False}, **QWZ})}


def _zero3_sweep() -> list[tuple[str, dict]]:
  """:data:`ZERO3`'s rows, seed by seed (every row's seed 0 first), then :data:`ZERO3_PARTS`."""
  rows = [(row, seed, spec) for seed in SEEDS for row, spec in ZERO3.items()]
  rows += [(row, SEEDS[0], spec) for row, spec in ZERO3_PARTS.items()]
  return [(f"{row}/seed{seed}", {**overrides(zoo_row, seed), **change}) for row, seed, (zoo_row, change) in rows]


def get_sweep(arg: str | None = None) -> list[tuple[str, dict]]:
  """Registered rows x seeds, each run named ``<row>/seed<S>``."""
  args = common.parse_arg(arg, allowed=ARGS)
  if "zero3" in args:
    return _zero3_sweep()
  if "diloco" in args:
    return _diloco_sweep()
  if "diagnose" in args:
    return _diagnoses()
  names = [n for n in registered() if "runlocal" not in args or n in RUNLOCAL_NAMES]
  return zoo.seeded(names, SEEDS[:1] if "runlocal" in args else SEEDS, SETTINGS)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, allowed=ARGS)
  c = gpt_text.get_config("runlocal")
  c.experiment = "zoo_gpt"
  c.model_kwargs = ml_collections.ConfigDict(MODEL)
  c.seq_len = MODEL["context"]
  c.workers = WORKERS
  c.num_train_steps = STEPS
  c.eval_windows = 1024
  c.eval_every = 0
  c.log_every = 100
  if "diloco" in args:
    c.experiment = "zoo_gpt_diloco"
    c.log_every = 1  # every step: an outer step's norms are their own row (jaxcomp.diloco's metrics)
  if "diagnose" in args:
    c.experiment = "zoo_gpt_diagnosis"
    c.log_norms = True
    c.log_every = 1
  if "zero3" in args:
    c.experiment = "zoo_gpt_zero3"
    c.shard_params = True
  if "runlocal" in args:
    c.num_train_steps = RUNLOCAL_STEPS
    c.log_every = 2
    c.eval_windows = 64
  return c
