r"""zoo: every registered compressor on the same run (LeNet, 8 workers, 3 seeds).

One table of all compressors (``docs/zoo.md``, by ``python -m experiments.zoo``):
each entry of :func:`jaxcomp.names` at run time (compressors and optimizer
wrappers such as ``local_steps``) trains TG-F3's LeNet (``configs/terngrad_lenet.py``:
real Fashion-MNIST offline, total batch 64 over 8 simulated workers, momentum
SGD 0.9 with base LR 0.01, polynomial decay with power 0.5, weight decay 5e-4,
the parameter EMA that TernGrad evaluates) for the same :data:`STEPS` steps with
seeds :data:`SEEDS`, with its paper's settings (:data:`SETTINGS`).

REDUCED SCALE: :data:`STEPS` steps, not TG-F3's 10,000, so that the whole zoo
(about 20 compressors x 3 seeds, one process per run) takes about an hour on a
2-core CPU machine. Each run's process start-up (imports, loading the data,
compiling) costs about as much as its 200 steps, so fewer steps would save
little and cost accuracy (LeNet is at about 80% on Fashion-MNIST after 200
steps). The accuracies rank the compressors after a short run; they are not
converged accuracies.

One rule for every row: each LeNet tensor goes through the compressor (TG-F3
compresses all of LeNet's layers; no last-layer or bias exception), except
where a compressor's paper keeps small tensors in float (``min_size``: QSGD
§5, "We will not quantize ... layers with fewer than 10K parameters"). The
optimizer after the exchange is TG-F3's, except where a row's paper sets its
own (sign-based updates; DGC, whose momentum correction replaces the optimizer's
momentum; 1-bit Adam, which is the optimizer; random-k with memory, Stich et al.'s
plain SGD; Dryden et al.'s threshold and adaptive quantization, AdaGrad with LR
0.005): see each row's ``config``. Rows whose first settings did not learn carry
the measured cause (``"finding"``, from :data:`DIAGNOSES`), and a labelled row
(:data:`TUNING`) where the cause is the method's setting rather than ours.

Run::

  python -m experiments.zoo                      # every step; reruns only what is missing
  python -m experiments.sweep --config configs/zoo.py --root runs --checkpoint_every 0
  python -m experiments.train --config configs/zoo.py --workdir /tmp/zoo_qsgd \
      --config.compressor=qsgd --config.compressor_kwargs='{"bits_per_value": 4, "bucket_size": 512}' \
      --config.min_size=10000 --config.seed=0

Arguments (``configs/zoo.py:ARG``, comma-separated ``key=value``):
  ``runlocal``: a smoke test, labelled as such: :data:`RUNLOCAL_NAMES` on the
    5,000 MNIST digits, :data:`RUNLOCAL_STEPS` steps, one seed.
  ``dataset=NAME``: any ``jaxcomp.data`` dataset.
"""

from __future__ import annotations

import ml_collections

from configs import common
from configs import terngrad_lenet

STEPS = 200
SEEDS = (0, 1, 2)
WORKERS = 8
RUNLOCAL_STEPS = 4
RUNLOCAL_NAMES = ("none", "terngrad")
ARGS = ("runlocal", "dataset", "tune", "diagnose")

# Where the throughput and link timings are taken (experiments.zoo).
THROUGHPUT_SIZE = "4M"
LINK_CONFIG = "lenet"  # benchmarks.train_step_link's
LINK_PROCESSES = 2
LINK_RATE = "100mbit"
LINK_TIMED_STEPS = 10
LINK_STATISTIC = "median"  # of the timed steps

# The learning rate of plain-SGD sign updates (signsgd, signum): every weight
# moves by +-LR per step, whatever the gradient's scale, so TG-F3's 0.01 (with
# momentum 0.9, an effective 0.1) is far too large for LeNet. signSGD's papers
# tune the learning rate per task; this value won a check of 1e-3 against 1e-4
# (plain SGD, signsgd, seed 0, 200 steps: 80.5% against 72.1% test accuracy).
SIGN_LR = 1e-3


# Dryden et al. (MLHPC 2016) §4 train with AdaGrad, LR 0.005 (configs/dryden_mlp.py): the
# threshold and adaptive rows' optimizer. TG-F3's, for the diagnoses that compare against it:
DRYDEN_OPTIMIZER = {"optimizer": "adagrad", "learning_rate": 0.005}
TG_F3_OPTIMIZER = {"optimizer": "momentum", "learning_rate": 0.01}

# The labelled threshold row's τ: the smallest of TUNING's values within 5 points of the best
# (seed 0); experiments.zoo's report checks that the committed sweep still picks it.
THRESHOLD_TUNED_TAU = 0.03

# The committed sweeps behind the labelled rows (``configs/zoo.py:tune``): row -> (the keyword
# argument swept, its values), seed 0, each run ``<row>/<key>=<value>``.
TUNING = {"threshold.tuned": ("tau", (0.001, 0.003, 0.01, 0.03, 0.1, 0.3))}

# Runs that log every step's norms (config.log_norms) to show why a row did not learn with the
# settings it first had (``configs/zoo.py:diagnose``): row -> {label: config overrides on top of
# the row's}, seed 0, each run ``<row>/<label>``.
DIAGNOSES = {
    "none": {"momentum": {}, "adagrad": DRYDEN_OPTIMIZER},
    "randomk": {"momentum": TG_F3_OPTIMIZER, "sgd": {}},
    "adaptive": {"momentum": TG_F3_OPTIMIZER, "adagrad": {}},
    "threshold": {"momentum": TG_F3_OPTIMIZER, "adagrad": {}},
}


def _steps_fraction(fraction: float) -> int:
  return max(1, round(fraction * STEPS))


# name -> {"kwargs": compressor_kwargs, "config": other config overrides, "paper": where the settings are
# from, "timing": kwargs that replace "kwargs"' for the throughput and link timings}. Those time a
# few calls from the start, so a row whose compression starts late (DGC's warm-up, 1-bit Adam's
# Adam stage) starts it at once there: the timed calls are those of the compressed stage.
# get_sweep takes jaxcomp.names() at run time; tests/test_zoo.py checks that there is a row named
# after every registered compressor, with its paper's settings.
#
# Labelled rows ("<compressor>.<label>", with "compressor": the registered name) follow a paper-settings
# row that does not learn here with the smallest change that makes it learn, chosen by a committed
# sweep (TUNING); "paper" says what changed and why. The paper-settings row stays.
SETTINGS: dict[str, dict] = {
    "none": {"kwargs": {}, "paper": "float32 pmean: the baseline every ratio is taken against"},
    "terngrad": {"kwargs": {"clip_sigma": 2.5},
                 "paper": "TernGrad (Wen et al., NeurIPS 2017, arXiv:1705.07878) §3.3, Eq. 21: clipping at "
                          "2.5σ, scalar sharing"},
    "qsgd": {"kwargs": {"bits_per_value": 4, "bucket_size": 512}, "config": {"min_size": 10_000},
             "paper": "QSGD (Alistarh et al., NeurIPS 2017, arXiv:1610.02132) §5: 4-bit, bucket 512, max-norm; "
                      "tensors under 10K values in float"},
    "threelc": {"kwargs": {"sparsity": 1.0},
                "paper": "3LC (Lim et al., MLSys 2019, arXiv:1802.07389) §3, §4: s = 1.00, zero-run encoding, "
                         "error feedback"},
    "int8": {"kwargs": {}, "paper": "3LC §4.2's 8-bit int baseline (255 levels, error feedback)"},
    "stochastic_ternary": {"kwargs": {}, "paper": "3LC §4.2's \"Stoch 3-value b-3-5\" baseline"},
    "onebit": {"kwargs": {}, "paper": "1-bit SGD (Seide et al., Interspeech 2014) with error feedback, as "
                                      "Dryden et al. (MLHPC 2016) §3.1 describe it"},
    "topk": {"kwargs": {"fraction": 0.05, "wire": "bitmap"},
             "paper": "3LC §4.2's \"5% sparsification\" (sampled threshold, bitmap wire, error feedback)"},
    "powersgd": {"kwargs": {"rank": 2},
                 "paper": "PowerSGD (Vogels et al., NeurIPS 2019, arXiv:1905.13727): rank 2 as in its CIFAR-10 "
                          "comparisons, warm start, error feedback"},
    "threshold": {"kwargs": {"tau": 0.001, "capacity": 1 / 32}, "config": DRYDEN_OPTIMIZER,
                  "paper": "Dryden et al. (MLHPC 2016) §3.2: fixed threshold τ = 0.001, and §4's optimizer, "
                           "AdaGrad with LR 0.005 (configs/dryden_mlp.py)",
                  "finding": ("τ = 0.001 is far below LeNet's accumulated updates here: most values are over τ at every "
                             "step but only the capacity's 1/32 are sent, each as ±τ, so the update stays one to "
                             "two orders of magnitude below float's and the residual grows without bound, with "
                             "momentum or AdaGrad alike. A fact about τ at these settings, not a defect: "
                             "`threshold.tuned` is the row with τ from a sweep.")},
    "threshold.tuned": {"compressor": "threshold", "kwargs": {"tau": THRESHOLD_TUNED_TAU, "capacity": 1 / 32},
                        "config": DRYDEN_OPTIMIZER,
                        "paper": "labelled row: `threshold` with τ chosen by the committed sweep below (the "
                                 "smallest τ within 5 points of the sweep's best); Dryden et al. give no τ for "
                                 "other models (\"requires a carefully-chosen threshold\")"},
    "adaptive": {"kwargs": {"proportion": 1 / 64, "sample": 128, "capacity": 1 / 32}, "config": DRYDEN_OPTIMIZER,
                 "paper": "Dryden et al. (MLHPC 2016) §3.3: proportion π = 1/64, 128 samples, and §4's "
                          "optimizer, AdaGrad with LR 0.005 (configs/dryden_mlp.py)",
                 "finding": ("Run first with TG-F3's momentum 0.9 on top of its error feedback, seed 0 learned, then "
                            "its update grew by more than an order of magnitude while float's shrank, and the run ended at chance. "
                            "Dryden et al. train with AdaGrad (LR 0.005), which the row now uses: the residual "
                            "stays bounded and it learns as float does with that AdaGrad.")},
    "signsgd": {"kwargs": {}, "config": {"optimizer": "sgd", "learning_rate": SIGN_LR},
                "paper": "signSGD with majority vote (Bernstein et al., ICML 2018, arXiv:1802.04434) Alg. 3: "
                         "plain SGD on the voted signs, LR 1e-3 (SIGN_LR)"},
    "ef_signsgd": {"kwargs": {},
                   "paper": "EF-SignSGD (Karimireddy et al., ICML 2019, arXiv:1901.09847) Alg. 1: scaled signs "
                            "with error feedback, SGD's learning rate (TG-F3's)"},
    "local_steps": {"kwargs": {"k": 2}, "paper": "3LC §4.2's \"2 local steps\" (float exchange every 2nd step)"},
    "diloco": {"kwargs": {"inner_steps": 8},
               "paper": "DiLoCo (Douillard et al., arXiv:2311.08105) Alg. 1: H = 8 local steps of the run's "
                        "optimizer, float32 pseudo-gradients, outer SGD with Nesterov momentum 0.9, LR 0.7"},
    # Added after the zoo's first runs; their rows follow their factories' signatures.
    "half": {"kwargs": {"dtype": "bfloat16"}, "paper": "16-bit floats: bfloat16 on the wire"},
    "randomk": {"kwargs": {"fraction": 0.01, "error_feedback": True}, "config": {"optimizer": "sgd"},
                "paper": "random-k with memory (Stich et al., NeurIPS 2018, arXiv:1809.07599) Alg. 1: 1% of the "
                         "values, error feedback, plain SGD with TG-F3's LR",
                "finding": ("Run first with TG-F3's momentum 0.9 on top of the memory (Stich et al.'s Alg. 1 has "
                           "none), seed 0 diverged: a value is sent about once in 100 steps carrying about 100 "
                           "steps of gradient, and momentum repeats each such jump for tens of steps, so the "
                           "update and the residual grow until the loss explodes. With plain SGD, as in the "
                           "paper, the residual levels off and the run learns.")},
    "natural": {"kwargs": {},
                "paper": "natural compression (Horváth et al., arXiv:1905.10988): stochastic rounding to "
                         "powers of two"},
    "signum": {"kwargs": {"beta": 0.9}, "config": {"optimizer": "sgd", "learning_rate": SIGN_LR},
               "paper": "Signum with majority vote (Bernstein et al., ICLR 2019, arXiv:1810.05291) Alg. 1: "
                        "momentum 0.9 inside, plain SGD with LR 1e-3 (SIGN_LR)"},
    "dgc": {"kwargs": {"density": 0.001, "warmup_steps": _steps_fraction(0.05)}, "config": {"optimizer": "sgd"},
            "timing": {"warmup_steps": 0},
            "paper": "Deep Gradient Compression (Lin et al., ICLR 2018, arXiv:1712.01887) §3: 99.9% sparsity "
                     "after its exponential warm-up (4 of ImageNet's 90 epochs: ~5% of the steps); its momentum "
                     "correction (0.9) replaces the optimizer's momentum, so plain SGD with TG-F3's LR"},
    # eps 1e-4, not Adam's 1e-8: after the freeze the 1-bit code gives every coordinate of a tensor
    # the same magnitude (its RMS), so a coordinate whose frozen variance is near 0 moves by about
    # RMS/eps. With 1e-8, LeNet's loss is NaN within 20 steps of the freeze (at freeze_step 30 and
    # 100 alike); with 1e-4 it trains (seed 0: 82.1%).
    "fp4": {"kwargs": {},
            "paper": "4-bit E3M0 floats with a per-tensor scale (Streaming DiLoCo, arXiv:2501.18512, §2.4's "
                     "outer-gradient format), on the gradients, no error feedback"},
    "blockint": {"kwargs": {"bits": 4, "error_feedback": False},
                 "paper": "ZeRO++'s qgZ (Wang et al., arXiv:2306.10209, §3.3): the gradients in 4-bit block-based "
                          "symmetric quantization, one float32 scale per block of 2,560 values, round to nearest, "
                          "no error feedback (the paper describes none)"},
    "demo": {"kwargs": {}, "config": {"optimizer": "sgd", "learning_rate": SIGN_LR},
             "paper": "DeMo (Peng et al., arXiv:2411.19870) Alg. 1 at the authors' defaults: each worker's "
                      "momentum (β 0.999), the top 32 DCT coefficients of each 64x64 chunk on the wire, what was "
                      "sent subtracted, the sign of the mean; it is the optimizer (plain SGD with LR 1e-3, "
                      "SIGN_LR, after it)"},
    "onebit_adam": {"kwargs": {"freeze_step": _steps_fraction(0.15), "eps": 1e-4},
                    "timing": {"freeze_step": 1},
                    "config": {"optimizer": "sgd", "learning_rate": 1e-3},
                    "paper": "1-bit Adam (Tang et al., ICML 2021, arXiv:2102.02888): full Adam for the "
                             "warm-up (~15% of the steps), then 1-bit compressed momentum with frozen variance (eps 1e-4, see above); "
                             "it is the optimizer (plain SGD after it only applies Adam's LR 1e-3)"},
}


def compressor_of(name: str, settings: dict | None = None) -> str:
  """The registered compressor of a row of ``settings`` (default :data:`SETTINGS`): its name, or
  a labelled row's ``"compressor"``."""
  return (SETTINGS if settings is None else settings)[name].get("compressor", name)


def registered(settings: dict | None = None) -> list[str]:
  """The rows the zoo runs: those whose compressor is in :func:`jaxcomp.names` at run time."""
  import jaxcomp  # pylint: disable=g-import-not-at-top
  settings = SETTINGS if settings is None else settings
  return [n for n in settings if compressor_of(n, settings) in jaxcomp.names()]


def overrides(name: str, seed: int, settings: dict | None = None) -> dict:
  """The sweep overrides of one row and seed."""
  settings = SETTINGS if settings is None else settings
  row = settings[name]
  out = {"compressor": compressor_of(name, settings), "seed": seed, **row.get("config", {})}
  if row["kwargs"]:
    out["compressor_kwargs"] = dict(row["kwargs"])
  return out


def seeded(names: list[str], seeds: tuple[int, ...], settings: dict | None = None) -> list[tuple[str, dict]]:
  """Each row x seed as a sweep entry ``(<row>/seed<S>, overrides)``."""
  return [(f"{name}/seed{seed}", overrides(name, seed, settings)) for name in names for seed in seeds]


def get_sweep(arg: str | None = None) -> list[tuple[str, dict]]:
  """Registered rows x seeds, each run named ``<row>/seed<S>``; or the :data:`TUNING` sweeps
  (``tune``) or the :data:`DIAGNOSES` (``diagnose``)."""
  args = common.parse_arg(arg, allowed=ARGS)
  if "tune" in args:
    return [(f"{name}/{key}={v}", _with_kwarg(overrides(name, SEEDS[0]), key, v))
            for name, (key, values) in TUNING.items() if name in registered() for v in values]
  if "diagnose" in args:
    return [(f"{name}/{label}", {**overrides(name, SEEDS[0]), **extra})
            for name, runs in DIAGNOSES.items() if name in registered() for label, extra in runs.items()]
  names = [n for n in registered() if "runlocal" not in args or n in RUNLOCAL_NAMES]
  seeds = SEEDS[:1] if "runlocal" in args else SEEDS
  return seeded(names, seeds)


def _with_kwarg(out: dict, key: str, value) -> dict:
  return {**out, "compressor_kwargs": {**out.get("compressor_kwargs", {}), key: value}}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, allowed=ARGS)
  c = terngrad_lenet.get_config("runlocal")
  c.experiment = "zoo"
  c.dataset = args.get("dataset", "mnist5k" if "runlocal" in args else terngrad_lenet.default_dataset())
  c.workers = WORKERS
  c.num_train_steps = STEPS
  c.compressor = "none"
  c.compressor_kwargs = ml_collections.ConfigDict()
  c.eval_every = 0
  c.log_every = 25
  if "tune" in args:
    c.experiment = "zoo_tuning"
  if "diagnose" in args:
    c.experiment = "zoo_diagnosis"
    c.log_norms = True
    c.log_every = 1
  if "runlocal" in args:
    c.num_train_steps = RUNLOCAL_STEPS
    c.log_every = 2
    c.eval_batch_size = 500
  return c
