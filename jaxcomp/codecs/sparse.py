"""Sparse index coding for threshold and top-k quantization (Dryden §3.2).

Threshold quantization (Strom 2015, as implemented by Dryden et al., MLHPC
2016, §3.2) sends only the updates with ``|g| > τ``; each is sent as **one
32-bit word: one bit of quantized value, 31 bits of index**. Fixed here:

* ``word = (bit << 31) | index`` as ``uint32``, with ``bit = 1`` for a
  positive update (Dryden: "greater than τ are encoded with the value 1")
  and ``bit = 0`` for a negative one; ``0 <= index < 2**31``.

Dryden et al. also evaluate **delta coding followed by Golomb-Rice coding**
of the positions (after Strom). Fixed here:

* indices must be strictly increasing (sort them first); the deltas are
  ``d_0 = i_0`` and ``d_j = i_j - i_{j-1} - 1`` (all >= 0);
* Rice code with parameter ``k`` of ``d``: ``d >> k`` one-bits, a zero bit,
  then the ``k`` low bits of ``d`` (MSB first); each entry is followed by its
  sign bit (same convention as the word);
* message = 32-bit entry count, 5-bit ``k``, then the entries; MSB-first,
  zero-padded to whole bytes. Its exact length is
  ``37 + sum_j ((d_j >> k) + 1 + k + 1)`` bits (:func:`sparse_rice_bits`);
* ``k`` defaults to :func:`rice_parameter` of the mean delta: for a
  geometric source with mean ``μ`` the optimal Golomb-power-of-two parameter
  is ``max(0, 1 + floor(log2(log(φ - 1) / log(μ / (μ + 1)))))`` with ``φ``
  the golden ratio (Kiely, "Selecting the Golomb parameter in Rice coding",
  IPN Progress Report 42-159, 2004); positions kept by a threshold are close
  to independent, so their deltas are close to geometric.

The 32-bit word coder is jit-able JAX (top-k has a static ``k``); the Rice
coder runs on the host in NumPy, vectorized like :mod:`jaxcomp.codecs.elias`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxcomp.codecs._bitio import BitReader, follow_chain, write_fields

__all__ = [
    "MAX_INDEX",
    "RiceMessage",
    "rice_parameter",
    "sparse_rice_bits",
    "sparse_rice_decode",
    "sparse_rice_encode",
    "sparse_words_bytes",
    "sparse_words_decode",
    "sparse_words_decode_checked",
    "sparse_words_encode",
    "sparse_words_encode_checked",
]

MAX_INDEX = (1 << 31) - 1
"""Largest index a 32-bit word (31 index bits) can carry."""
_COUNT_BITS = 32
_K_BITS = 5
_HEADER_BITS = _COUNT_BITS + _K_BITS
_U64 = np.uint64


# --------------------------------------------------------------------------
# One 32-bit word per value
# --------------------------------------------------------------------------


def sparse_words_bytes(count: int) -> int:
  """Bytes of ``count`` sparse words: ``4 * count``."""
  return 4 * int(count)


def _check_int(x: Any, name: str) -> jax.Array:
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f"{name} must be an integer array, got dtype {x.dtype}")
  return x.reshape(-1)


@jax.jit
def _words(indices: jax.Array, signs: jax.Array) -> jax.Array:
  bit = (signs > 0).astype(jnp.uint32) << 31
  return bit | (indices.astype(jnp.uint32) & jnp.uint32(MAX_INDEX))


@jax.jit
def _unwords(words: jax.Array) -> tuple[jax.Array, jax.Array]:
  idx = (words & jnp.uint32(MAX_INDEX)).astype(jnp.int32)
  sign = jnp.where((words >> 31) == 1, jnp.int8(1), jnp.int8(-1))
  return idx, sign


def sparse_words_encode(indices: Any, signs: Any) -> jax.Array:
  """One ``uint32`` per sent value: sign bit (1 = positive) and 31-bit index.

  Args:
    indices: integer array of flat indices in ``[0, 2**31)`` (not checked on
      this traceable path; see :func:`sparse_words_encode_checked`).
    signs: integer or float array of the same length; ``> 0`` is positive,
      anything else negative.

  Returns:
    ``uint32[len(indices)]``; ``bytes_on_wire = 4 * len``.
  """
  indices = _check_int(indices, "sparse_words_encode: indices")
  signs = jnp.asarray(signs).reshape(-1)
  if indices.shape != signs.shape:
    raise ValueError(f"sparse_words_encode: {indices.shape[0]} indices but "
                     f"{signs.shape[0]} signs")
  return _words(indices, signs)


def sparse_words_decode(words: Any) -> tuple[jax.Array, jax.Array]:
  """Inverse of :func:`sparse_words_encode` (jit-able).

  Returns:
    ``(indices int32, signs int8 in {-1, +1})``.
  """
  words = jnp.asarray(words)
  if words.dtype != jnp.uint32:
    raise TypeError(f"sparse_words_decode expects uint32 words, got "
                    f"{words.dtype}")
  return _unwords(words.reshape(-1))


def sparse_words_encode_checked(indices: Any, signs: Any) -> jax.Array:
  """:func:`sparse_words_encode` after host-side checks.

  Raises:
    ValueError: on an index outside ``[0, 2**31)`` or a sign not in {-1, +1}.
  """
  idx = np.asarray(indices).reshape(-1)
  sg = np.asarray(signs).reshape(-1)
  if idx.size and not np.issubdtype(idx.dtype, np.integer):
    raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
  bad = np.flatnonzero((idx < 0) | (idx > MAX_INDEX))
  if bad.size:
    raise ValueError(f"sparse_words_encode_checked: index {idx[bad[0]]} at "
                     f"{int(bad[0])} does not fit in 31 bits")
  bad = np.flatnonzero((sg != 1) & (sg != -1))
  if bad.size:
    raise ValueError(f"sparse_words_encode_checked: sign {sg[bad[0]]} at "
                     f"{int(bad[0])} is not -1 or +1")
  return sparse_words_encode(idx.astype(np.int64), sg)


def sparse_words_decode_checked(words: Any, n: int) -> tuple[jax.Array, jax.Array]:
  """:func:`sparse_words_decode` that checks every index is below ``n``.

  Raises:
    ValueError: naming the first word whose index is ``>= n``.
  """
  w = np.asarray(words).reshape(-1)
  if w.dtype != np.uint32:
    raise TypeError(f"sparse_words_decode_checked expects uint32, got {w.dtype}")
  idx = w & np.uint32(MAX_INDEX)
  bad = np.flatnonzero(idx >= int(n))
  if bad.size:
    raise ValueError(
        f"sparse_words_decode_checked: word {int(bad[0])} has index "
        f"{int(idx[bad[0]])} >= n = {int(n)} (corrupted stream or wrong n)")
  return sparse_words_decode(w)


# --------------------------------------------------------------------------
# Delta + Golomb-Rice
# --------------------------------------------------------------------------


class RiceMessage(NamedTuple):
  """A delta + Golomb-Rice coded index set.

  Attributes:
    data: ``uint8[ceil(num_bits / 8)]``.
    num_bits: exact length in bits.
    k: the Rice parameter used.
  """

  data: np.ndarray
  num_bits: int
  k: int


_LOG_PHI_MINUS_1 = math.log((math.sqrt(5.0) - 1.0) / 2.0)  # log(φ - 1) < 0


def rice_parameter(deltas: Any) -> int:
  """Rice parameter for deltas with the given mean (Kiely 2004, see module).

  ``k = max(0, 1 + floor(log2(log(φ - 1) / log(μ / (μ + 1)))))`` with ``μ``
  the mean delta; ``k = 0`` for ``μ`` below ``(φ - 1) / (2 - φ) ≈ 1.618``
  (there the formula is negative) and for an empty set. Capped at 30.
  """
  d = np.asarray(deltas, np.float64).reshape(-1)
  if d.size == 0:
    return 0
  mu = float(d.mean())
  if mu <= 0.0:
    return 0
  ratio = _LOG_PHI_MINUS_1 / math.log(mu / (mu + 1.0))
  if ratio <= 0.0:
    return 0
  return int(min(30, max(0, 1 + math.floor(math.log2(ratio)))))


def _deltas(indices: Any) -> np.ndarray:
  idx = np.asarray(indices).reshape(-1)
  if idx.size and not np.issubdtype(idx.dtype, np.integer):
    raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
  idx = idx.astype(np.int64)
  if idx.size:
    if idx[0] < 0 or idx[-1] > MAX_INDEX:
      raise ValueError("indices must lie in [0, 2**31)")
    if idx.size > 1 and (np.diff(idx) <= 0).any():
      i = int(np.flatnonzero(np.diff(idx) <= 0)[0])
      raise ValueError(f"indices must be strictly increasing; index {i + 1} "
                       f"({idx[i + 1]}) follows {idx[i]}")
  return np.diff(idx, prepend=-1) - 1


def sparse_rice_bits(indices: Any, k: Optional[int] = None) -> int:
  """Exact bits of :func:`sparse_rice_encode` (``k`` defaults as there)."""
  d = _deltas(indices)
  if k is None:
    k = rice_parameter(d)
  return _HEADER_BITS + int(((d >> k) + k + 2).sum())


def sparse_rice_encode(indices: Any, signs: Any,
                       k: Optional[int] = None) -> RiceMessage:
  """Delta + Golomb-Rice coding of sorted indices with one sign bit each.

  Args:
    indices: strictly increasing integer indices in ``[0, 2**31)``.
    signs: same length; ``> 0`` is positive (bit 1), else negative (bit 0).
    k: Rice parameter in ``[0, 31]``; default :func:`rice_parameter` of the
      deltas.

  Returns:
    A :class:`RiceMessage` with ``num_bits == sparse_rice_bits(indices, k)``.
  """
  d = _deltas(indices)
  sg = np.asarray(signs).reshape(-1)
  if sg.shape != d.shape:
    raise ValueError(f"sparse_rice_encode: {d.size} indices but {sg.size} signs")
  if k is None:
    k = rice_parameter(d)
  k = int(k)
  if not 0 <= k < 32:
    raise ValueError(f"Rice parameter k must be in [0, 32), got {k}")
  m = d.size
  if m > (1 << _COUNT_BITS) - 1:
    raise ValueError("too many entries for the 32-bit count")
  q = d >> k
  # Fields per entry: unary ones in pieces of <= 64 bits, then one field of
  # (terminating 0, k remainder bits, sign bit).
  pieces = (q + 63) // 64  # number of all-ones fields (last may be partial)
  per_entry = pieces + 1
  total = int(per_entry.sum())
  first = np.cumsum(per_entry) - per_entry
  entry = np.repeat(np.arange(m), per_entry)
  slot = np.arange(total) - first[entry]
  is_tail = slot == pieces[entry]
  ones_w = np.minimum(64, q[entry] - 64 * slot)
  tail_v = ((d & ((1 << k) - 1)).astype(_U64) << _U64(1)) | (
      sg > 0).astype(_U64)
  vals = np.where(is_tail, tail_v[entry], ~_U64(0))
  wids = np.where(is_tail, k + 2, ones_w)
  header_v = np.array([m, k], _U64)
  header_w = np.array([_COUNT_BITS, _K_BITS])
  data, num_bits = write_fields(np.concatenate([header_v, vals]),
                                np.concatenate([header_w, wids]))
  return RiceMessage(data, num_bits, k)


def sparse_rice_decode(data: Any, n: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
  """Decodes a :func:`sparse_rice_encode` message.

  Args:
    data: the message bytes (exactly ``ceil(num_bits / 8)`` of them).
    n: if given, every index must be below it.

  Returns:
    ``(indices int64, signs int8 in {-1, +1})``.

  Raises:
    ValueError: if the stream is truncated (ends mid-entry or has fewer
      entries than its count), has trailing bytes or non-zero padding, or an
      index is ``>= n``.
  """
  a = np.asarray(data)
  if a.dtype != np.uint8 or a.ndim != 1:
    raise TypeError(f"sparse_rice_decode expects 1-D uint8, got {a.dtype} "
                    f"{a.shape}")
  end = 8 * a.shape[0]
  if end < _HEADER_BITS:
    raise ValueError(f"sparse_rice_decode: {end} bits cannot hold the "
                     f"{_HEADER_BITS}-bit header; truncated stream")
  reader = BitReader(a)
  count = int(reader.read(np.array([0]), _COUNT_BITS)[0])
  k = int(reader.read(np.array([_COUNT_BITS]), _K_BITS)[0])
  if count * (k + 2) > end - _HEADER_BITS:
    raise ValueError(
        f"sparse_rice_decode: {count} entries of >= {k + 2} bits cannot fit "
        f"in {end - _HEADER_BITS} bits; truncated or corrupted stream")
  if count == 0:
    stop = _HEADER_BITS
    starts = np.zeros((0,), np.int64)
  else:
    bits = np.unpackbits(a)
    # First zero bit at or after each position (end if none).
    zero_at = np.where(bits == 0, np.arange(end), end)
    zero_at = np.minimum.accumulate(zero_at[::-1])[::-1]
    nxt = np.full((end + 2,), end + 1, np.int64)
    entry_end = zero_at + 1 + k + 1
    nxt[:end] = np.where((zero_at < end) & (entry_end <= end), entry_end,
                         end + 1)
    nxt[end] = end
    starts, stop = follow_chain(nxt, _HEADER_BITS, end, max_codes=count)
    if stop > end or starts.size < count:
      raise ValueError(
          f"sparse_rice_decode: stream ends mid-entry: entry "
          f"{starts.size - 1 if stop > end else starts.size} of {count} runs "
          f"past bit {end} (truncated or corrupted stream)")
  if (end - stop) >= 8 or (stop < end and _bits_after(a, stop)):
    raise ValueError(
        f"sparse_rice_decode: {end - stop} bits after the last entry "
        "(trailing bytes or non-zero padding; corrupted stream)")
  if count == 0:
    return np.zeros((0,), np.int64), np.zeros((0,), np.int8)
  z = zero_at[starts]
  q = (z - starts).astype(np.int64)
  r = reader.read(z + 1, k).astype(np.int64) if k else np.zeros_like(q)
  sign = reader.bits(z + 1 + k)
  d = (q << k) | r
  idx = np.cumsum(d + 1) - 1
  if idx[-1] > MAX_INDEX or (n is not None and idx[-1] >= int(n)):
    raise ValueError(f"sparse_rice_decode: index {int(idx[-1])} out of range "
                     f"(n = {n}); corrupted stream")
  return idx, np.where(sign == 1, 1, -1).astype(np.int8)


def _bits_after(data: np.ndarray, pos: int) -> bool:
  """Whether any bit at or after ``pos`` is set."""
  byte, bit = divmod(int(pos), 8)
  if byte >= data.shape[0]:
    return False
  head = int(data[byte]) & ((1 << (8 - bit)) - 1)
  return bool(head) or bool(np.any(data[byte + 1:]))
