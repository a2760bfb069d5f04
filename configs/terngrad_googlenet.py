r"""TG-T3: GoogLeNet (no auxiliary heads) on ImageNet, TernGrad vs floating, N = 2/4/8 (TernGrad Table 3).

Paper (Wen et al., NeurIPS 2017, arXiv:1705.07878, §4.2, Table 3): GoogLeNet with batch normalization
and without auxiliary classifiers, momentum SGD (0.9), polynomial LR decay
(power 0.5, to 0; §4), Inception data augmentation [41]; TernGrad with a
smaller dropout ratio (DR) and weight decay than floating:

  ===  ===========  =====  ==========  ======================  ========================
  N    total batch  LR     iterations  floating (wd, DR)       TernGrad (wd, DR)
  ===  ===========  =====  ==========  ======================  ========================
  2    128          0.04   600K        88.30% (4e-5, 0.2)      86.77% (1e-5, 0.08)
  4    256          0.08   300K        87.82% (4e-5, 0.2)      85.96% (1e-5, 0.08)
  8    512          0.10   300K        89.00% (4e-5, 0.2)      86.47% (2e-5, 0.08)
  ===  ===========  =====  ==========  ======================  ========================

(top-5 validation accuracy, central crops). "On average, the accuracy loss is
less than 2%."

Where the paper is silent we follow the authors' GoogLeNet script
(wenwei202/terngrad ``run_multi_gpus_googlenet.sh``): every tensor ternarized
(``SIZE_TO_BINARIZE=1``, batch-norm parameters included) except the logits
layer (``quantize_logits`` off; §4.2 item 3); clipping c = 2.5 (§3.3); weight
decay on the conv and fc weights only (TF-slim's regularizers). The EMA of the
parameters (0.9999) is evaluated (§4).

ImageNet is not available offline here. The default config needs a prepared
tfds ``imagenet2012`` in ``$TFDS_DATA_DIR`` and otherwise fails at once with
the data module's actionable error. ``runlocal`` runs 3 steps on an offline
STAND-IN (Fashion-MNIST resized to 32x32x3), only to show that the config runs
end to end.

Run::

  python -m experiments.sweep --config configs/terngrad_googlenet.py --root runs   # 6 runs, ImageNet
  python -m experiments.train --config configs/terngrad_googlenet.py --workdir /tmp/tg_t3
  python -m experiments.train --config configs/terngrad_googlenet.py:runlocal --workdir /tmp/tg_t3_local

Arguments (``configs/terngrad_googlenet.py:ARG``, comma-separated):
  ``runlocal``: the offline stand-in smoke run.
  ``dataset=NAME``: any ``jaxcomp.data`` dataset (with ``runlocal``: the stand-in).
  ``floating``: the floating baseline's settings (compressor none, wd 4e-5, DR 0.2).
  ``workers=N``: 2, 4 or 8, with that row's batch, LR, iterations and wd (default 2).
"""

from __future__ import annotations

import ml_collections

from configs import common

WORKERS = (2, 4, 8)
TOTAL_BATCH = {2: 128, 4: 256, 8: 512}
BASE_LR = {2: 0.04, 4: 0.08, 8: 0.10}
ITERATIONS = {2: 600_000, 4: 300_000, 8: 300_000}
WEIGHT_DECAY = {"none": {2: 4e-5, 4: 4e-5, 8: 4e-5}, "terngrad": {2: 1e-5, 4: 1e-5, 8: 2e-5}}
DROPOUT = {"none": 0.2, "terngrad": 0.08}
STAND_IN_SIZE = 32  # 5 stride-2 stages: 32 -> 1; small enough for a CPU smoke run

PAPER = {
    "source": "TernGrad §4.2, Table 3 (GoogLeNet without aux heads, ImageNet)",
    "top5": {2: {"none": 88.30, "terngrad": 86.77},
             4: {"none": 87.82, "terngrad": 85.96},
             8: {"none": 89.00, "terngrad": 86.47}},
}

ARGS = ("runlocal", "dataset", "floating", "workers")


def get_sweep(arg: str | None = None) -> list[tuple[str, dict]]:
  """TG-T3's grid: N in {2, 4, 8} x {floating, TernGrad} with Table 3's settings."""
  del arg
  runs = []
  for n in WORKERS:
    for comp in ("none", "terngrad"):
      runs.append((f"N{n}/{comp}", {
          "workers": n, "batch_size": TOTAL_BATCH[n], "learning_rate": BASE_LR[n],
          "num_train_steps": ITERATIONS[n], "compressor": comp,
          "weight_decay": WEIGHT_DECAY[comp][n], "model_kwargs.dropout_rate": DROPOUT[comp]}))
  return runs


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, ARGS)
  n = common.workers_arg(args, WORKERS, "Table 3")
  comp = "none" if "floating" in args else "terngrad"
  c = common.imagenet_config("TG-T3", "googlenet", "imagenet", args.get("dataset", "imagenet2012"),
                             DROPOUT[comp])
  c.workers = n
  c.batch_size = TOTAL_BATCH[n]
  c.num_train_steps = ITERATIONS[n]
  c.learning_rate = BASE_LR[n]
  c.lr_schedule = "polynomial"
  c.lr_power = 0.5
  c.weight_decay = WEIGHT_DECAY[comp][n]
  c.compressor = comp
  c.skip_batch_norm = False  # the authors ternarize batch-norm parameters too
  c.eval_every = 10_000
  if "runlocal" in args:
    common.set_imagenet_stand_in(c, args.get("dataset", common.offline_dataset()), STAND_IN_SIZE)
  return c
