"""Recursive Elias (omega) coding and QSGD's message format (QSGD §3.1).

QSGD (Alistarh et al., NeurIPS 2017, §3.1, "Efficient Coding of Gradients")
codes positive integers with Elias' recursive code: the binary representation
of ``k`` is prefixed by its length, and that prefix is coded the same way,
recursively, so ``|Elias(k)| = log k + log log k + ... + 1``. Concretely
(Elias omega): write a ``0``; while ``k > 1``, prepend ``bin(k)`` and set
``k = len(bin(k)) - 1``. Examples: 1 → ``0``, 2 → ``100``, 4 → ``101000``,
16 → ``10100100000``, 100 → ``1011011001000``. Decoding: ``n = 1``; read a
bit; while it is 1, read ``n`` more bits, so that ``n`` becomes the ``n + 1``
bits just read; a 0 bit ends the code with value ``n``.

The QSGD message for a quantized vector ``Q_s(v) = ||v||_2 · sgn(v_i) ·
ζ_i / s`` of length ``n`` (paper: 32 bits for the norm, then per nonzero the
Elias-coded position, a sign bit, the Elias-coded level), fixed here as:

* 32 bits: the IEEE-754 float32 bits of ``||v||_2``, most significant first;
* for each nonzero ``ζ_i`` in increasing ``i``:
  ``Elias(gap)``, one sign bit (1 = negative, 0 = positive), ``Elias(ζ_i)``
  with the integer level ``ζ_i = s · ξ_i >= 1``;
* gaps: the first is ``i_1 + 1`` (0-based position plus one) and each next
  ``i_j - i_{j-1}``, so every gap is >= 1 and positions are ``cumsum(gaps) -
  1``.

The string S is exactly this; its length in bits, :func:`qsgd_message_bits`,
is what Theorem 3.2 and Corollary 3.3 bound. On the host it is stored MSB-first
in ``ceil(bits / 8)`` bytes with zero padding. Because a zero bit is itself a
valid Elias code, the padding would be ambiguous, so the decoder takes the
exact bit count (carried beside the bytes, as a length word would be on a
wire).

All of this runs on the host in NumPy, vectorized: encoding builds fields and
packs them (:mod:`jaxcomp.codecs._bitio`); decoding computes, for every bit
position at once, where an Elias code starting there would end, and then
follows the chain of codes by pointer doubling. No Python loop runs over bits
or codes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxcomp.codecs._bitio import BitReader, bit_length, follow_chain, write_fields

__all__ = [
    "EliasMessage",
    "bits_to_bytes",
    "elias_omega_bits",
    "elias_omega_decode",
    "elias_omega_encode",
    "elias_omega_lengths",
    "qsgd_decode",
    "qsgd_encode",
    "qsgd_message_bits",
]

_U64 = np.uint64
_NORM_BITS = 32
_MAX_GROUPS = 6  # groups of a code of a value < 2**64: 64 → 6 → 2 → ... ≤ 5


class EliasMessage(NamedTuple):
  """A bit string stored in bytes.

  Attributes:
    data: ``uint8[ceil(num_bits / 8)]``, MSB-first, zero-padded.
    num_bits: exact length of the bit string.
  """

  data: np.ndarray
  num_bits: int


def bits_to_bytes(num_bits: int) -> int:
  """``encoded_bytes`` of a bit string: ``ceil(num_bits / 8)``."""
  return (int(num_bits) + 7) // 8


# --------------------------------------------------------------------------
# Elias omega
# --------------------------------------------------------------------------


def _positive_u64(values: Any, name: str) -> np.ndarray:
  a = np.asarray(values)
  if a.size and not np.issubdtype(a.dtype, np.integer):
    raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
  a = a.reshape(-1)
  if a.size and (a < 1).any():
    i = int(np.flatnonzero(a < 1)[0])
    raise ValueError(f"{name}: Elias coding needs positive integers; found "
                     f"{a[i]} at index {i}")
  return a.astype(_U64)


def _groups(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The groups of each code, innermost first: (values, widths) (m, G)."""
  vals, wids = [], []
  v = k
  while True:
    active = v > 1
    if not active.any():
      break
    w = np.where(active, bit_length(v), 0)
    vals.append(np.where(active, v, _U64(0)))
    wids.append(w)
    v = np.where(active, (w - 1).astype(_U64), _U64(1))
  if not vals:
    return (np.zeros((k.size, 0), _U64), np.zeros((k.size, 0), np.int64))
  # Stream order: innermost (last computed) group first.
  return np.stack(vals[::-1], axis=1), np.stack(wids[::-1], axis=1)


def _omega_fields(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Fields of each code in stream order, one row per value: (m, G + 1)."""
  vals, wids = _groups(k)
  zero = np.zeros((k.size, 1), _U64)
  return (np.concatenate([vals, zero], axis=1),
          np.concatenate([wids, np.ones((k.size, 1), np.int64)], axis=1))


def elias_omega_lengths(values: Any) -> np.ndarray:
  """Exact code length in bits of each value (int64 array)."""
  k = _positive_u64(values, "elias_omega_lengths")
  _, wids = _groups(k)
  return wids.sum(axis=1) + 1


def elias_omega_bits(values: Any) -> int:
  """Total bits of the Elias omega codes of ``values``."""
  return int(elias_omega_lengths(values).sum())


def elias_omega_encode(values: Any) -> EliasMessage:
  """Concatenated Elias omega codes of positive integers (< 2**64)."""
  k = _positive_u64(values, "elias_omega_encode")
  vals, wids = _omega_fields(k)
  return EliasMessage(*write_fields(vals.reshape(-1), wids.reshape(-1)))


def _omega_scan(reader: BitReader, starts: np.ndarray,
                end: int) -> tuple[np.ndarray, np.ndarray]:
  """Decodes one Elias code at each of ``starts`` at once (vectorized).

  Returns ``(ends, values)``: where each code ends, or ``end + 1`` if it runs
  past bit ``end`` (or is longer than 64-bit values allow), and its value.
  At most ``_MAX_GROUPS + 1`` vectorized rounds, one per group of a code.
  """
  starts = np.asarray(starts, np.int64)
  pos = starts.copy()
  n = np.ones(starts.shape, _U64)
  ends = np.full(starts.shape, end + 1, np.int64)
  active = np.flatnonzero(starts < end)
  for _ in range(_MAX_GROUPS + 1):
    if active.size == 0:
      break
    p = pos[active]
    active = active[p < end]  # a code that needs another bit past the end
    p = pos[active]
    stop = reader.bits(p) == 0
    ends[active[stop]] = p[stop] + 1
    go = active[~stop]
    width = n[go] + _U64(1)  # the 1 bit just seen is the first of them
    ok = (width <= 64) & (pos[go] + np.minimum(width, 64).astype(np.int64) <= end)
    go = go[ok]  # the others keep ends = end + 1
    width = width[ok].astype(np.int64)
    n[go] = reader.read(pos[go], width)
    pos[go] += width
    active = go
  return ends, n


def _omega_ends(reader: BitReader, end: int) -> np.ndarray:
  """Where an Elias code starting at each bit position would end.

  Length ``end + 3``: entries ``< end`` are speculative decodes at every
  position (``end + 1`` = would run past the end), ``ends[end] = end`` and
  ``ends[end + 1] = ends[end + 2] = end + 1`` make the chain absorbing (see
  :func:`jaxcomp.codecs._bitio.follow_chain`).
  """
  ends = np.full((end + 3,), end + 1, np.int64)
  ends[:end], _ = _omega_scan(reader, np.arange(end, dtype=np.int64), end)
  ends[end] = end
  return ends


def elias_omega_decode(data: Any, count: int,
                       num_bits: int | None = None) -> np.ndarray:
  """Decodes ``count`` consecutive Elias omega codes.

  Args:
    data: uint8 bytes (MSB-first).
    count: number of codes to read.
    num_bits: exact stream length; defaults to all bits of ``data``. When
      given, the codes must end exactly there and the padding must be zero.

  Returns:
    ``np.uint64[count]``.

  Raises:
    ValueError: if the stream ends in the middle of a code, has fewer codes
      than ``count``, or (with ``num_bits``) has trailing bits.
  """
  data = _check_data(data, num_bits, "elias_omega_decode")
  end = 8 * data.shape[0] if num_bits is None else int(num_bits)
  count = int(count)
  if count < 0:
    raise ValueError(f"count must be >= 0, got {count}")
  if count == 0:
    if num_bits is not None and end != 0:
      raise ValueError(f"elias_omega_decode: {end} bits left after 0 codes")
    return np.zeros((0,), _U64)
  if count > end:
    raise ValueError(f"elias_omega_decode: {count} codes cannot fit in "
                     f"{end} bits (each takes at least 1); truncated stream")
  reader = BitReader(data)
  ends = _omega_ends(reader, end)
  starts, stop = follow_chain(ends, 0, end, max_codes=count)
  if stop > end:
    raise ValueError(
        f"elias_omega_decode: Elias stream ends mid-code: code "
        f"{starts.size - 1} (starting at bit {int(starts[-1])}) runs past bit "
        f"{end} (truncated or corrupted stream)")
  if starts.size < count:
    raise ValueError(
        f"elias_omega_decode: the {end}-bit stream holds {starts.size} codes, "
        f"expected {count} (truncated stream or wrong count)")
  if num_bits is not None and stop != end:
    raise ValueError(f"elias_omega_decode: {end - stop} bits left after "
                     f"{count} codes (corrupted stream or wrong count)")
  return _omega_scan(reader, starts, end)[1]


# --------------------------------------------------------------------------
# QSGD message
# --------------------------------------------------------------------------


def _check_data(data: Any, num_bits: int | None, name: str) -> np.ndarray:
  a = np.asarray(data)
  if a.dtype != np.uint8 or a.ndim != 1:
    raise TypeError(f"{name} expects a 1-D uint8 array, got {a.dtype} "
                    f"{a.shape}")
  if num_bits is not None:
    num_bits = int(num_bits)
    if num_bits < 0:
      raise ValueError(f"{name}: num_bits must be >= 0, got {num_bits}")
    if a.shape[0] != bits_to_bytes(num_bits):
      raise ValueError(
          f"{name}: a {num_bits}-bit message takes {bits_to_bytes(num_bits)} "
          f"bytes, got {a.shape[0]} (truncated stream or wrong num_bits)")
    if num_bits % 8 and (int(a[-1]) & ((1 << (8 - num_bits % 8)) - 1)):
      raise ValueError(f"{name}: padding bits after bit {num_bits} are not "
                       "zero (corrupted stream or wrong num_bits)")
  return a


def _split_levels(q: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  a = np.asarray(q)
  if a.size and not np.issubdtype(a.dtype, np.integer):
    raise TypeError(
        "qsgd_encode expects the signed integer levels sgn(v_i) * s * xi_i, "
        f"got dtype {a.dtype}")
  a = a.reshape(-1).astype(np.int64)
  pos = np.flatnonzero(a)
  gaps = np.diff(pos, prepend=-1).astype(_U64)
  levels = np.abs(a[pos]).astype(_U64)
  return gaps, (a[pos] < 0), levels, a.size


def qsgd_message_bits(q: Any) -> int:
  """Exact length in bits of the QSGD message of integer levels ``q``.

  ``32 + sum over nonzeros of (|Elias(gap)| + 1 + |Elias(level)|)``; computed
  from code lengths, without building the message.
  """
  gaps, _, levels, _ = _split_levels(q)
  if gaps.size == 0:
    return _NORM_BITS
  return (_NORM_BITS + int(elias_omega_lengths(gaps).sum()) + gaps.size
          + int(elias_omega_lengths(levels).sum()))


def qsgd_encode(norm: float, q: Any) -> EliasMessage:
  """Encodes a QSGD-quantized vector as in QSGD §3.1.

  Args:
    norm: ``||v||_2`` (stored as float32).
    q: integer array (any shape, flattened) of signed levels
      ``sgn(v_i) · s · ξ_i(v, s)``; zeros are skipped.

  Returns:
    An :class:`EliasMessage`; ``num_bits == qsgd_message_bits(q)``.
  """
  gaps, neg, levels, _ = _split_levels(q)
  norm_bits = np.array([np.float32(norm)]).view(np.uint32).astype(_U64)
  if gaps.size == 0:
    return EliasMessage(*write_fields(norm_bits, np.array([_NORM_BITS])))
  gv, gw = _omega_fields(gaps)
  lv, lw = _omega_fields(levels)
  vals = np.concatenate([gv, neg.astype(_U64)[:, None], lv], axis=1)
  wids = np.concatenate([gw, np.ones((gaps.size, 1), np.int64), lw], axis=1)
  return EliasMessage(*write_fields(
      np.concatenate([norm_bits, vals.reshape(-1)]),
      np.concatenate([[_NORM_BITS], wids.reshape(-1)])))


def qsgd_decode(data: Any, num_bits: int, n: int) -> tuple[np.float32, np.ndarray]:
  """Decodes a QSGD message.

  Args:
    data: the message bytes.
    num_bits: its exact length in bits.
    n: the vector length.

  Returns:
    ``(norm, q)``: the float32 norm and ``int64[n]`` signed levels.

  Raises:
    ValueError: on a truncated or corrupted message (length/padding mismatch,
      a code running past ``num_bits``, a position beyond ``n``).
  """
  n = int(n)
  if n < 0:
    raise ValueError(f"qsgd_decode: n must be >= 0, got {n}")
  data = _check_data(data, num_bits, "qsgd_decode")
  end = int(num_bits)
  if end < _NORM_BITS:
    raise ValueError(f"qsgd_decode: a message has at least {_NORM_BITS} bits "
                     f"(the norm), got {end}; truncated stream")
  reader = BitReader(data)
  norm = np.array([reader.read(np.array([0]), 32)[0]]).astype(
      np.uint32).view(np.float32)[0]
  q = np.zeros((n,), np.int64)
  if end == _NORM_BITS:
    return norm, q
  ends = _omega_ends(reader, end)
  # Record = Elias(gap), sign bit, Elias(level); where one starting at p ends.
  size = end + 3
  sign_at = ends[:end]
  level_at = np.minimum(sign_at + 1, end + 1)
  rec = np.full((size,), end + 1, np.int64)
  rec[end] = end
  rec[:end] = np.where(sign_at + 1 < end, ends[level_at], end + 1)
  starts, stop = follow_chain(rec, _NORM_BITS, end)
  if stop != end:
    last = int(starts[-1]) if starts.size else _NORM_BITS
    raise ValueError(
        f"qsgd_decode: Elias stream ends mid-code: the record starting at "
        f"bit {last} (record {starts.size - 1}) runs past bit {end} "
        "(truncated or corrupted stream)")
  gaps = _omega_scan(reader, starts, end)[1].astype(np.int64)
  signs = reader.bits(sign_at[starts])
  levels = _omega_scan(reader, sign_at[starts] + 1, end)[1].astype(np.int64)
  pos = np.cumsum(gaps) - 1
  if pos.size and pos[-1] >= n:
    raise ValueError(f"qsgd_decode: nonzero at position {int(pos[-1])} >= "
                     f"n = {n} (corrupted stream or wrong n)")
  q[pos] = np.where(signs == 1, -levels, levels)
  return norm, q
