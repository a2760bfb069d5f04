"""jaxcomp.data through tensorflow-datasets.

* The Debian Fashion-MNIST tfds builder, prepared for real (70,000 images, no
  network) once per session into a temporary data dir, with 4 shards per split
  so that the file-based reader's file shuffling and resumption are exercised
  on real data.
* The tfds datasets that are absent here (mnist, fashion_mnist, cifar10,
  imagenet2012): the fail-fast error, and their code paths under
  ``tfds.testing.mock_data`` (MOCKED random examples, only to test the code).
* The ImageNet file-based path end to end on a SYNTHETIC stand-in: a tiny
  tfds-prepared directory of random JPEGs written by a test-only builder with
  tfds' real imagenet2012 features. It tests code paths only; it is not data.
"""

import pathlib
import time
from unittest import mock

import numpy as np
import pytest

from jaxcomp import data
from jaxcomp.data import augment as augment_lib
from jaxcomp.data import offline
from jaxcomp.data import pipeline as pipeline_lib
from jaxcomp.data import tfds_sources

tfds = tfds_sources.import_tfds()
tf = tfds_sources.import_tf()
tfds.disable_progress_bar()

TFDS_MISSING = ["mnist", "fashion_mnist", "cifar10", "imagenet2012"]


def _take(pipe, n):
  return [next(pipe) for _ in range(n)]


def _assert_same_batches(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      assert np.array_equal(x[k], y[k]), k


# ------------------------------------------------ Fashion-MNIST (Debian) tfds


@pytest.fixture(scope="session")
def fashion_dir(tmp_path_factory):
  """A real tfds preparation of the Debian files (about 15 s), shared by the session."""
  if not offline.fashion_mnist_debian_available():
    pytest.skip(f"Debian package dataset-fashion-mnist not installed "
                f"({offline.fashion_mnist_dir()} absent); CI installs it with apt-get")
  d = str(tmp_path_factory.mktemp("tfds_fashion"))
  start = time.perf_counter()
  builder = tfds_sources.prepare_fashion_mnist_debian(d, num_shards=4)
  elapsed = time.perf_counter() - start
  assert builder.is_prepared()
  assert elapsed < 90, f"preparing fashion_mnist_debian took {elapsed:.0f} s"
  return d


def test_fashion_builder_prepares_all_70000_images_like_the_idx_reader(fashion_dir):
  builder = tfds_sources.fashion_mnist_debian_builder(fashion_dir)
  assert builder.name == "fashion_mnist_debian" and builder.is_prepared()
  splits = builder.info.splits
  assert splits["train"].num_examples == 60000 and splits["test"].num_examples == 10000
  assert len(splits["train"].filepaths) == 4
  for split in ("train", "test"):
    x_tfds, y_tfds = tfds_sources.load_fashion_mnist_debian_tfds(split, fashion_dir)
    x_idx, y_idx = data.load_arrays("fashion_mnist_debian", split)
    assert x_tfds.dtype == x_idx.dtype == np.uint8 and y_tfds.dtype == y_idx.dtype == np.int32
    assert np.array_equal(x_tfds, x_idx) and np.array_equal(y_tfds, y_idx), split


def test_fashion_builder_uses_its_own_checksums():
  """tfds' registered fashion_mnist checksums would reject the Debian files."""
  ours = tfds_sources.fashion_mnist_debian_builder("/nonexistent").url_infos
  registered = pathlib.Path(tfds.__file__).parent / "url_checksums" / "fashion_mnist.txt"
  theirs = tfds.core.download.checksums.load_url_infos(registered)
  assert ours.keys() == theirs.keys()  # the same URLs, found by file name in manual_dir
  recorded = offline.read_checksums()
  for url, info in ours.items():
    assert (int(info.size), info.checksum) == recorded[info.filename]
    assert info.checksum != theirs[url].checksum


def test_file_reader_epochs_resume_and_shards_on_real_data(fashion_dir, monkeypatch):
  """Training streams from the 4 TFRecord files of the 10,000-image split (cheaper than train)."""
  monkeypatch.setattr(pipeline_lib, "SHUFFLE_BLOCK", 700)  # blocks straddle the 2,500-record files
  x, y = data.load_arrays("fashion_mnist_debian", "test")

  def pipe(**kw):
    args = dict(global_batch_size=200, seed=3, augment=None, train=True, reader="files",
                data_dir=fashion_dir, with_index=True)
    args.update(kw)
    return data.make_pipeline("fashion_mnist_debian", "test", **args)

  p = pipe()
  assert p.reader == "files" and p.steps_per_epoch == 50
  ref = _take(p, 103)
  first = ref[0]
  assert np.array_equal(first["image"], x[first["index"]].astype(np.float32) * np.float32(1 / 255))
  assert np.array_equal(first["label"], y[first["index"]])
  epochs = [np.concatenate([b["index"] for b in ref[e * 50:(e + 1) * 50]]) for e in range(2)]
  for e in epochs:
    assert np.array_equal(np.sort(e), np.arange(10000))
  assert not np.array_equal(epochs[0], epochs[1])  # file order and blocks reshuffled per epoch
  # Resumption: exact, including mid-block, across the epoch boundary, with augmentation.
  for k in (1, 4, 49, 51, 101):
    _assert_same_batches(_take(pipe(start_step=k), 2), ref[k:k + 2])
  aug_ref = _take(pipe(augment="cifarnet"), 9)
  _assert_same_batches(_take(pipe(augment="cifarnet", start_step=7), 2), aug_ref[7:9])
  # Two processes read disjoint files: 0 and 2, 1 and 3.
  for i, mine in enumerate([{0, 2}, {1, 3}]):
    q = pipe(process_index=i, process_count=2)
    local = np.concatenate([b["index"] for b in _take(q, 50)])  # one local epoch
    assert np.array_equal(np.sort(local), np.sort(np.concatenate(
        [np.arange(f * 2500, (f + 1) * 2500) for f in mine])))


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_file_reader_eval_covers_split_once(fashion_dir, process_count):
  x, y = data.load_arrays("fashion_mnist_debian", "test")
  seen, counts = [], set()
  for p in range(process_count):
    pipe = data.make_pipeline("fashion_mnist_debian", "test", global_batch_size=512, seed=0,
                              augment=None, train=False, reader="files", data_dir=fashion_dir,
                              process_index=p, process_count=process_count, with_index=True)
    batches = list(pipe)
    counts.add(len(batches))
    assert len(batches) == pipe.num_batches
    for b in batches:
      m = b["mask"]
      assert np.array_equal(b["label"][m], y[b["index"][m]])
      assert np.array_equal(b["image"][m], x[b["index"][m]].astype(np.float32) * np.float32(1 / 255))
      seen.append(b["index"][m])
  assert len(counts) == 1
  seen = np.concatenate(seen)
  assert len(seen) == 10000 and np.array_equal(np.sort(seen), np.arange(10000))


# ------------------------------------------------------ absent tfds datasets


@pytest.mark.parametrize("name", TFDS_MISSING)
def test_missing_tfds_dataset_fails_fast_with_instructions(name, tmp_path):
  augment = "imagenet" if name == "imagenet2012" else None
  start = time.perf_counter()
  with pytest.raises(data.DatasetNotAvailableError) as err:
    data.make_pipeline(name, "train", global_batch_size=8, seed=0, augment=augment, train=True,
                       data_dir=str(tmp_path))
  assert time.perf_counter() - start < 10  # no download attempt, no network wait
  msg = str(err.value)
  assert str(tmp_path) in msg and "mnist5k" in msg and "fashion_mnist_debian" in msg
  assert "never downloads" in msg and "substitutes" in msg
  if name == "imagenet2012":
    assert "ILSVRC2012_img_train.tar" in msg and "tfds build imagenet2012" in msg
  else:
    assert f"tfds build {name}" in msg
    with pytest.raises(data.DatasetNotAvailableError):
      data.load_arrays(name, "test", data_dir=str(tmp_path))
  assert not list(tmp_path.rglob("*.tfrecord*"))  # nothing was prepared


def test_tfds_data_dir_env_is_honoured(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "from_env"))
  assert tfds_sources.resolve_data_dir() == str(tmp_path / "from_env")
  assert tfds_sources.resolve_data_dir("/explicit") == "/explicit"
  with pytest.raises(data.DatasetNotAvailableError, match="from_env"):
    data.load_arrays("cifar10", "train")


# ------------------------------------------------- tfds code paths, MOCKED data


@pytest.fixture
def mocked_tfds():
  """tfds.testing.mock_data: RANDOM examples in place of a prepared dataset.

  ``is_prepared`` is patched too, since jaxcomp refuses unprepared datasets.
  """
  with tfds.testing.mock_data(num_examples=40), \
       mock.patch.object(tfds.core.DatasetBuilder, "is_prepared", return_value=True):
    yield


@pytest.mark.parametrize("name, augment, kw", [
    ("mnist", None, {}),
    ("fashion_mnist", "cifar_resnet", {"image_size": 32, "channels": 3}),
    ("cifar10", "cifarnet", {}),
    ("cifar10", "cifar_resnet", {}),
])
def test_tfds_in_memory_path_with_mock_data(mocked_tfds, tmp_path, name, augment, kw):
  spec = data.get_spec(name)
  x, y = data.load_arrays(name, "train", data_dir=str(tmp_path))
  assert x.shape == (40, *spec.image_shape) and x.dtype == np.uint8 and y.dtype == np.int32
  args = dict(global_batch_size=16, seed=0, augment=augment, data_dir=str(tmp_path), **kw)
  train = _take(data.make_pipeline(name, "train", train=True, **args), 4)
  shape = data.output_image_shape(name, augment, kw.get("image_size"), kw.get("channels"))
  assert train[0]["image"].shape == (16, *shape)
  _assert_same_batches(
      _take(data.make_pipeline(name, "train", train=True, start_step=3, **args), 1), train[3:])
  ev = list(data.make_pipeline(name, "test", train=False, **args))
  assert len(ev) == 3 and sum(b["mask"].sum() for b in ev) == 40


@pytest.mark.parametrize("augment", augment_lib.IMAGENET_PRESETS)
def test_imagenet_preprocessing_on_mocked_tfds_examples(mocked_tfds, tmp_path, augment):
  """tfds imagenet2012 records (JPEG bytes, mocked) through both ImageNet presets."""
  builder = tfds_sources.tfds_builder("imagenet2012", "imagenet2012", str(tmp_path))
  ds = builder.as_dataset(split="validation", decoders={"image": tfds.decode.SkipDecoding()})
  cfg = augment_lib.resolve(data.get_spec("imagenet2012"), augment, image_size=64)
  for train in (True, False):
    fn = augment_lib.make_preprocess_fn(cfg, train)
    out = [fn(ex["image"], tf.constant([1, i], tf.int64)).numpy()
           for i, ex in enumerate(ds.take(3))]
    assert all(o.shape == (64, 64, 3) and np.isfinite(o).all() for o in out)
    again = fn(next(iter(ds))["image"], tf.constant([1, 0], tf.int64)).numpy()
    assert np.array_equal(again, out[0])  # same seed, same output


# -------------------------------------- ImageNet file path, SYNTHETIC stand-in


@pytest.fixture(scope="module")
def synthetic_imagenet_dir(tmp_path_factory):
  """A tfds-prepared 'imagenet2012' of 3x41 train / 2x25 validation random JPEGs.

  SYNTHETIC, for testing the file-based reader only: written by a test-only
  subclass of tfds' real imagenet2012 builder (same features, so the real
  builder opens it), never registered, never used as data.
  """
  from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as inb  # pylint: disable=g-import-not-at-top

  class SyntheticImagenetForTests(inb.Builder, skip_registration=True):
    name = "imagenet2012"

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples(0, 123), "validation": self._generate_examples(1, 50)}

    def _generate_examples(self, seed, n):  # pylint: disable=arguments-renamed
      rng = np.random.default_rng(seed)
      for i in range(n):
        h, w = rng.integers(40, 90, size=2)
        yield i, {"image": rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
                  "label": int(rng.integers(0, 1000)), "file_name": f"synthetic_{seed}_{i}.JPEG"}

  d = str(tmp_path_factory.mktemp("tfds_synthetic_imagenet"))
  SyntheticImagenetForTests(data_dir=d).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False, num_shards=3))
  return d


def test_imagenet_file_pipeline_resume_and_eval(synthetic_imagenet_dir, monkeypatch):
  monkeypatch.setattr(pipeline_lib, "SHUFFLE_BLOCK", 16)
  d = synthetic_imagenet_dir
  assert len(tfds.builder("imagenet2012", data_dir=d).info.splits["train"].filepaths) == 3

  def train_pipe(augment, **kw):
    return data.make_pipeline("imagenet2012", "train", global_batch_size=8, seed=5,
                              augment=augment, train=True, data_dir=d, image_size=32,
                              with_index=True, **kw)

  for augment in augment_lib.IMAGENET_PRESETS:
    p = train_pipe(augment)
    assert p.reader == "files" and p.num_examples == 123
    ref = _take(p, 20)  # 123 / 8 = 15.4 steps per epoch: crosses into epoch 2
    assert ref[0]["image"].shape == (8, 32, 32, 3) and ref[0]["image"].dtype == np.float32
    epoch = np.concatenate([b["index"] for b in ref])[:123]
    assert np.array_equal(np.sort(epoch), np.arange(123))
    for k in (3, 15, 17):
      _assert_same_batches(_take(train_pipe(augment, start_step=k), 2), ref[k:k + 2])
  # Evaluation over 2 processes (files 0, 2 and 1): exact cover of the 50 images.
  seen, counts = [], set()
  for p in range(2):
    ev = data.make_pipeline("imagenet2012", "test", global_batch_size=8, seed=0,
                            augment="imagenet", train=False, data_dir=d, image_size=32,
                            process_index=p, process_count=2, with_index=True)
    batches = list(ev)
    counts.add(len(batches))
    seen += [b["index"][b["mask"]] for b in batches]
  assert len(counts) == 1
  seen = np.concatenate(seen)
  assert len(seen) == 50 and np.array_equal(np.sort(seen), np.arange(50))
  with pytest.raises(ValueError, match="fewer than process_count=4"):
    data.make_pipeline("imagenet2012", "train", global_batch_size=8, seed=0, augment="imagenet",
                       train=True, data_dir=d, process_index=0, process_count=4)
