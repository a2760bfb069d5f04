r"""TG-T2 and TG-F4: AlexNet-BN on ImageNet, TernGrad vs floating, N = 2/4/8 (TernGrad Table 2, Fig. 4).

Paper (Wen et al., NeurIPS 2017, arXiv:1705.07878, §4.2, Table 2): AlexNet with batch normalization on
the convolutional layers, momentum SGD (0.9), batch 128 per worker, weight
decay 5e-4, the same epochs for every N (the base LR grows with the batch):

  ===  =====  =====  ==========  ===========================  ============================
  N    batch  LR     iterations  top-1: floating (DR 0.5)     TernGrad (DR 0.2) [noclip]
  ===  =====  =====  ==========  ===========================  ============================
  2    256    0.01   370K        57.33% (top-5 80.56%)        57.61% (80.47%) [54.63% (78.16%)]
  4    512    0.02   185K        57.32% (80.73%)              57.28% (80.23%)
  8    1024   0.04   92.5K       56.62% (80.28%)              57.54% (80.25%)
  ===  =====  =====  ==========  ===========================  ============================

TernGrad keeps the last (``logits``) layer in float (§4.2) and uses a smaller
dropout ratio (DR) than floating (0.2 vs 0.5). "TernGrad-noclip" is TernGrad
without gradient clipping. Fig. 4 (TG-F4) plots the N = 4 runs (batch 512):
(a) top-1 validation accuracy and (b) training loss against iteration, and (c)
the sparsity of the ternary gradients of fc6: "on average 71.32% gradients of
a fully-connected layer (fc6) are ternarized to zeros". Every run here records
that sparsity (``compressor_kwargs.tensor_metrics``: the ``zeros:fc6/kernel``
and ``elements:fc6/kernel`` columns of ``metrics.csv``).

Where the paper is silent ("AlexNet is trained by the hyper-parameters and data
augmentation depicted in Caffe"), we follow the authors' script
(wenwei202/terngrad ``run_multi_gpus_alexnet.sh``, ``inception_train.py``):
the LR drops tenfold every 20 epochs (staircase; Caffe's ``stepsize`` 100K at
batch 256); tensors with at most 9,216 elements stay in float
(``SIZE_TO_BINARIZE=9217``: biases and batch-norm parameters); weight decay on
the conv and fc weights only (TF-slim's regularizers); Caffe-style
augmentation (``imagenet_simple``: shorter side 256, random 224 crop, flip;
central crop at test). The EMA of the parameters (0.9999) is evaluated (§4).

ImageNet is not available offline here. The default config needs a prepared
tfds ``imagenet2012`` in ``$TFDS_DATA_DIR`` and otherwise fails at once with
the data module's actionable error. ``runlocal`` runs 3 steps on an offline
STAND-IN (Fashion-MNIST resized to 64x64x3, the smallest input AlexNet's pools
allow), only to show that the config runs end to end.

Run::

  # the paper's grid (7 runs; needs ImageNet):
  python -m experiments.sweep --config configs/terngrad_alexnet.py --root runs
  # TG-F4 only (the N = 4 pair):
  python -m experiments.sweep --config configs/terngrad_alexnet.py --root runs --only workers=4
  # one run:
  python -m experiments.train --config configs/terngrad_alexnet.py --workdir /tmp/tg_t2
  # the offline smoke run (stand-in data, 3 steps):
  python -m experiments.train --config configs/terngrad_alexnet.py:runlocal --workdir /tmp/tg_t2_local

Arguments (``configs/terngrad_alexnet.py:ARG``, comma-separated):
  ``runlocal``: the offline stand-in smoke run (see above).
  ``dataset=NAME``: any ``jaxcomp.data`` dataset (with ``runlocal``: the stand-in).
  ``floating``: the floating baseline's settings (compressor none, DR 0.5).
  ``noclip``: TernGrad without gradient clipping (TernGrad-noclip).
  ``workers=N``: 2, 4 or 8, with that row's batch, LR and iterations (default 2).
"""

from __future__ import annotations

import ml_collections

from configs import common

WORKERS = (2, 4, 8)
PER_WORKER_BATCH = 128
BASE_LR = {2: 0.01, 4: 0.02, 8: 0.04}
ITERATIONS = {2: 370_000, 4: 185_000, 8: 92_500}
DROPOUT = {"none": 0.5, "terngrad": 0.2, "terngrad_noclip": 0.2}
EPOCHS_PER_DECAY = 20  # the authors' NUM_EPOCHS_PER_DECAY
IMAGENET_TRAIN = 1_281_167
FIG4_WORKERS = 4
STAND_IN_SIZE = 64

PAPER = {
    "source": "TernGrad §4.2, Table 2 (AlexNet-BN, ImageNet, momentum 0.9, 128 per worker)",
    "top1": {2: {"none": 57.33, "terngrad": 57.61, "terngrad_noclip": 54.63},
             4: {"none": 57.32, "terngrad": 57.28},
             8: {"none": 56.62, "terngrad": 57.54}},
    "top5": {2: {"none": 80.56, "terngrad": 80.47, "terngrad_noclip": 78.16},
             4: {"none": 80.73, "terngrad": 80.23},
             8: {"none": 80.28, "terngrad": 80.25}},
    "fig4_source": "TernGrad §4.2, Figure 4 (N = 4, batch 512)",
    "fig4_fc6_zero_percent": 71.32,
}

ARGS = ("runlocal", "dataset", "floating", "noclip", "workers")


def variants(n: int) -> tuple[str, ...]:
  """The gradient variants Table 2 runs for ``n`` workers."""
  return ("none", "terngrad", "terngrad_noclip") if n == 2 else ("none", "terngrad")


def get_sweep(arg: str | None = None) -> list[tuple]:
  """TG-T2's grid: N x variants (7 runs); the N = 4 pair is TG-F4."""
  arg = arg or ""
  runs = []
  for n in WORKERS:
    row = {"workers": n, "batch_size": PER_WORKER_BATCH * n, "learning_rate": BASE_LR[n],
           "num_train_steps": ITERATIONS[n], "lr_decay_steps": decay_steps(n)}
    for v in variants(n):
      overrides = dict(row, compressor="none" if v == "none" else "terngrad",
                       **{"model_kwargs.dropout_rate": DROPOUT[v]})
      if v == "terngrad_noclip":  # clip_sigma=None cannot be a flag: a config argument
        runs.append((f"N{n}/{v}", overrides, ",".join(filter(None, [arg, "noclip"]))))
      else:
        runs.append((f"N{n}/{v}", overrides))
  return runs


def decay_steps(n: int) -> int:
  """Steps of ``EPOCHS_PER_DECAY`` ImageNet epochs at batch ``128·n``."""
  return round(EPOCHS_PER_DECAY * IMAGENET_TRAIN / (PER_WORKER_BATCH * n))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, ARGS)
  n = common.workers_arg(args, WORKERS, "Table 2")
  variant = "none" if "floating" in args else "terngrad_noclip" if "noclip" in args else "terngrad"
  c = common.imagenet_config("TG-T2", "alexnet", "imagenet_simple", args.get("dataset", "imagenet2012"),
                             DROPOUT[variant])
  c.workers = n
  c.batch_size = PER_WORKER_BATCH * n
  c.num_train_steps = ITERATIONS[n]
  c.learning_rate = BASE_LR[n]
  c.lr_schedule = "staircase"
  c.lr_decay_rate = 0.1
  c.lr_decay_steps = decay_steps(n)
  c.weight_decay = 5e-4
  if variant == "none":
    c.compressor = "none"
  if variant == "terngrad_noclip":
    c.compressor_kwargs.clip_sigma = None
  c.compressor_kwargs.tensor_metrics = "^fc6/kernel$"  # Fig. 4(c)
  c.min_size = 9217  # the authors' SIZE_TO_BINARIZE: biases and BN stay in float
  c.eval_every = 5_000
  if "runlocal" in args:
    common.set_imagenet_stand_in(c, args.get("dataset", common.offline_dataset()), STAND_IN_SIZE)
  return c
