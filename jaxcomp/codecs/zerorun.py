"""Zero-run encoding of base-3^5 bytes (3LC §3.3).

Base-3^5 encoding (:mod:`jaxcomp.codecs.base243`) maps five zero values to the
byte 121 and only produces bytes 0–242. Zero-run encoding (Lim et al., MLSys
2019, §3.3) replaces a run of ``k`` consecutive 121 bytes, ``2 <= k <= 14``,
by the single byte ``243 + (k - 2)`` (244 … 255 are therefore free of
collisions with base-3^5 bytes).

Semantics fixed here (the paper leaves longer runs open):

* a run longer than 14 is cut **greedily from its start** into pieces of 14
  (byte 255 each); the remainder ``r = k mod 14`` is coded the same way:
  ``r >= 2`` → byte ``241 + r``, ``r == 1`` → the literal byte 121, ``r == 0``
  → nothing;
* every other byte is copied.

Decoding expands a byte ``c >= 243`` to ``c - 241`` bytes of 121 and copies the
rest. The encoding never expands its input, so the worst case output length
equals the input length.

Implementations here:

* :func:`zero_run_encode_jax` / :func:`zero_run_decode_jax`: jit-able,
  vectorized JAX (no loop over bytes). The encoder returns a buffer of the
  input's (static) length plus the used length; bytes past the length are 0.
  Run positions come from one 32-bit mask per row of 32 bytes (``clz``,
  ``ctz``, ``popcount``) plus a scan over the row array, then one scatter
  compacts the emitted bytes; decoding uses SWAR prefix sums of the byte
  counts and scatters the literal bytes into a buffer of 121s (see
  :mod:`jaxcomp.codecs._common` for why: a full-length int32 ``cumsum`` is
  several times slower on CPU).
* :func:`zero_run_encode` / :func:`zero_run_decode`: host wrappers returning
  exact variable-length NumPy arrays (inputs are padded to power-of-two
  buckets to bound recompilation; a pad of literal 0 bytes at the end cannot
  join a run, so it is simply cut off again).
* :func:`zero_run_encode_partitioned`: the parallel form sketched in §3.3.
* :func:`zero_run_pack_fixed` / :func:`zero_run_unpack_fixed`: the
  capacity-bounded, static-shape wire format (see its docstring for the
  intended fallback).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcomp.codecs._common import (ROW, as_flat_uint8, bit_length32,
                                    bucket, ceil_div, check_length, ctz32,
                                    exclusive_cumsum_i32, host_bytes,
                                    per_segment, row_bit_planes,
                                    row_masks, scan_1d, scatter_1d)

__all__ = [
    "MAX_RUN",
    "RUN_BYTE",
    "ZeroRunPacked",
    "zero_run_capacity",
    "zero_run_decode",
    "zero_run_decode_checked",
    "zero_run_decode_jax",
    "zero_run_encode",
    "zero_run_encode_checked",
    "zero_run_encode_jax",
    "zero_run_encode_partitioned",
    "zero_run_expanded_length",
    "zero_run_length",
    "zero_run_lengths",
    "zero_run_pack_fixed",
    "zero_run_unpack_fixed",
]

RUN_BYTE = 121
"""The base-3^5 byte of five zero values."""
MAX_RUN = 14
"""Longest run one byte codes: 243 + (14 - 2) = 255."""
_FIRST_CODE = 243


# --------------------------------------------------------------------------
# JAX core
# --------------------------------------------------------------------------


def _plan(b: jax.Array):
  """Per byte: the value it emits and whether it emits.

  Returns 1-D ``(val, emit, n_padded)``. The input is padded to whole rows of
  32 bytes with literal 0 bytes, which emit themselves and cannot join a run.

  For a 121 byte at index ``i`` in a run that starts at ``s`` and ends at
  ``e`` (inclusive), the greedy cut emits, where ``(i - s) % 14 == 0``, the
  code of ``min(14, e - i + 1)`` 121s. With one mask per row of the bytes that
  are *not* 121, ``i - s`` inside a row is a ``clz`` and ``e - i`` a ``ctz``;
  a run entering a row from the left needs its length mod 14, from a max-scan
  over rows; a run leaving to the right needs at most 14 more bytes, which
  the next row's mask alone decides (rows are longer than 14).
  """
  w = ROW
  n = b.shape[0]
  rows = ceil_div(n, w)
  npad = rows * w
  bp = jnp.pad(b, (0, npad - n))
  run = bp == RUN_BYTE
  lane = lax.iota(jnp.uint32, npad) & jnp.uint32(w - 1)
  ones = jnp.uint32(0xFFFFFFFF)
  upto = ones >> (jnp.uint32(w - 1) - lane)  # bits 0..lane
  from_here = ones << lane  # bits lane..31

  other = row_masks(~run)  # bit j: byte j of the row is not 121
  other_b = per_segment(other, w)
  m = bit_length32(other_b & upto)  # 1 + lane of last non-121 <= lane, or 0
  f = ctz32(other_b & from_here)  # lane of first non-121 >= lane, or 32

  # Length (mod 14) of the run of 121s that enters each row from the left.
  row_base = jnp.arange(rows, dtype=jnp.int32) * w
  row_last = bit_length32(other).astype(jnp.int32)
  # 1 + global index of the last non-121 byte before each row (0 if none).
  last_before = scan_1d(jnp.where(row_last > 0, row_base + row_last, 0),
                        lax.max, 0, exclusive=True)
  entering = row_base - last_before
  carry = per_segment((entering % MAX_RUN).astype(jnp.uint32), w)
  offset = jnp.where(m == 0, (lane + carry) % MAX_RUN,
                     (lane - m) % MAX_RUN)  # (i - s) mod 14

  # 121s continuing into the next row (at most 14 matter; past the end: 0).
  next_other = jnp.concatenate([other[1:], jnp.ones((1,), jnp.uint32)])
  spill = per_segment(jnp.minimum(ctz32(next_other), MAX_RUN), w)
  ahead = jnp.minimum(f - lane + jnp.where(f == w, spill, 0), MAX_RUN)

  run_code = jnp.where(ahead == 1, jnp.uint32(RUN_BYTE),
                       ahead + (_FIRST_CODE - 2)).astype(jnp.uint8)
  val = jnp.where(run, run_code, bp)
  emit = (~run) | (offset == 0)
  return val, emit, npad


def _compact(val, emit, out_size: int):
  """Scatters emitted bytes to their output positions; returns (buf, count).

  Bytes that do not emit go to the scatter's spare slot (see
  :func:`scatter_1d`). Letting them rewrite their piece's slot instead (as
  the decoder does) needs the piece's code in every byte, which made the
  fused kernels recompute the run offsets and measured slower.
  """
  w = ROW
  lane = lax.iota(jnp.uint32, val.shape[0]) & jnp.uint32(w - 1)
  mask = row_masks(emit)
  mask_b = per_segment(mask, w)
  before = lax.population_count(mask_b & ~(jnp.uint32(0xFFFFFFFF) << lane))
  row_tot = lax.population_count(mask).astype(jnp.int32)
  pos = per_segment(exclusive_cumsum_i32(row_tot), w) + before.astype(jnp.int32)
  pos = jnp.where(((mask_b >> lane) & 1) == 1, pos, out_size)
  return scatter_1d(out_size, 0, pos, val, spare_slot=True), jnp.sum(row_tot)


@functools.partial(jax.jit, static_argnums=1)
def _encode_core(b: jax.Array, out_size: int):
  n = b.shape[0]
  if n == 0:
    return jnp.zeros((out_size,), jnp.uint8), jnp.int32(0)
  val, emit, npad = _plan(b)
  buf, count = _compact(val, emit, out_size)
  return buf, count - (npad - n)


@jax.jit
def _length_core(b: jax.Array) -> jax.Array:
  n = b.shape[0]
  if n == 0:
    return jnp.int32(0)
  _, emit, npad = _plan(b)
  return jnp.sum(emit, dtype=jnp.int32) - (npad - n)


@functools.partial(jax.jit, static_argnums=2)
def _decode_core(z: jax.Array, length: jax.Array, n_out: int):
  """Expands ``z[:length]``; returns (``uint8[n_out]``, expanded length).

  Each byte expands to ``count`` bytes (a code ``c >= 243`` to ``c - 241``
  121s, a literal to itself), and a literal lands at the sum of the counts
  before it. Inside a row of 32 bytes that sum is ``popcount`` arithmetic on
  row masks: ``count = 1 + extra`` with ``extra = c - 242`` in 0..13 for a
  code, so the sum is the number of earlier bytes plus ``sum_b 2**b *
  popcount(mask of bit b of extra, below this byte)``. Rows are joined with
  :func:`scan_1d`. Literals are then scattered into a buffer of 121s.
  """
  w = ROW
  c = z.shape[0]
  length = jnp.asarray(length, jnp.int32)
  if c == 0:
    return jnp.full((n_out,), RUN_BYTE, jnp.uint8), jnp.int32(0)
  cp = ceil_div(c, w) * w
  zp = jnp.pad(z, (0, cp - c))
  valid = lax.iota(jnp.int32, cp) < length
  is_code = zp >= _FIRST_CODE
  extra = jnp.where(valid & is_code, zp - jnp.uint8(_FIRST_CODE - 1),
                    jnp.uint8(0))  # 0..13
  # Bit plane 0: valid byte (weight 1); planes 1..4: bits 0..3 of extra.
  masks = row_bit_planes(valid.astype(jnp.uint8) | (extra << 1), 5)
  weights = (1, 1, 2, 4, 8)
  lane = lax.iota(jnp.uint32, cp) & jnp.uint32(w - 1)
  below = ~(jnp.uint32(0xFFFFFFFF) << lane)
  row_tot = sum(wt * lax.population_count(mk).astype(jnp.int32)
                for wt, mk in zip(weights, masks))
  start = per_segment(exclusive_cumsum_i32(row_tot), w)
  for wt, mk in zip(weights, masks):
    start = start + wt * lax.population_count(per_segment(mk, w) & below).astype(
        jnp.int32)
  # Output bytes not written by a literal lie inside a run: 121. A run code
  # writes 121 at its own start (harmless); bytes past ``length`` expand to
  # nothing and all target slot ``total``, at the end (dropped when valid).
  out = scatter_1d(n_out, RUN_BYTE, start,
                   jnp.where(is_code, jnp.uint8(RUN_BYTE), zp))
  return out, jnp.sum(row_tot)


@functools.partial(jax.jit, static_argnums=1)
def _lengths_core(b: jax.Array, starts: tuple[int, ...]) -> jax.Array:
  """Every segment's zero-run length (see :func:`zero_run_lengths`): int32 ``(len(starts),)``.

  A byte emits unless it is a 121 inside a run at an offset from the run's
  start that is not a multiple of 14 (the greedy cut). A run starts at a 121
  whose left neighbour is not a 121 or that begins a segment: with one mask
  per row of 32 bytes, the run starts are ``R & ~((R << 1 | carry) & ~B)``
  (``R`` the 121s, ``B`` the segments' first bytes), the last start at or
  before a byte is a ``clz``, or, for a run entering the row, a max-scan over
  rows. A segment's length is the difference of the emits' prefix counts at
  its ends: row totals scanned, plus a ``popcount`` inside the row.
  """
  w = ROW
  n = b.shape[0]
  rows = max(1, ceil_div(n, w))
  npad = rows * w
  bp = jnp.pad(b, (0, npad - n))  # literal 0 bytes: they end runs and are not counted (below)
  run = bp == RUN_BYTE
  lane = lax.iota(jnp.uint32, npad) & jnp.uint32(w - 1)
  upto = jnp.uint32(0xFFFFFFFF) >> (jnp.uint32(w - 1) - lane)  # bits 0..lane

  r = row_masks(run)
  first = np.unique(np.asarray([s for s in starts if s < n], np.int64))  # distinct bits: adding is or-ing
  bounds = jnp.zeros((rows,), jnp.uint32).at[first // w].add(
      jnp.asarray(np.uint32(1) << (first % w).astype(np.uint32)), indices_are_sorted=True, unique_indices=False)
  carry = jnp.concatenate([jnp.zeros((1,), jnp.uint32), r[:-1] >> jnp.uint32(w - 1)])
  begins = r & ~(((r << jnp.uint32(1)) | carry) & ~bounds)  # bit j: a run starts at byte j
  row_base = jnp.arange(rows, dtype=jnp.int32) * w
  last = bit_length32(begins).astype(jnp.int32)  # 1 + lane of the row's last run start, or 0
  last_before = scan_1d(jnp.where(last > 0, row_base + last, 0), lax.max, 0, exclusive=True)
  m = bit_length32(per_segment(begins, w) & upto).astype(jnp.int32)  # 1 + lane of the last start <= lane
  index = lax.iota(jnp.int32, npad)
  offset = jnp.where(m > 0, lane.astype(jnp.int32) - (m - 1), index - (per_segment(last_before, w) - 1))
  emit = (~run | (offset % MAX_RUN == 0)) & (index < n)
  e = row_masks(emit)
  before = exclusive_cumsum_i32(lax.population_count(e))
  ends = np.asarray(list(starts[1:]) + [n], np.int64)
  def prefix(p):  # emits before byte p (p <= n)
    row = np.minimum(p // w, rows - 1)
    below = np.where(p // w < rows, (np.uint64(1) << (p % w).astype(np.uint64)) - 1, 0xFFFFFFFF).astype(np.uint32)
    return before[row] + lax.population_count(e[row] & jnp.asarray(below)).astype(jnp.int32)

  return prefix(ends) - prefix(np.asarray(starts, np.int64))


# --------------------------------------------------------------------------
# Public jit-able API
# --------------------------------------------------------------------------


def zero_run_encode_jax(b: Any) -> tuple[jax.Array, jax.Array]:
  """Zero-run-encodes base-3^5 bytes with static shapes (jit-able).

  Args:
    b: ``uint8[N]`` base-3^5 bytes (values 0–242; not checked on this
      traceable path, see :func:`zero_run_encode_checked`).

  Returns:
    ``(buffer, length)``: ``buffer`` is ``uint8[N]`` (the worst case) whose
    first ``length`` bytes are the encoding and the rest 0; ``length`` is an
    int32 scalar, the exact ``encoded_bytes``.
  """
  b = as_flat_uint8(b, "zero_run_encode_jax")
  return _encode_core(b, b.shape[0])


def zero_run_length(b: Any) -> jax.Array:
  """Exact zero-run encoded size in bytes (int32, jit-able, no compaction).

  This is the ``encoded_bytes`` accounting figure; it equals the ``length``
  that :func:`zero_run_encode_jax` returns.
  """
  return _length_core(as_flat_uint8(b, "zero_run_length"))


def zero_run_lengths(b: Any, starts: Any) -> jax.Array:
  """Every segment's exact zero-run size, as if each were encoded alone (int32, jit-able).

  Segment ``i`` is ``b[starts[i]:starts[i + 1]]`` (the last runs to the end):
  a bucket's base-3^5 bytes, every tensor's laid end to end
  (:meth:`jaxcomp.exchange.layout.Layout.compact`). Runs do not cross a segment's start,
  so ``zero_run_lengths(b, starts)[i] == zero_run_length(b[starts[i]:starts[i + 1]])``,
  in one pass over the bucket instead of a kernel a tensor.

  Args:
    b: ``uint8[N]`` base-3^5 bytes, ``N < 2**31``.
    starts: static, non-decreasing segment starts with ``starts[0] == 0``
      (empty segments are allowed).

  Returns:
    ``int32[len(starts)]``.
  """
  b = as_flat_uint8(b, "zero_run_lengths")
  starts = tuple(int(s) for s in np.asarray(starts, np.int64).reshape(-1))
  if not starts or starts[0] != 0 or any(a > c for a, c in zip(starts, starts[1:])) or starts[-1] > b.shape[0]:
    raise ValueError(f"zero_run_lengths: starts must be non-decreasing from 0 to at most {b.shape[0]}; got "
                     f"{starts[:8]}{' ...' if len(starts) > 8 else ''}")
  if b.shape[0] >= 2**31:
    raise ValueError(f"zero_run_lengths: {b.shape[0]} bytes; its int32 positions hold fewer than 2**31")
  return _lengths_core(b, starts)


def zero_run_decode_jax(z: Any, length: Any,
                        n_out: int) -> tuple[jax.Array, jax.Array]:
  """Expands a zero-run buffer with static shapes (jit-able).

  Args:
    z: ``uint8[C]`` buffer whose first ``length`` bytes are a zero-run
      encoding (bytes past ``length`` are ignored).
    length: int scalar (may be traced), ``0 <= length <= C``.
    n_out: static number of base-3^5 bytes the encoding expands to.

  Returns:
    ``(bytes, ok)``: ``uint8[n_out]`` and a bool scalar that is False when
    the stream does not expand to exactly ``n_out`` bytes or ``length`` is
    out of range (the bytes are then meaningless). Host code can raise on
    ``ok``; :func:`zero_run_decode_checked` does.
  """
  n_out = check_length(n_out, "n_out")
  z = as_flat_uint8(z, "zero_run_decode_jax")
  length = jnp.asarray(length, jnp.int32)
  out, total = _decode_core(z, length, n_out)
  ok = (total == n_out) & (length >= 0) & (length <= z.shape[0])
  return out, ok


# --------------------------------------------------------------------------
# Capacity-bounded wire format
# --------------------------------------------------------------------------


class ZeroRunPacked(NamedTuple):
  """Static-shape zero-run payload.

  Attributes:
    buffer: ``uint8[capacity]``; the run-coded bytes when ``fits``, else all
      zeros.
    length: int32, the exact run-coded length (also when it does not fit, so
      that ``encoded_bytes`` can be reported either way).
    fits: bool, ``length <= capacity``.
  """

  buffer: jax.Array
  length: jax.Array
  fits: jax.Array


def zero_run_capacity(n_values: int, fraction: float) -> int:
  """Capacity in bytes for a fraction of the base-3^5 size of ``n_values``.

  ``ceil(fraction * ceil(n_values / 5))``, at least 1 when ``n_values > 0``.
  """
  n_values = check_length(n_values, "n_values")
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must be in (0, 1], got {fraction}")
  size = ceil_div(n_values, 5)
  if size == 0:
    return 0
  return max(1, int(np.ceil(fraction * size)))


def zero_run_pack_fixed(b: Any, capacity: int) -> ZeroRunPacked:
  """Zero-run-encodes ``b`` into a fixed ``capacity``-byte buffer (jit-able).

  This is 3LC's zero-run stage made static-shape, so that the bytes the
  collective moves really shrink: the wire carries ``uint8[capacity]`` plus
  the int32 ``length`` (and ``fits``), with ``capacity`` a configurable
  fraction of the base-3^5 size (:func:`zero_run_capacity`).

  Intended fallback (implemented by the 3LC compressor, not here): when
  ``fits`` is False the run-coded tensor did not fit and the buffer holds
  nothing useful, so the worker must send its plain base-3^5 bytes instead.
  A static-shape way to do that is a second, full-size ``uint8[ceil(n/5)]``
  payload that is exchanged only when some worker's ``fits`` is False (the
  gathered ``fits`` flags are identical on every worker, so all workers take
  the same branch, e.g. of a ``lax.cond`` around the second collective), and
  is counted in the metrics as a fallback together with its bytes on the
  wire. :func:`zero_run_unpack_fixed` decodes the buffer when ``fits``.

  Args:
    b: ``uint8[N]`` base-3^5 bytes.
    capacity: static buffer size in bytes (>= 0).

  Returns:
    A :class:`ZeroRunPacked`.
  """
  capacity = check_length(capacity, "capacity")
  b = as_flat_uint8(b, "zero_run_pack_fixed")
  buf, length = _encode_core(b, capacity)
  fits = length <= capacity
  buf = jnp.where(fits, buf, jnp.zeros_like(buf))
  return ZeroRunPacked(buf, length.astype(jnp.int32), fits)


def zero_run_unpack_fixed(buffer: Any, length: Any,
                          n_bytes_out: int) -> jax.Array:
  """Inverse of :func:`zero_run_pack_fixed` when ``fits`` (jit-able).

  Args:
    buffer: ``uint8[capacity]`` from :func:`zero_run_pack_fixed`.
    length: its int32 ``length``.
    n_bytes_out: static number of base-3^5 bytes, ``ceil(n_values / 5)``.

  Returns:
    ``uint8[n_bytes_out]`` base-3^5 bytes. Meaningless if the payload did not
    fit; use :func:`zero_run_decode_jax` to also get a validity flag.
  """
  out, _ = zero_run_decode_jax(buffer, length, n_bytes_out)
  return out


# --------------------------------------------------------------------------
# Host wrappers (exact variable-length NumPy arrays)
# --------------------------------------------------------------------------


def _run_lengths(e: np.ndarray) -> np.ndarray:
  """Number of 121s each zero-run byte stands for (0 for other bytes)."""
  e = e.astype(np.int64)
  return np.where(e >= _FIRST_CODE, e - (_FIRST_CODE - 2),
                  (e == RUN_BYTE).astype(np.int64))


def zero_run_expanded_length(z: Any) -> int:
  """Number of bytes a zero-run stream expands to (host)."""
  a = host_bytes(z, "zero_run_expanded_length")
  return int(np.sum(np.where(a >= _FIRST_CODE, a.astype(np.int64) - 241, 1)))


def zero_run_encode(b: Any) -> np.ndarray:
  """Zero-run-encodes base-3^5 bytes; returns the exact encoding (host).

  Runs the jitted encoder on the input padded with literal 0 bytes to a
  power-of-two bucket, then drops the pad.

  Args:
    b: 1-D uint8 array (NumPy or JAX) of base-3^5 bytes.

  Returns:
    ``np.uint8`` array of the exact encoded length.
  """
  a = host_bytes(b, "zero_run_encode")
  n = a.shape[0]
  if n == 0:
    return np.zeros((0,), np.uint8)
  nb = bucket(n)
  padded = np.zeros((nb,), np.uint8)
  padded[:n] = a
  buf, length = _encode_core(jnp.asarray(padded), nb)
  used = int(length) - (nb - n)
  return np.asarray(buf[:used]).copy()


def zero_run_encode_checked(b: Any) -> np.ndarray:
  """:func:`zero_run_encode` after checking the input is base-3^5 (< 243).

  Raises:
    ValueError: naming the first byte >= 243.
  """
  a = host_bytes(b, "zero_run_encode_checked")
  bad = np.flatnonzero(a >= _FIRST_CODE)
  if bad.size:
    i = int(bad[0])
    raise ValueError(
        f"zero_run_encode_checked: byte {i} is {int(a[i])} >= 243; the input "
        "must be base-3^5 bytes (0..242)")
  return zero_run_encode(a)


def zero_run_decode(z: Any) -> np.ndarray:
  """Expands a zero-run stream to base-3^5 bytes (host).

  Args:
    z: 1-D uint8 array, the exact encoding (every byte is meaningful).

  Returns:
    ``np.uint8`` array of the expanded bytes.
  """
  a = host_bytes(z, "zero_run_decode")
  total = zero_run_expanded_length(a)
  c = a.shape[0]
  if c == 0:
    return np.zeros((0,), np.uint8)
  cb, tb = bucket(c), bucket(total)
  padded = np.zeros((cb,), np.uint8)
  padded[:c] = a
  out, got = _decode_core(jnp.asarray(padded), jnp.int32(c), tb)
  if int(got) != total:  # cannot happen unless the kernel is wrong
    raise AssertionError(f"zero-run kernel expanded {int(got)}, expected {total}")
  return np.asarray(out[:total]).copy()


def zero_run_decode_checked(z: Any, n_out: int) -> np.ndarray:
  """:func:`zero_run_decode` that insists on the expected output length.

  Args:
    z: the exact encoding.
    n_out: expected number of base-3^5 bytes, ``ceil(n_values / 5)``.

  Raises:
    ValueError: if the stream expands to a different length (truncated or
      corrupted stream, or wrong ``n_out``).
  """
  n_out = check_length(n_out, "n_out")
  a = host_bytes(z, "zero_run_decode_checked")
  total = zero_run_expanded_length(a)
  if total != n_out:
    raise ValueError(
        f"zero_run_decode_checked: the {a.shape[0]}-byte zero-run stream "
        f"expands to {total} bytes, expected {n_out}; truncated or corrupted "
        "stream")
  return zero_run_decode(a)


# --------------------------------------------------------------------------
# Partitioned (parallel) encoding, 3LC §3.3
# --------------------------------------------------------------------------


def _encode_run(k: int) -> np.ndarray:
  """Greedy serial encoding of a single run of ``k`` 121 bytes."""
  full, rem = divmod(int(k), MAX_RUN)
  tail = [] if rem == 0 else [RUN_BYTE] if rem == 1 else [_FIRST_CODE + rem - 2]
  return np.array([_FIRST_CODE + MAX_RUN - 2] * full + tail, np.uint8)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _encode_partitions(b: jax.Array, parts: int, size: int):
  return jax.vmap(lambda p: _encode_core(p, size))(b.reshape(parts, size))


def zero_run_encode_partitioned(b: Any, num_partitions: int) -> np.ndarray:
  """The parallel zero-run encoder sketched in 3LC §3.3 (host driver).

  The input is cut into ``num_partitions`` contiguous partitions of
  ``ceil(N / num_partitions)`` bytes (the last ones shorter or empty), all
  partitions are encoded independently by the serial kernel under ``vmap``,
  and the results are coalesced at the boundaries.

  Coalescing must reproduce the *greedy* serial output exactly. Merging the
  two boundary bytes when their runs sum to 2..14, as §3.3 sketches, is not
  enough: e.g. a partition ending in 247 (a run of 6) followed by one starting
  with 250 (9) is the run 15, which the serial encoder writes as 255, 121. So
  the run bytes (121 and 243–255) at the end of the stream so far and at the
  start of the next partition are summed into one run length and re-cut
  greedily; a partition made only of run bytes extends the pending run. The
  loop is over partitions, never over bytes. Full 255 pieces ahead of the
  pending run are the serial encoder's own greedy cut, so re-encoding them is
  a no-op and the result equals :func:`zero_run_encode` byte for byte.

  Args:
    b: 1-D uint8 base-3^5 bytes.
    num_partitions: number of partitions (>= 1).

  Returns:
    ``np.uint8`` array equal to ``zero_run_encode(b)``.
  """
  a = host_bytes(b, "zero_run_encode_partitioned")
  if isinstance(num_partitions, bool) or int(num_partitions) < 1:
    raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
  n = a.shape[0]
  if n == 0:
    return np.zeros((0,), np.uint8)
  parts = int(num_partitions)
  size = ceil_div(n, parts)
  real = np.clip(n - size * np.arange(parts), 0, size)  # bytes per partition
  # Bucket the partition count and size to bound recompiles: every partition
  # is padded at its own end with literal 0 bytes (which cannot join a run
  # and are cut off its output again), extra partitions are all padding.
  parts_b, size_b = bucket(parts, 1), bucket(size, 64)
  mat = np.zeros((parts_b, size_b), np.uint8)
  col = np.arange(size_b)[None, :]
  inside = col < real[:, None]
  mat[:parts][inside] = a[(size * np.arange(parts)[:, None] + col)[inside]]
  bufs, lens = _encode_partitions(jnp.asarray(mat.reshape(-1)), parts_b,
                                  size_b)
  bufs, lens = np.asarray(bufs), np.asarray(lens) - (size_b - np.pad(
      real, (0, parts_b - parts)))

  pieces: list[np.ndarray] = []
  pending = 0  # length of the run of 121s not yet written
  for k in range(parts):
    e = bufs[k, :lens[k]]
    is_run_byte = (e == RUN_BYTE) | (e >= _FIRST_CODE)
    literal = np.flatnonzero(~is_run_byte)
    if literal.size == 0:  # the whole partition continues the pending run
      pending += int(_run_lengths(e).sum())
      continue
    first, last = int(literal[0]), int(literal[-1])
    pending += int(_run_lengths(e[:first]).sum())
    pieces.append(_encode_run(pending))
    pieces.append(e[first:last + 1])
    pending = int(_run_lengths(e[last + 1:]).sum())
  pieces.append(_encode_run(pending))
  return np.concatenate(pieces)
