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
instead of its 1,000 at a larger batch, so that the whole table (about 25 rows x 3 seeds, one
process per run) fits in about an hour and a half of a 2-core CPU machine: measured here, the
small model trains at about 27 steps/s, the larger at about 1.6. The bits per byte rank the
methods after a short run; they are not converged values.

One rule for every row: every tensor goes through the compressor (no last-layer or bias
exception), except where a compressor's paper keeps small tensors in float (``min_size``, QSGD),
with the compressor's settings from the vision zoo (``configs/zoo.py:SETTINGS``: its paper's),
and AdamW after the exchange for every row (so the vision zoo's per-row optimizers, chosen for
momentum SGD on LeNet, do not apply), except 1-bit Adam, which is the optimizer itself: Adam's
own ε = 1e-8 and the recipe's β2, plain SGD after it applying the recipe's schedule, and no
gradient clipping after it (clipping would act on Adam's update, not on the gradient).

Run::

  python -m experiments.zoo --config configs/zoo_gpt.py      # this table's steps only
  python -m experiments.sweep --config configs/zoo_gpt.py --root runs --checkpoint_every 0

Arguments (``configs/zoo_gpt.py:ARG``): ``runlocal``: a smoke test, labelled as such:
:data:`RUNLOCAL_NAMES`, :data:`RUNLOCAL_STEPS` steps, one seed.
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
ARGS = ("runlocal",)
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


def _row(name: str) -> dict:
  """The vision zoo's row for ``name``, with this zoo's optimizer rule (module docstring)."""
  row = zoo.SETTINGS[name]
  config = {k: v for k, v in row.get("config", {}).items() if k == "min_size"}
  out = {k: v for k, v in row.items() if k != "finding"}  # the findings are LeNet's
  return {**out, "config": config, "paper": METHODS.get(name, row["paper"])}


def _settings() -> dict[str, dict]:
  rows = {name: _row(name) for name, row in zoo.SETTINGS.items()
          if "compressor" not in row and name not in ("diloco", "dgc", "onebit_adam")}
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
  return rows


SETTINGS: dict[str, dict] = _settings()


def compressor_of(name: str) -> str:
  return zoo.compressor_of(name, SETTINGS)


def registered() -> list[str]:
  return zoo.registered(SETTINGS)


def overrides(name: str, seed: int) -> dict:
  return zoo.overrides(name, seed, SETTINGS)


def get_sweep(arg: str | None = None) -> list[tuple[str, dict]]:
  """Registered rows x seeds, each run named ``<row>/seed<S>``."""
  args = common.parse_arg(arg, allowed=ARGS)
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
  if "runlocal" in args:
    c.num_train_steps = RUNLOCAL_STEPS
    c.log_every = 2
    c.eval_windows = 64
  return c
