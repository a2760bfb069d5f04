"""The CIFAR ResNet set-up shared by the 3LC-T1 and QSGD-T1 configs.

Both papers train ResNet-110 on CIFAR-10 with He et al. (2015)'s recipe: crop
and flip augmentation (§4.2: 4 pixels padded on each side, a random 32x32
crop, a random horizontal flip), momentum 0.9, weight decay 1e-4 (3LC §4.3:
"We reuse the local optimizer type and hyperparameters for ResNet-110 training
from the original ResNet paper"; QSGD §5: "default networks and
hyper-parameters"). This module holds that set-up, the reduced CPU scale
both configs share (``runlocal``), and the helpers their sweeps use, so the
two configs differ only in what their papers specify.

CIFAR-10 is not available offline here: the paper-scale configs need a
prepared tfds ``cifar10`` and otherwise fail at once with the data module's
message. A 28x28 grey dataset (Fashion-MNIST) is zero-padded to 32x32 and its
channel repeated three times, so the same model and augmentation apply.
"""

from __future__ import annotations

from typing import Any, Iterable

import ml_collections

from configs import common
from jaxcomp import models

PAPER_DATASET = "cifar10"
PAPER_DEPTH = 110
# The reduced CPU scale of the committed runs: ResNet-8 (one basic block per stage, the
# smallest depth 6n+2 of He et al.'s family, 75,290 parameters vs ResNet-110's 1,727,962).
REDUCED_DEPTH = 8
ARGS = ("runlocal", "dataset")


def dataset_for(args: dict[str, str]) -> str:
  """``dataset=NAME`` if given; else the offline dataset for ``runlocal``, else CIFAR-10."""
  return args.get("dataset", common.offline_dataset() if "runlocal" in args else PAPER_DATASET)


def base_config(arg: str | None, *, experiment: str, workers: int, per_worker_batch: int,
                steps: int) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """A config at the paper's scale: ResNet-110 (:func:`set_cifar_resnet`), initial LR 0.1.

  Returns the config and the parsed arguments (:data:`ARGS`); the caller sets
  its paper's schedule and compression, then applies ``runlocal``
  (:func:`set_reduced`).
  """
  args = common.parse_arg(arg, ARGS)
  c = common.base_config()
  c.experiment = experiment
  set_cifar_resnet(c, depth=PAPER_DEPTH, dataset=dataset_for(args))
  c.workers = workers
  c.batch_size = workers * per_worker_batch
  c.num_train_steps = steps
  c.learning_rate = 0.1
  return c, args


def set_cifar_resnet(c: ml_collections.ConfigDict, *, depth: int, dataset: str) -> None:
  """He et al. 2015 §4.2's CIFAR ResNet of ``depth`` layers, data and optimizer.

  Sets the model (``resnet110`` etc., or the generic ``resnet`` with
  ``depth``), the dataset with the ``cifar_resnet`` augmentation (a 28x28
  grey stand-in padded to 32x32x3), momentum SGD 0.9 and weight decay 1e-4
  in the loss (so ``wd·w`` is part of the exchanged gradient, as with
  TensorFlow's and CNTK's L2 terms).
  """
  name = f"resnet{depth}"
  if name in models.MODELS:
    c.model = name
  else:
    c.model = "resnet"
    c.model_kwargs = ml_collections.ConfigDict({"depth": depth})
  c.dataset = dataset
  if common.is_grey_28(dataset):
    common.set_grey_stand_in(c, 32)
  c.augment = "cifar_resnet"
  c.optimizer = "momentum"
  c.momentum = 0.9
  c.weight_decay = 1e-4
  c.weight_decay_mode = "loss"


def set_reduced(c: ml_collections.ConfigDict, *, steps: int, evals: int = 4) -> None:
  """The reduced CPU scale: ResNet-8, ``steps`` steps, ``evals`` evaluations, no checkpoints."""
  set_cifar_resnet(c, depth=REDUCED_DEPTH, dataset=c.dataset)
  c.num_train_steps = steps
  c.eval_every = max(1, steps // evals)
  c.log_every = max(1, min(10, steps // 20))


def design(compressor: str, **kwargs: Any) -> dict[str, Any]:
  """The sweep overrides of one design: a compressor and its arguments."""
  return {"compressor": compressor, "compressor_kwargs": dict(kwargs)}


def sweep(arg: str | None, designs: dict[str, tuple[str, dict[str, Any]]]) -> list[tuple[str, dict]]:
  """A ``get_sweep`` grid: one run per design, ``(name, overrides)``, names unique."""
  common.parse_arg(arg, ARGS)
  return unique_names((name, dict(overrides)) for name, (_, overrides) in designs.items())


def unique_names(runs: Iterable[tuple[str, dict]]) -> list[tuple[str, dict]]:
  """``runs`` as a list; raises ``ValueError`` if two share a name (one workdir each)."""
  runs = list(runs)
  names = [n for n, _ in runs]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f"duplicate sweep names {dup}")
  return runs
