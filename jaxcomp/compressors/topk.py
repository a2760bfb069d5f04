"""Top-k sparsification with a sampled threshold (3LC §4.2, "5% sparsification").

Per tensor, on every worker, after the shared error feedback has added the
residual (``x = g + r``):

1. the threshold: sample ``s`` values of ``x``, order only them (a radix
   selection, :func:`jaxcomp.compressors._select.kth_largest`) and take the
   ``ceil(fraction·s)``-th largest magnitude ``t`` ("To avoid exhaustive
   sorting while finding a threshold, we only sort sampled input values",
   3LC §4.2, after Aji & Heafield 2017);
2. select every entry with ``|x| ≥ t`` (magnitude, not relative magnitude:
   "We use the magnitude, not relative magnitude, of values to find largest
   changes");
3. the wire, at a fixed capacity of ``K`` values:

   * ``wire="bitmap"`` (3LC's prototype, "a bitmap to indicate which state
     changes sparsification has selected, which adds 1 bit per state
     change"): the bitmap packed eight per byte (``uint8[ceil(n/8)]``, entry
     ``i`` in bit ``i % 8`` of byte ``i // 8``, LSB first) and the selected
     values as ``float32[K]`` in index order;
   * ``wire="index"``: ``uint32[K]`` flat indices and ``float32[K]`` values;

4. error feedback (the shared mechanism of :func:`jaxcomp.compress`): what was
   not sent stays in the residual ("accumulates unsent changes in buffers for
   later transmission").

Decisions (tested in ``tests/test_column_compressors.py``):

* ``k = ceil(fraction·n)`` (at least one value of a non-empty tensor).
* The sample: ``sample`` values drawn uniformly **with replacement** (an
  independent draw per worker, tensor and step). With ``sample=None`` or
  ``sample >= n`` the threshold is exact: the ``k``-th largest magnitude of the
  whole tensor.
* Zeros are never selected (they carry nothing), so an all-zero tensor sends
  nothing and decodes to zeros.
* Capacity ``K``: ``capacity`` (a fraction of ``n`` or a count), default
  ``k``, so the wire is exactly the promised fraction. A sampled threshold
  lets through ``k`` entries only on average. When more are selected than
  ``K``, the sent ones are ``K`` consecutive selected entries (in index
  order, wrapping around) from a start rank drawn uniformly from the encode
  key (:func:`jaxcomp.compressors._select.compact_words`), so every selected
  entry is sent with the same probability ``K / selected`` and no position
  has a standing advantage (taking the first ``K`` in index order would
  always favour the low indices). The rest stay in the residual; their
  number is the metric ``overflow``.
* Empty slots hold index 0 and value 0.0 (they add nothing when decoded), so
  no count travels; in the bitmap wire the bitmap marks exactly the sent
  entries.
* A traced ``fraction`` (``optax.inject_hyperparams``, a schedule) needs a
  static ``capacity``: the payload keeps its size, ``k`` is computed in
  float32 at every step, and ``encoded_bytes`` counts the filled slots
  (:meth:`TopK.encoded_bytes`); ``bytes_on_wire`` does not change.

References:
  Lim, Andersen, Kaminsky. *3LC: Lightweight and Effective Traffic
  Compression for Distributed Machine Learning*. MLSys 2019 (arXiv:1802.07389), §4.2.
  Aji, Heafield. *Sparse Communication for Distributed Gradient Descent*.
  EMNLP 2017.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.compressors import _select

Wire = Literal["bitmap", "index"]


class BitmapPayload(NamedTuple):
  bitmap: jax.Array  # uint8[ceil(n/8)]: 1 = sent; entry i is bit i % 8 (LSB first) of byte i // 8
  values: jax.Array  # float32[K]: the sent values in index order, 0 in unused slots


class IndexPayload(NamedTuple):
  indices: jax.Array  # uint32[K]: flat indices of the sent values, 0 in unused slots
  values: jax.Array  # float32[K]: the sent values, 0 in unused slots


def _keep_rows_below(words: jax.Array, end: jax.Array) -> jax.Array:
  """``words`` (:func:`_select.pack_rows`'s layout, one column) with the bits of rows ``>= end`` cleared."""
  keep = jnp.clip(end - 32 * jnp.arange(words.shape[0], dtype=jnp.int32), 0, 32).astype(jnp.uint32)
  # (1 << keep) - 1 for keep < 32; a shift by 32 is undefined, so the full word separately.
  low = jnp.where(keep >= 32, jnp.uint32(0xFFFFFFFF), (jnp.uint32(1) << jnp.minimum(keep, 31)) - 1)
  return words & low


def _sent_words(words: jax.Array, s: _select.Slots) -> jax.Array:
  """The packed mask of one column (``words``) reduced to the entries ``s`` sends.

  The sent entries are a cyclic window of the selected ones in row order, so
  the unsent ones lie in one row range: below the first and above the last
  filled slot's row (an unwrapped window), or strictly between the rows of
  slots ``wrap − 1`` and ``wrap`` (a wrapped one). Two masks over the
  ``n / 32`` words, no pass over the ``n`` entries.
  """
  rows, a, count = s.rows[:, 0], s.wrap[0], s.count[0]
  first, last = rows[0], rows[jnp.maximum(count - 1, 0)]
  inside = _keep_rows_below(words, last + 1) & ~_keep_rows_below(words, first)
  gap_lo, gap_hi = rows[jnp.maximum(a - 1, 0)] + 1, rows[a]  # the unsent rows: [gap_lo, gap_hi)
  outside = words & ~(_keep_rows_below(words, gap_hi) & ~_keep_rows_below(words, gap_lo))
  return jnp.where(count == 0, jnp.zeros_like(words), jnp.where(a > 0, outside, inside))


def _bitmap_bytes(words: jax.Array, n: int) -> jax.Array:
  """The bitmap wire, ``uint8[ceil(n/8)]``: entry ``i`` is bit ``i % 8`` (LSB first) of byte ``i // 8``.

  That is the packed words' little-endian bytes (``np.packbits(sent,
  bitorder="little")``): the words :func:`_select.pack_rows` made for the
  compaction are the bitmap, with no second pass over the ``n`` entries.
  (Bitcasts between bytes and words are little-endian, as in
  :func:`jaxcomp.codecs._common.row_masks`.)
  """
  return lax.bitcast_convert_type(words, jnp.uint8).reshape(-1)[:-(-n // 8)]


def _bitmap_words(bitmap: jax.Array, n: int) -> jax.Array:
  """Inverse of :func:`_bitmap_bytes`: the uint32 words ``(ceil(n/32),)``."""
  nwords = -(-n // 32)
  return lax.bitcast_convert_type(jnp.pad(bitmap, (0, 4 * nwords - bitmap.shape[0])).reshape(nwords, 4), jnp.uint32)


@dataclasses.dataclass(frozen=True)
class TopK(core.Compressor):
  """Top-k sparsification's per-tensor compressor (see the module docstring).

  Attributes:
    fraction: the proportion of entries to send.
    wire: ``"bitmap"`` or ``"index"``.
    sample: values sampled to find the threshold (``None``: exact).
    capacity: slots on the wire, a fraction of ``n`` or a count (``None``:
      ``ceil(fraction·n)``).
    rng: uniform generator for the sample.
  """

  fraction: float = 0.05
  wire: Wire = "bitmap"
  sample: Optional[int] = 4096
  capacity: Optional[_select.Capacity] = None
  rng: rng.RngImpl = "hash"

  error_feedback = True
  metric_keys = ("overflow",)

  def __post_init__(self):
    _select.check_selection(self.fraction, self.capacity)
    if self.wire not in ("bitmap", "index"):
      raise ValueError(f"wire must be 'bitmap' or 'index'; got {self.wire!r}.")
    _select.check_sample(self.sample)
    rng.check_impl(self.rng)


  def k(self, n: int) -> Any:
    """``ceil(fraction·n)``, at most ``n``: an int, or int32 for a traced ``fraction``."""
    return _select.scheduled_count(self.fraction, n)

  def slots(self, n: int) -> int:
    return _select.selection_slots(self.fraction, self.capacity, n)

  def validate(self, shape, dtype):
    if self.wire == "index" and core.size_of(shape) > 2**32:
      raise ValueError(f"wire='index' sends uint32 indices; a tensor of {core.size_of(shape)} elements is too large.")

  def threshold(self, flat: jax.Array, key: jax.Array) -> jax.Array:
    """The magnitude threshold ``t`` (see the module docstring)."""
    n = flat.shape[0]
    mag = jnp.abs(flat)[:, None]
    pool = _select.sample_rows(mag, key, self.sample, self.rng) if _select.uses_sample(self.sample, n) else mag
    t = self.k(pool.shape[0])
    kmax = pool.shape[0] if hyperparams.is_traced(t) else t  # a traced rank: any rank of the pool
    return _select.kth_largest(pool, jnp.ones(pool.shape, bool), jnp.full((1,), t, jnp.int32), kmax)[0]

  def encode_with_metrics(self, x, key, agreed):
    del agreed
    flat = x.reshape(-1)
    mask = jnp.logical_and(jnp.abs(flat) >= self.threshold(flat, key), flat != 0)
    # Over capacity, a window of `slots` consecutive selected entries from a
    # random start rank (compact_words folds its own stream into the key, so
    # the draw is independent of the sample's; no cumulative sum or scatter
    # over all n entries).
    words = _select.pack_rows(mask[:, None])
    s = _select.compact_words(words, self.slots(flat.shape[0]), key=key)
    values = s.values(flat[:, None])[:, 0].astype(jnp.float32)
    if self.wire == "bitmap":
      payload = BitmapPayload(bitmap=_bitmap_bytes(_sent_words(words[:, 0], s), flat.shape[0]), values=values)
    else:
      payload = IndexPayload(indices=s.rows[:, 0].astype(jnp.uint32), values=values)
    return payload, {"overflow": s.overflow}

  def encode(self, x, key, agreed):
    return self.encode_with_metrics(x, key, agreed)[0]

  def decode(self, payload, shape):
    n = core.size_of(shape)
    if self.wire == "bitmap":
      # The k-th set bit of the bitmap holds values[k]: find the set bits'
      # indices (no cumulative sum over n) and scatter the K values there.
      s = _select.compact_words(_bitmap_words(payload.bitmap, n)[:, None], payload.values.shape[0])
      vals = jnp.where(s.used[:, 0], payload.values, 0.0)
      return jnp.zeros((n,), jnp.float32).at[s.rows[:, 0]].add(vals).reshape(shape)
    idx = payload.indices.astype(jnp.int32)
    return jnp.zeros((n,), jnp.float32).at[idx].add(payload.values).reshape(shape)

  def encoded_bytes(self, payload, shape):
    """With a traced ``fraction``, the bytes of the filled slots only (a fixed capacity holds a variable count).

    The payload keeps the capacity's size (``bytes_on_wire``); a wire with a
    variable count would send the bitmap (or nothing) and 4 bytes of value
    (and 4 of index) per selected entry: the slots with a nonzero value, as
    zeros are never selected. With a Python ``fraction`` the payload is its
    own encoding (``None``).
    """
    if not hyperparams.is_traced(self.fraction):
      return None
    filled = jnp.sum(payload.values != 0, dtype=jnp.int32)
    if self.wire == "bitmap":
      return payload.bitmap.shape[0] + 4 * filled
    return 8 * filled

  def aggregate(self, gathered, shape):
    if self.wire == "bitmap":
      return super().aggregate(gathered, shape)
    # Index wire: one scatter-add of every worker's values, then divide.
    n = core.size_of(shape)
    workers = gathered.values.shape[0]
    idx = gathered.indices.astype(jnp.int32).reshape(-1)
    total = jnp.zeros((n,), jnp.float32).at[idx].add(gathered.values.reshape(-1))
    return (total / workers).reshape(shape)


@hyperparams.factory(sample="the size of the sample (a shape)", capacity="the number of value slots on the wire")
def topk(
    fraction: float = 0.05,
    wire: Wire = "bitmap",
    *,
    sample: Optional[int] = 4096,
    capacity: Optional[_select.Capacity] = None,
    rng: rng.RngImpl = "hash",
    **kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """Top-k sparsification with a sampled threshold (3LC §4.2) as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.topk(0.05, axis_name="workers"), optax.sgd(0.1, momentum=0.9))

  Args:
    fraction: proportion of each tensor's entries to send (3LC: 5%).
    wire: ``"bitmap"`` (1 bit per entry + float32 values, 3LC's prototype) or
      ``"index"`` (uint32 indices + float32 values).
    sample: number of values sampled to estimate the threshold; ``None`` finds
      the exact ``k``-th largest magnitude.
    capacity: values on the wire per tensor, a fraction of its size or a
      count; ``None``: ``ceil(fraction·n)``. Selected entries beyond it stay
      in the residual and are counted in the metric ``overflow``. Needed
      (static) when ``fraction`` is injected or on a schedule
      (``optax.inject_hyperparams``): the payload keeps the capacity's size,
      the fraction sets how many entries are selected, and ``encoded_bytes``
      counts the filled slots (:meth:`TopK.encoded_bytes`).
    rng: uniform generator for the sample, ``"hash"`` or ``"threefry"``.
    **kwargs: passed to :func:`jaxcomp.compress`: ``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback`` (on by default:
      unsent changes accumulate, 3LC §4.2).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(
      TopK(fraction=fraction, wire=wire, sample=sample, capacity=capacity, rng=rng), **kwargs
  )
