"""Deterministic, resumable, process-sharded tf.data input pipelines.

:func:`make_pipeline` is what the trainer calls. It returns a :class:`Pipeline`,
an iterator of numpy batches ``{"image": float32 [b, H, W, C], "label": int32
[b]}`` (plus ``"mask"`` for eval and, on request, ``"index"``), where ``b`` is
the per-process batch ``global_batch_size // process_count``.

Determinism and resumption
--------------------------
A training stream is a pure function of ``(dataset, split, seed, step)``:

* In-memory datasets (all but ImageNet) form one global stream of example
  positions ``g = 0, 1, 2, ...``; position ``g`` lies in epoch ``e = g // N``
  and holds example ``perm_e[g % N]``, where ``perm_e`` is a stateless shuffle
  of ``range(N)`` seeded by ``(seed, e)``: a fresh shuffle every epoch, and
  batches run on across epoch boundaries (nothing is dropped; a batch that
  straddles a boundary may hold an example twice, as with
  ``shuffle().repeat().batch()``). Global batch
  ``s`` is positions ``[s*B, (s+1)*B)``; process ``p`` of ``P`` takes the
  ``p``-th contiguous slice of ``B/P`` of them. The global batch is therefore
  the same whatever the number of processes, and the processes' slices are
  disjoint and together form the global batch.
* Augmentation randomness is drawn by stateless ops seeded by ``(seed, g)``,
  so an example is augmented differently in each epoch but identically
  whenever position ``g`` is recomputed.
* ``start_step=k`` starts the stream at position ``k*B``: only the epoch's
  permutation is computed and indices are sliced, so nothing before step ``k``
  is loaded or augmented. The batches equal, bit for bit, those the stream
  started at step 0 yields from its ``k``-th batch on (within one TensorFlow
  version: stateless random ops are only guaranteed stable per version; the
  project pins TF in ``requirements.lock``).
* ImageNet (file-based; see :func:`_file_examples`) shards the TFRecord files
  over processes (process ``p`` reads files ``p, p+P, ...``). Each process
  streams its files in an order permuted per epoch by ``(seed, p, e)``,
  shuffles examples within aligned blocks of :data:`SHUFFLE_BLOCK` consecutive
  records by ``(seed, p, e, block)``, and augments with ``(seed, p,
  position)``. tfds writes examples hash-shuffled across files, so each file
  is already a random sample of the split. Resuming skips whole files
  without opening them; within the file that holds the resume point it reads
  (but neither parses nor decodes) the records before it, i.e. at most one
  file's worth (about 1,250 ImageNet images). Here the stream depends on
  ``process_count`` (changing it changes the data order). tf.data iterator
  checkpointing is not needed: ``start_step`` is the whole state.

Evaluation streams go once through the split in order, pad the last global
batch with copies of an example (the split's first, or for the file reader the
process's first) and return a boolean ``"mask"`` (False on
padding), so summing ``mask``-weighted correct predictions over all batches
and processes gives exact accuracy over the whole split. Every process gets
the same number of eval batches (:attr:`Pipeline.num_batches`).
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from jaxcomp.data import augment as augment_lib
from jaxcomp.data import registry
from jaxcomp.data import tfds_sources

SHUFFLE_BLOCK = 1024
"""Records shuffled together in the file-based (ImageNet) stream."""

READERS = ("auto", "memory", "files")

_SHUFFLE_TAG = 0x5348_5546  # "SHUF"
_AUGMENT_TAG = 0x4155_474D  # "AUGM"
_BLOCK_TAG = 0x424C_4F43  # "BLOC"
_MAX_EPOCHS = 2**40


class Pipeline(Iterator[dict[str, np.ndarray]]):
  """An iterator of numpy batches, with the facts a trainer needs.

  Attributes:
    name: dataset name.
    split: ``"train"`` or ``"test"``.
    train: whether this is a (shuffled, augmented, endless) training stream.
    augment: the augmentation preset.
    global_batch_size: examples per step over all processes.
    local_batch_size: examples per step in this process.
    process_index: this process.
    process_count: number of processes.
    start_step: the first step this iterator yields.
    num_examples: examples in the split.
    steps_per_epoch: ``num_examples / global_batch_size`` (a float).
    num_batches: eval only: batches per pass, identical on every process
      (None for training streams, which are endless).
    image_shape: ``(H, W, C)`` of every image in a batch.
    reader: ``"memory"`` or ``"files"``.
    dataset: the underlying ``tf.data.Dataset`` (TF tensors).
  """

  def __init__(self, dataset: Any, **facts: Any):
    self.dataset = dataset
    self.__dict__.update(facts)
    self._it = None

  def __iter__(self) -> "Pipeline":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._it is None:
      self._it = self.dataset.as_numpy_iterator()
    return next(self._it)

  def reset(self) -> "Pipeline":
    """Restarts at ``start_step`` (e.g. before each evaluation pass); returns self."""
    self._it = None
    return self

  def __repr__(self) -> str:
    return (f"Pipeline({self.name!r}, {self.split!r}, train={self.train}, "
            f"augment={self.augment!r}, global_batch_size={self.global_batch_size}, "
            f"process {self.process_index}/{self.process_count}, "
            f"start_step={self.start_step}, image_shape={self.image_shape}, "
            f"reader={self.reader!r})")


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
  value = int(value)
  if value < low or (high is not None and value >= high):
    bound = f"in [{low}, {high})" if high is not None else f">= {low}"
    raise ValueError(f"{name} must be {bound}, got {value}")
  return value


def make_pipeline(
    name: str,
    split: str,
    *,
    global_batch_size: int,
    seed: int,
    augment: str | None,
    train: bool,
    start_step: int = 0,
    process_index: int = 0,
    process_count: int = 1,
    data_dir: str | None = None,
    image_size: int | None = None,
    channels: int | None = None,
    reader: str = "auto",
    with_index: bool = False,
) -> Pipeline:
  """Builds the input pipeline of one process.

  Args:
    name: a :data:`~jaxcomp.data.registry.DATASETS` name.
    split: ``"train"`` or ``"test"``.
    global_batch_size: examples per step summed over processes; must be
      divisible by ``process_count``.
    seed: the run's data seed, ``0 <= seed < 2**63``.
    augment: preset (see :mod:`jaxcomp.data.augment`): None, ``"cifarnet"``,
      ``"cifar_resnet"``, ``"imagenet"``, ``"imagenet_simple"``.
    train: True: endless, reshuffled every epoch, train-time augmentation.
      False: one ordered pass with the preset's eval transform, padded, with
      a ``"mask"``.
    start_step: first step to yield (training only); resumption is exact.
    process_index: this process, ``0 <= process_index < process_count``
      (``jax.process_index()``).
    process_count: number of processes (``jax.process_count()``).
    data_dir: TFDS data directory (default ``$TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``); for ``reader="files"`` on
      ``fashion_mnist_debian`` the tfds copy is prepared there if needed.
    image_size: see :func:`jaxcomp.data.augment.resolve` (e.g. 32 zero-pads
      28x28 images; for ImageNet the output crop size).
    channels: None, or 3 to repeat a grey channel.
    reader: ``"memory"`` (load the split with ``load_arrays`` and feed it with
      ``from_tensor_slices``-style gathers), ``"files"`` (stream prepared
      TFRecord files), or ``"auto"`` (memory unless the dataset is too big).
    with_index: add ``"index"`` (int64 [b]): the example's index in the split
      (in-memory order, or tfds' file order for ``reader="files"``).

  Returns:
    A :class:`Pipeline`.

  Raises:
    ValueError, TypeError: bad arguments (the message says which).
    DatasetNotAvailableError: the data is not on this machine.
  """
  spec = registry.get_spec(name)
  if split not in registry.SPLITS:
    raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
  if not isinstance(train, bool):
    raise TypeError(f"train must be a bool, got {train!r}")
  global_batch_size = _check_int("global_batch_size", global_batch_size, 1)
  process_count = _check_int("process_count", process_count, 1)
  process_index = _check_int("process_index", process_index, 0, process_count)
  seed = _check_int("seed", seed, 0, 2**63)
  start_step = _check_int("start_step", start_step, 0)
  if global_batch_size % process_count:
    raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                     f"process_count={process_count}; every process needs the same "
                     "per-process batch")
  if not train and start_step:
    raise ValueError("start_step applies to training streams only; an eval "
                     f"pipeline always makes one full pass (got start_step={start_step})")
  if reader not in READERS:
    raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
  if reader == "auto":
    reader = "memory" if spec.in_memory else "files"
  if reader == "memory" and not spec.in_memory:
    raise ValueError(f"{name!r} does not fit in memory; use reader='files' (or 'auto')")
  if reader == "files" and spec.tfds_name is None and name != "fashion_mnist_debian":
    raise ValueError(f"{name!r} has no tfds copy; use reader='memory' (or 'auto')")
  cfg = augment_lib.resolve(spec, augment, image_size, channels)

  local_batch = global_batch_size // process_count
  if reader == "memory":
    images, labels = registry.load_arrays(name, split, data_dir)  # fails fast if absent
    tf = tfds_sources.import_tf()
    num_examples = len(labels)
    examples, num_batches = _memory_examples(
        tf, images, labels, cfg, train=train, seed=seed, start_step=start_step,
        global_batch=global_batch_size, process_index=process_index,
        process_count=process_count)
  else:
    if name == "fashion_mnist_debian":
      builder = tfds_sources.prepare_fashion_mnist_debian(data_dir)
    else:
      builder = tfds_sources.tfds_builder(name, spec.tfds_name, data_dir)
    tf = tfds_sources.import_tf()
    examples, num_batches, num_examples = _file_examples(
        tf, builder, spec.tfds_splits[split], cfg, train=train, seed=seed,
        start_step=start_step, local_batch=local_batch, process_index=process_index,
        process_count=process_count)

  if not with_index:
    examples = examples.map(lambda ex: {k: v for k, v in ex.items() if k != "index"})
  ds = examples.batch(local_batch, drop_remainder=True)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.deterministic = True
  ds = ds.with_options(options)
  return Pipeline(
      ds, name=name, split=split, train=train, augment=augment,
      global_batch_size=global_batch_size, local_batch_size=local_batch,
      process_index=process_index, process_count=process_count, start_step=start_step,
      num_examples=num_examples, steps_per_epoch=num_examples / global_batch_size,
      num_batches=None if train else num_batches, image_shape=cfg.output_shape,
      reader=reader)


def _seed_pair(tf, seed: int, tag: int):
  return tf.constant([seed, tag], dtype=tf.int64)


def _memory_examples(tf, images: np.ndarray, labels: np.ndarray, cfg, *, train: bool,
                     seed: int, start_step: int, global_batch: int, process_index: int,
                     process_count: int):
  """The per-example stream of this process for an in-memory split."""
  n = len(labels)
  if n == 0:
    raise ValueError("empty split")
  b = global_batch // process_count
  lo, hi = process_index * b, (process_index + 1) * b
  images_t = tf.constant(images)
  labels_t = tf.constant(labels.astype(np.int32))
  preprocess = augment_lib.make_preprocess_fn(cfg, train)
  augment_key = _seed_pair(tf, seed, _AUGMENT_TAG)

  if train:
    shuffle_key = _seed_pair(tf, seed, _SHUFFLE_TAG)
    e0, o0 = divmod(start_step * global_batch, n)

    def epoch_positions(e):
      perm = tf.random.experimental.stateless_shuffle(
          tf.range(n, dtype=tf.int64),
          seed=tf.random.experimental.stateless_fold_in(shuffle_key, e))
      start = tf.where(tf.equal(e, e0), tf.constant(o0, tf.int64), tf.constant(0, tf.int64))
      return tf.data.Dataset.from_tensor_slices(
          (perm[start:], e * n + tf.range(start, n, dtype=tf.int64)))

    stream = tf.data.Dataset.range(e0, _MAX_EPOCHS).flat_map(epoch_positions)
    num_batches = None
  else:
    num_batches = math.ceil(n / global_batch)
    positions = tf.data.Dataset.range(num_batches * global_batch)
    stream = positions.map(lambda g: (tf.where(g < n, g, tf.constant(0, tf.int64)), g))

  # Global batches of (index, position); keep this process's slice.
  stream = stream.batch(global_batch, drop_remainder=True)
  stream = stream.map(lambda i, g: (i[lo:hi], g[lo:hi])).unbatch()

  def load(index, position):
    image = tf.gather(images_t, index)
    seed_i = tf.random.experimental.stateless_fold_in(augment_key, position)
    ex = {"image": preprocess(image, seed_i), "label": tf.gather(labels_t, index),
          "index": index}
    if not train:
      ex["mask"] = position < n
    return ex

  return stream.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True), num_batches


def _file_examples(tf, builder, tfds_split: str, cfg, *, train: bool, seed: int,
                   start_step: int, local_batch: int, process_index: int,
                   process_count: int):
  """The per-example stream of this process read from tfds' TFRecord files.

  Returns ``(dataset, num_eval_batches or None, num_examples_in_split)``.
  """
  tfds = tfds_sources.import_tfds()
  fmt = str(getattr(builder.info, "file_format", "tfrecord")).lower()
  if "tfrecord" not in fmt:
    raise NotImplementedError(f"{builder.name} is stored as {fmt}; the file reader "
                              "supports tfds' default TFRecord format only")
  info = builder.info.splits[tfds_split]
  paths = [str(p) for p in info.filepaths]
  lengths = [int(x) for x in info.shard_lengths]
  if len(paths) != len(lengths):
    raise ValueError(f"{builder.name}/{tfds_split}: {len(paths)} files but "
                     f"{len(lengths)} shard lengths")
  if len(paths) < process_count:
    raise ValueError(f"{builder.name}/{tfds_split} has {len(paths)} files, fewer than "
                     f"process_count={process_count}; use reader='memory' or fewer processes")
  offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
  mine = list(range(process_index, len(paths), process_count))
  my_paths = tf.constant([paths[i] for i in mine])
  my_lengths = tf.constant([lengths[i] for i in mine], tf.int64)
  my_offsets = tf.constant([offsets[i] for i in mine], tf.int64)
  n_local = int(sum(lengths[i] for i in mine))
  features = builder.info.features
  decoders = {"image": tfds.decode.SkipDecoding()}
  preprocess = augment_lib.make_preprocess_fn(cfg, train)
  augment_key = tf.random.experimental.stateless_fold_in(
      _seed_pair(tf, seed, _AUGMENT_TAG), process_index)

  def read(files, lengths_, offsets_, skip_first):
    """Records (serialized, split index) of files in order, skipping in the first."""
    skips = tf.concat([[skip_first], tf.zeros_like(lengths_[1:])], 0)

    def one_file(path, length, offset, skip):
      records = tf.data.TFRecordDataset(path, buffer_size=8 << 20).skip(skip)
      return tf.data.Dataset.zip(records, tf.data.Dataset.range(offset + skip, offset + length))

    return tf.data.Dataset.from_tensor_slices((files, lengths_, offsets_, skips)).flat_map(
        one_file)

  if train:
    shuffle_key = tf.random.experimental.stateless_fold_in(
        _seed_pair(tf, seed, _SHUFFLE_TAG), process_index)
    block_key = tf.random.experimental.stateless_fold_in(
        _seed_pair(tf, seed, _BLOCK_TAG), process_index)
    q0 = start_step * local_batch
    e0, o0 = divmod(q0, n_local)
    read0, r0 = (o0 // SHUFFLE_BLOCK) * SHUFFLE_BLOCK, o0 % SHUFFLE_BLOCK

    def epoch(e):
      order = tf.random.experimental.stateless_shuffle(
          tf.range(len(mine), dtype=tf.int64),
          seed=tf.random.experimental.stateless_fold_in(shuffle_key, e))
      files, lens, offs = (tf.gather(x, order) for x in (my_paths, my_lengths, my_offsets))
      start = tf.where(tf.equal(e, e0), tf.constant(read0, tf.int64), tf.constant(0, tf.int64))
      ends = tf.cumsum(lens)
      first = tf.reduce_sum(tf.cast(ends <= start, tf.int64))
      skip_first = start - (ends[first] - lens[first])
      records = read(files[first:], lens[first:], offs[first:], skip_first)
      positions = tf.data.Dataset.range(start, n_local)
      blocks = tf.data.Dataset.zip(records, positions).batch(SHUFFLE_BLOCK)

      def shuffle_block(rec_idx, pos):
        serialized, index = rec_idx
        block_seed = tf.random.experimental.stateless_fold_in(
            tf.random.experimental.stateless_fold_in(block_key, e), pos[0] // SHUFFLE_BLOCK)
        perm = tf.random.experimental.stateless_shuffle(
            tf.range(tf.shape(pos)[0], dtype=tf.int64), seed=block_seed)
        return tf.data.Dataset.from_tensor_slices(
            (tf.gather(serialized, perm), tf.gather(index, perm), e * n_local + pos))

      skip = tf.where(tf.equal(e, e0), tf.constant(r0, tf.int64), tf.constant(0, tf.int64))
      return blocks.flat_map(shuffle_block).skip(skip)

    stream = tf.data.Dataset.range(e0, _MAX_EPOCHS).flat_map(epoch)
    num_batches = None
  else:
    counts = [sum(lengths[i::process_count]) for i in range(process_count)]
    num_batches = max(math.ceil(c / local_batch) for c in counts)
    total = num_batches * local_batch
    records = read(my_paths, my_lengths, my_offsets, tf.constant(0, tf.int64))
    padding = records.take(1).repeat(total - n_local)
    stream = tf.data.Dataset.zip(records.concatenate(padding),
                                 tf.data.Dataset.range(total))
    stream = stream.map(lambda rec, pos: (rec[0], rec[1], pos))

  def load(serialized, index, position):
    ex = features.deserialize_example(serialized, decoders=decoders)
    seed_i = tf.random.experimental.stateless_fold_in(augment_key, position)
    out = {"image": preprocess(ex["image"], seed_i),
           "label": tf.cast(ex["label"], tf.int32), "index": index}
    if not train:
      out["mask"] = position < n_local
    return out

  stream = stream.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return stream, num_batches, int(sum(lengths))


def output_image_shape(name: str, augment: str | None, image_size: int | None = None,
                       channels: int | None = None) -> tuple[int, int, int]:
  """The ``(H, W, C)`` of pipeline images, without building a pipeline (for model init)."""
  return augment_lib.resolve(registry.get_spec(name), augment, image_size,
                             channels).output_shape


__all__ = ["Pipeline", "make_pipeline", "output_image_shape", "SHUFFLE_BLOCK", "READERS"]
