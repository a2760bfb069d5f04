"""Helpers shared by the column-wise and sparsifying compressors.

One place for what 1-bit SGD, threshold and adaptive quantization, top-k
sparsification and PowerSGD have in common:

* **column views** (:func:`column_shape`, :func:`as_columns`): how a tensor of
  any rank is read as a matrix ``(rows, cols)``;
* **sampling** (:func:`sample_rows`): a random sample of each column, for the
  sampled estimates of Dryden et al. §3.1/§3.3 and 3LC §4.2;
* **selection** (:func:`kth_largest`): a per-column order statistic with a
  dynamic rank, found with ``lax.top_k`` (small ranks) or radix selection (no sort);
* **fixed-capacity compaction** (:func:`compact_rows`, or
  :func:`compact_words` from a mask already packed by :func:`pack_rows`):
  which selected entries fit into a static number of slots (a window of
  consecutive selected entries starting at a rank drawn uniformly from a key,
  or the first in row order without one), and which row each slot holds;
* **sparse words** (:func:`slot_words`, :func:`read_words`,
  :func:`scatter_columns`): the selected entries as Dryden §3.2's 32-bit words
  (:mod:`jaxcomp.codecs.sparse`: 1 sign bit, 31 index bits) in fixed slots,
  empty slots holding :data:`EMPTY_WORD`; and :func:`rice_bits`, the exact
  size of their delta + Golomb-Rice coding.

The column view
---------------
A tensor of shape ``s`` is viewed as ``(prod(s[:-1]), s[-1])``: its last axis
indexes the columns. For Flax layouts this is the natural choice, because the
last axis is the output feature everywhere:

* a Dense kernel ``(in, out)``: column ``j`` is ``x[:, j]``, the incoming
  weights of output unit ``j``;
* a convolution kernel HWIO ``(H, W, I, O)``: ``(H·W·I, O)``, one column per
  output channel (its whole receptive field);
* a vector (bias, scale) ``(n,)``: **one column** of ``n`` rows;
* a scalar ``()``: one column of one row.

The view is a plain C-order reshape, so flat index ``i`` of the tensor is row
``i // cols``, column ``i % cols`` of the view.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from jaxcomp import hyperparams
from jaxcomp import rng
from jaxcomp.codecs import sparse
from jaxcomp.exchange.layout import materialize

Capacity = Union[int, float]


def column_shape(shape: Sequence[int]) -> tuple[int, int]:
  """``(rows, cols)`` of the column view of a tensor of ``shape``."""
  shape = tuple(int(d) for d in shape)
  if len(shape) == 0:
    return 1, 1
  if len(shape) == 1:
    return shape[0], 1
  return math.prod(shape[:-1]), shape[-1]


def as_columns(x: jax.Array) -> jax.Array:
  """``x`` reshaped to its column view ``(rows, cols)``."""
  return x.reshape(column_shape(x.shape))


def capacity_count(capacity: Capacity, n: int) -> int:
  """Static slots for ``n`` elements: a fraction in ``(0, 1]`` or a count ``>= 1``.

  A float is a fraction of ``n`` rounded up (so any non-empty tensor gets at
  least one slot); an int is a count. Both are capped at ``n``.
  """
  if isinstance(capacity, bool):
    raise TypeError("capacity must be a fraction (float) or a count (int).")
  if isinstance(capacity, float):
    return min(n, math.ceil(capacity * n))
  return min(n, int(capacity))


def check_fraction(value: float, name: str) -> None:
  """Raises unless ``value`` is in ``(0, 1]`` (a traced scalar passes: :func:`jaxcomp.hyperparams.check_number`)."""
  hyperparams.check_number(value, name, lambda v: 0.0 < v <= 1.0, "in (0, 1]")


def check_selection(fraction: Any, capacity: Optional[Capacity], name: str = "fraction") -> None:
  """Raises unless ``fraction`` is in ``(0, 1]`` and ``capacity`` is ``None`` or valid (:func:`check_capacity`).

  A traced ``fraction`` (injected, or on a schedule) needs a static
  ``capacity``: without one the payload holds ``ceil(fraction·n)`` values, a
  shape; with one it keeps the capacity's size and the fraction sets how many
  of its slots are filled.
  """
  check_fraction(fraction, name)
  if hyperparams.is_traced(fraction) and capacity is None:
    raise TypeError(
        f"A traced {name} (optax.inject_hyperparams, or a schedule) needs a static `capacity`: without one "
        f"the payload holds ceil({name}·n) values, a shape. Give capacity= the largest {name} of the "
        f"schedule (the payload keeps that size), or name {name!r} in static_args.")
  if capacity is not None:
    check_capacity(capacity)


def selection_slots(fraction: Any, capacity: Optional[Capacity], n: int) -> int:
  """Static slots of a selection of ``fraction`` of ``n`` values: ``capacity``'s, else ``ceil(fraction·n)``."""
  return scheduled_count(fraction, n) if capacity is None else capacity_count(capacity, n)


def scheduled_count(fraction: Any, n: int) -> Any:
  """``min(n, ceil(fraction·n))``: a Python int for a Python ``fraction``, int32 (computed in float32) for a traced one."""
  if hyperparams.is_traced(fraction):
    return jnp.minimum(jnp.ceil(jnp.asarray(fraction, jnp.float32) * n), n).astype(jnp.int32)
  return min(n, math.ceil(fraction * n))


def check_capacity(capacity: Capacity, name: str = "capacity") -> None:
  """Raises unless ``capacity`` is a float in ``(0, 1]`` or an int ``>= 1``."""
  if isinstance(capacity, bool) or not isinstance(capacity, (int, float)):
    raise TypeError(f"{name} must be a fraction (float in (0, 1]) or a count (int >= 1); got {capacity!r}.")
  if isinstance(capacity, float):
    check_fraction(capacity, f"{name} as a fraction")
  if isinstance(capacity, int) and capacity < 1:
    raise ValueError(f"{name} as a count must be >= 1; got {capacity}.")


def check_sample(sample, name: str = "sample") -> None:
  """Raises unless ``sample`` is ``None`` or an int ``>= 1``."""
  if sample is None:
    return
  if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
    raise ValueError(f"{name} must be None (use every entry) or an int >= 1; got {sample!r}.")


def uses_sample(sample, rows: int) -> bool:
  """Whether a sample of ``sample`` rows is drawn (``False``: the whole column is used)."""
  return sample is not None and sample < rows


def sample_rows(x2: jax.Array, key: jax.Array, k: int, impl: rng.RngImpl = "hash") -> jax.Array:
  """``k`` entries of every column of ``x2``, drawn uniformly with replacement.

  Rows are drawn independently per column (``k * cols`` draws from ``key``),
  with replacement: cheap, and unbiased for means and quantiles.

  Returns:
    ``(k, cols)``, column ``j`` a sample of ``x2[:, j]``.
  """
  rows, cols = x2.shape
  u = rng.uniform(key, k * cols, impl).reshape(k, cols)
  idx = jnp.minimum((u * rows).astype(jnp.int32), rows - 1)
  return jnp.take_along_axis(x2, idx, axis=0)


def _order_keys(x: jax.Array) -> jax.Array:
  """uint32 keys that order like the float32 values (``-inf`` < ... < ``-0.0`` < ``+0.0`` < ... < ``+inf``)."""
  b = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  return jnp.where(b >> 31 == 1, ~b, b | jnp.uint32(0x80000000))


def _from_order_keys(k: jax.Array) -> jax.Array:
  """Inverse of :func:`_order_keys`."""
  return lax.bitcast_convert_type(jnp.where(k >> 31 == 1, k & jnp.uint32(0x7FFFFFFF), ~k), jnp.float32)


_RADIX_BITS = 4  # key bits decided per round of kth_largest's radix selection (divides 32)

TOP_K_MAX = 32
"""Up to this static rank bound :func:`kth_largest` uses ``lax.top_k``; beyond it, radix selection."""


def kth_largest(pool: jax.Array, valid: jax.Array, t: jax.Array, kmax: int) -> jax.Array:
  """Per column, the ``t``-th largest valid entry of ``pool``; ``+inf`` where ``t == 0``.

  Two exact methods, chosen by the static bound ``kmax``:

  * ``kmax <= TOP_K_MAX``: ``lax.top_k`` of ``kmax`` per column (adaptive
    quantization's ranks, ``ceil(π·s)``, are small);
  * otherwise radix selection: the entries' order-preserving uint32 keys are
    searched from the top, :data:`_RADIX_BITS` bits per round (8 counting
    passes of 15 candidates each), which builds the largest key with at
    least ``t`` valid keys at or above it, the ``t``-th largest. For large
    ranks (top-k's rank in a sample of thousands) this beats ``lax.top_k``
    on XLA:CPU, and several bits per round keep the number of kernels,
    whose launch costs would otherwise dominate, small (docs/benchmarks.md).
    For small ranks (adaptive's 1-2) ``lax.top_k`` is faster.

  Args:
    pool: ``(m, cols)`` values.
    valid: ``(m, cols)`` booleans: which entries take part.
    t: int32 ``(cols,)`` ranks, ``0 <= t <= kmax``.
    kmax: static bound on ``t``.

  Returns:
    float32 ``(cols,)``; ``-inf`` where ``t`` exceeds the column's valid count.
  """
  m = pool.shape[0]
  if kmax <= TOP_K_MAX:
    kmax = max(1, min(kmax, m))
    masked = jnp.where(valid, pool, -jnp.inf).T  # (cols, m)
    top = lax.top_k(masked, kmax)[0]  # (cols, kmax), descending
    at = jnp.take_along_axis(top, jnp.clip(t - 1, 0, kmax - 1)[:, None], axis=1)[:, 0]
    return jnp.where(t > 0, at, jnp.inf)
  # Materialised once: XLA would otherwise fuse the pool's producer (e.g. a
  # sampling gather) into each of the 32 counting passes.
  keys = materialize(_order_keys(pool))
  valid = materialize(valid.astype(jnp.uint8)) > 0
  found = jnp.zeros(pool.shape[1:], jnp.uint32)
  digits = jnp.arange(1, 1 << _RADIX_BITS, dtype=jnp.uint32)[:, None]  # (15, 1)
  for shift in range(32 - _RADIX_BITS, -1, -_RADIX_BITS):
    cand = found[None, :] | (digits << jnp.uint32(shift))  # (15, cols), increasing
    at_or_above = jnp.sum(jnp.logical_and(valid[:, None, :], keys[:, None, :] >= cand[None]), axis=0, dtype=jnp.int32)
    # The counts fall as the digit grows: the largest digit whose count reaches t.
    digit = jnp.sum(at_or_above >= t[None, :], axis=0, dtype=jnp.uint32)
    found = found | (digit << jnp.uint32(shift))
  nvalid = jnp.sum(valid, axis=0, dtype=jnp.int32)
  return jnp.where(t > 0, jnp.where(t <= nvalid, _from_order_keys(found), -jnp.inf), jnp.inf)


class Slots(NamedTuple):
  """The selected rows of each column that fit into ``capacity`` slots (see :func:`compact_words`)."""

  rows: jax.Array  # int32 (capacity, cols): the selected row held by each slot, in row order; `fill` where empty
  used: jax.Array  # bool (capacity, cols): the slot holds a row
  count: jax.Array  # int32 (cols,): slots used
  overflow: jax.Array  # int32 (): selected entries that did not fit
  wrap: jax.Array  # int32 (cols,): slots before a wrapped window's start (ranks 0 … wrap − 1); 0 if unwrapped

  def values(self, x2: jax.Array) -> jax.Array:
    """``x2`` at the slots, ``(capacity, cols)``; 0 in empty slots."""
    safe = jnp.where(self.used, self.rows, 0)
    return jnp.where(self.used, jnp.take_along_axis(x2, safe, axis=0), jnp.zeros((), x2.dtype))


_WORD = 32  # mask bits packed per uint32 in compact_rows


def _select_bit(word: jax.Array, rank: jax.Array) -> jax.Array:
  """Position (0..31) of the ``rank``-th (0-based) set bit of ``word``, by binary search on popcounts."""
  pos = jnp.zeros(word.shape, jnp.int32)
  for width in (16, 8, 4, 2, 1):
    low = (word >> pos.astype(jnp.uint32)) & jnp.uint32((1 << width) - 1)
    c = lax.population_count(low).astype(jnp.int32)
    up = rank >= c
    pos = pos + jnp.where(up, width, 0)
    rank = rank - jnp.where(up, c, 0)
  return pos


_SCAN_BLOCK = 128  # rows per block of prefix_sum_rows beyond _SCAN_DIRECT
_SCAN_DIRECT = 512  # up to this many rows, one product with a triangular matrix


def _lower_ones(n: int) -> np.ndarray:
  """float32 ``(n, n)`` lower-triangular ones, a compile-time constant (``jnp.tril`` would build it at run time)."""
  return np.tri(n, dtype=np.float32)


_EXACT_F32 = 2**24  # every integer up to this is a float32


def prefix_sum_rows(counts: jax.Array, total_bound: Optional[int] = None) -> jax.Array:
  """Inclusive cumulative sum over axis 0 of non-negative int32 counts.

  ``jnp.cumsum`` over a major axis lowers to a windowed reduction on XLA:CPU
  that runs far below memory speed, and a Hillis-Steele scan takes
  ``log2(rows)`` passes, each a kernel of its own (docs/benchmarks.md). So,
  when ``total_bound`` (a static
  bound on every column's sum) is at most ``2**24``, the sums are products
  with lower-triangular matrices of ones in float32, exact because every
  partial sum is an integer no larger than the total:

  * up to :data:`_SCAN_DIRECT` rows, one product;
  * beyond, blocks of :data:`_SCAN_BLOCK` rows: each block's own prefix sums
    (one batched product), plus the prefix sum of the blocks' totals
    (recursively), a few kernels in all.

  Without such a bound (``None``, or larger), the Hillis-Steele scan in int32.

  Args:
    counts: int32 ``(rows, ...)``, non-negative.
    total_bound: static upper bound on each column's sum, or ``None``.
  """
  n = counts.shape[0]
  if total_bound is None or total_bound > _EXACT_F32:
    out, k = counts, 1
    while k < n:
      out = materialize(out + jnp.concatenate([jnp.zeros((k,) + out.shape[1:], out.dtype), out[:-k]]))
      k *= 2
    return out
  if n <= _SCAN_DIRECT:
    return jnp.dot(_lower_ones(n), counts.astype(jnp.float32), precision=lax.Precision.HIGHEST).astype(jnp.int32)
  b = _SCAN_BLOCK
  nb = -(-n // b)
  blocks = jnp.pad(counts, ((0, nb * b - n),) + ((0, 0),) * (counts.ndim - 1))
  blocks = blocks.reshape((nb, b) + counts.shape[1:]).astype(jnp.float32)
  local = jnp.einsum("ij,nj...->ni...", _lower_ones(b), blocks, precision=lax.Precision.HIGHEST).astype(jnp.int32)
  totals = local[:, -1]
  before = prefix_sum_rows(totals, total_bound) - totals  # (nb, ...): the sum of all earlier blocks
  # Materialised: its readers gather from it, and would otherwise redo the sum per read.
  return materialize((local + before[:, None]).reshape((nb * b,) + counts.shape[1:])[:n])


def pack_rows(mask: jax.Array) -> jax.Array:
  """``mask`` (bool ``(rows, cols)``) packed 32 rows per uint32 word, per column.

  Word ``w`` of column ``j`` holds rows ``32w … 32w + 31``, row ``32w + b`` in
  bit ``b`` (LSB first); rows past the end are 0 bits. Returns uint32
  ``(ceil(rows / 32), cols)``.

  The bits are disjoint, so the word is a sum of the shifted bits: one
  reduction, into which XLA:CPU fuses the mask's producer (a comparison);
  OR-ing 32 strided slices would store the mask first. A reduction also
  ends the fusion, so :func:`compact_words`' gathers read stored words.
  """
  rows, cols = mask.shape
  nwords = -(-rows // _WORD)
  padded = nwords * _WORD
  m = mask if padded == rows else jnp.concatenate([mask, jnp.zeros((padded - rows, cols), bool)])
  m = m.reshape(nwords, _WORD, cols).astype(jnp.uint32) << jnp.arange(_WORD, dtype=jnp.uint32)[:, None]
  return jnp.sum(m, axis=1, dtype=jnp.uint32)


def compact_rows(mask: jax.Array, capacity: int, fill: int = 0, key: Optional[jax.Array] = None) -> Slots:
  """The selected rows of every column that fit into ``capacity`` slots (``mask``: bool ``(rows, cols)``).

  :func:`compact_words` of :func:`pack_rows`; see there.
  """
  return compact_words(pack_rows(mask), capacity, fill, key)


_START_STREAM = 0x5E1EC7  # folded into compact_words' key, so its draw is independent of the caller's own


def start_ranks(key: jax.Array, total: jax.Array) -> jax.Array:
  """Per column, a rank drawn uniformly from ``[0, total)`` (0 where ``total == 0``).

  32 random bits modulo ``total``: the modulo bias is below ``total / 2**32``.
  """
  bits = jax.random.bits(jax.random.fold_in(key, _START_STREAM), total.shape, jnp.uint32)
  return (bits % jnp.maximum(total, 1).astype(jnp.uint32)).astype(jnp.int32)


def compact_words(words: jax.Array, capacity: int, fill: int = 0, key: Optional[jax.Array] = None) -> Slots:
  """The selected rows of every column that fit into ``capacity`` slots, with no full-size scan or scatter.

  When more entries are selected than fit (``total > capacity`` in a
  column), which ones are sent is the overflow policy; the rest overflow
  (with error feedback they stay in the residual and compete again at the
  next step):

  * with a ``key``: the ``capacity`` selected entries whose ranks (their
    order by row among the column's selected entries) are ``r, r + 1, …``
    modulo ``total``, with the start ``r`` drawn uniformly from ``[0,
    total)`` (:func:`start_ranks`). Every selected entry is then sent with
    probability exactly ``capacity / total``, whatever its row and whatever
    the layout of the others: no position has a standing advantage. (A start
    drawn over the *rows* instead would favour the entries that follow a long
    run of unselected rows.)
  * without: the first ``capacity`` in row order (``r = 0``).

  The slots hold their rows in increasing row order either way (a wrapped
  window is ranks ``0 … a − 1`` then ``r … total − 1``; ``a`` is
  :attr:`Slots.wrap`).

  The obvious way, a cumulative sum over the rows and a scatter of every
  entry, is what dominates on XLA:CPU for large tensors. Instead, from the
  mask packed into 32-bit words (:func:`pack_rows`, one fused elementwise
  pass):

  1. count the words' bits and take a cumulative sum over the words (32x
     shorter than the column, :func:`prefix_sum_rows`);
  2. the word that holds each slot's selected entry: the prefix sum of a
     histogram over the words of the first slot each word's inclusive count
     reaches (for slot ``s`` holding rank ``q(s)``, the number of words with
     at most ``q(s)`` selected entries up to and including them); a binary
     search on popcounts then finds the bit within the word.

  These steps touch ``rows / 32`` and ``capacity`` values per column instead of
  ``rows``; the start costs nothing more.

  Args:
    words: uint32 ``(nwords, cols)`` in :func:`pack_rows`'s layout.
    capacity: static slots per column (``>= 1``).
    fill: the row index written into empty slots.
    key: a PRNG key for the start ranks, or ``None`` for the first in row order.
  """
  nwords, cols = words.shape
  pc = lax.population_count(words).astype(jnp.int32)  # (nwords, cols)
  incl = prefix_sum_rows(pc, _WORD * nwords)
  total = incl[-1]
  count = jnp.minimum(total, capacity)
  slot = lax.broadcasted_iota(jnp.int32, (capacity, cols), 0)
  # The window of ranks: slot s holds rank q(s) = s for s < a, r + s - a after
  # (strictly increasing), a = the part that wraps past the last rank.
  if key is None:
    q, first_slot = slot, incl
  else:
    over = total > capacity
    r = jnp.where(over, start_ranks(key, total), 0)
    a = jnp.where(over, jnp.maximum(r + capacity - total, 0), 0)
    q = jnp.where(slot < a, slot, r + slot - a)
    first_slot = jnp.where(incl < a, incl, jnp.where(incl <= r, a, a + incl - r))
  # w[s] = number of words whose inclusive count is <= q(s): the word holding
  # rank q(s). Per word, the first slot s_w with q(s_w) >= its inclusive
  # count; a histogram of those below `capacity` (one scatter-add of nwords
  # values per column) and its prefix sum give w for every slot at once (a
  # per-slot binary search would need log2(nwords) dependent gathers, which are slow).
  # Without a start (r = a = 0), s_w is the inclusive count itself.
  col = lax.broadcasted_iota(jnp.int32, incl.shape, 1)
  hist = jnp.zeros((capacity, cols), jnp.int32).at[first_slot, col].add(1, mode="drop")
  w = prefix_sum_rows(hist, nwords)  # the histogram counts words
  used = slot < count[None, :]
  wc = jnp.minimum(w, nwords - 1)
  before = jnp.take_along_axis(incl - pc, wc, axis=0)
  word = jnp.take_along_axis(words, wc, axis=0)
  # Materialised: read twice (the slots' rows, and Slots.values's gather),
  # and XLA would otherwise redo the bit search inside each reader.
  row = materialize(wc * _WORD + _select_bit(word, q - before))
  overflow = jnp.sum(total) - jnp.sum(count)
  return Slots(rows=jnp.where(used, row, fill), used=used, count=count, overflow=overflow,
               wrap=a if key is not None else jnp.zeros_like(count))


def safe_mean(total: jax.Array, count: jax.Array) -> jax.Array:
  """``total / count``, and 0 where ``count == 0`` (never 0/0)."""
  return jnp.where(count > 0, total / jnp.maximum(count, 1).astype(total.dtype), 0.0)


EMPTY_WORD = 0xFFFFFFFF
"""An empty slot: sign bit 1 and index ``2**31 - 1`` (``sparse.MAX_INDEX``).

Compressors that send words accept only tensors (or columns) with at most
``sparse.MAX_INDEX`` entries, so this index never addresses an entry and the
word decodes to nothing; no count has to travel with the words.
"""


def check_word_rows(rows: int, what: str) -> None:
  """Raises if ``rows`` entries cannot be addressed by 31-bit word indices."""
  if rows > sparse.MAX_INDEX:
    raise ValueError(f"{what} has {rows} entries; 32-bit words address at most {sparse.MAX_INDEX}.")


def slot_words(x2: jax.Array, s: Slots) -> jax.Array:
  """``uint32 (capacity, cols)``: per slot, its row and sign bit (1 for ``x > 0``).

  ``s`` must come from :func:`compact_rows` with ``fill=sparse.MAX_INDEX``;
  empty slots become :data:`EMPTY_WORD`.
  """
  positive = jnp.logical_or(s.values(x2) > 0, jnp.logical_not(s.used))
  return sparse.sparse_words_encode(s.rows.reshape(-1), positive.reshape(-1)).reshape(s.rows.shape)


def read_words(words: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(rows int32, positive bool, used bool)`` of an array of words, same shape."""
  rows, signs = sparse.sparse_words_decode(words)
  return rows.reshape(words.shape), (signs > 0).reshape(words.shape), words != jnp.uint32(EMPTY_WORD)


def scatter_columns(rows: jax.Array, values: jax.Array, shape2: tuple[int, int]) -> jax.Array:
  """``zeros(shape2)`` with ``values[s, j]`` added at ``(rows[s, j], j)``; out-of-range rows are dropped."""
  col = lax.broadcasted_iota(jnp.int32, rows.shape, 1)
  return jnp.zeros(shape2, jnp.float32).at[rows, col].add(values, mode="drop")


def rice_bits(rows: jax.Array, count: jax.Array) -> jax.Array:
  """Exact bits of the delta + Golomb-Rice message of the first ``count`` sorted indices.

  The message of :func:`jaxcomp.codecs.sparse.sparse_rice_encode` (37-bit
  header, then per entry ``(d >> k) + 1 + k + 1`` bits, ``d`` the index gap
  minus one), with the Rice parameter ``k`` in ``[0, 30]`` that makes it
  shortest (the header carries ``k``, so any ``k`` decodes): a jit-able, exact
  size of a message the codec produces with that ``k``.

  Args:
    rows: int32 ``(capacity,)``, strictly increasing over the first ``count``.
    count: int32 scalar.
  """
  used = jnp.arange(rows.shape[0]) < count
  prev = jnp.concatenate([jnp.full((1,), -1, jnp.int32), rows[:-1]])
  d = jnp.where(used, rows - prev - 1, 0)
  ks = jnp.arange(31, dtype=jnp.int32)
  per_k = jnp.sum(jnp.where(used, d[None, :] >> ks[:, None], 0), axis=1) + count * (ks + 2)
  return 37 + jnp.min(per_k)
