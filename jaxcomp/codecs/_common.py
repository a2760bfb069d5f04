"""Private helpers shared by the codecs: input checks and fast scans.

The scans exist for speed. On XLA:CPU a full-length ``jnp.cumsum`` of int32
is slow (an associative scan with log2(n) passes whose last, elementwise
stage is fused into every consumer; docs/benchmarks.md), so the zero-run
codec avoids it:

* inside rows of 32 bytes it works on one 32-bit mask per row (bit ``j`` =
  a flag of byte ``j``, built with a multiply that gathers four 0/1 bytes
  into four bits); "last flag at or before this byte" is ``clz``, "first
  flag at or after" is ``ctz`` and "flags up to here" is ``popcount``;
* prefix sums of small byte counts split the counts into bits and add up
  weighted ``popcount`` counts of one mask per bit;
* only the (32 times shorter) array of per-row values goes through a real
  scan, :func:`scan_1d` (a few blocked ``reduce_window`` ops).

Per-byte arrays stay 1-D: XLA:CPU turns a reshape from ``(rows, 32)`` to the
``(n, 1)`` index array of a scatter into a layout-changing copy that does not
vectorize and drags the whole fused producer into a scalar loop.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def as_flat_int(t: Any, name: str) -> jax.Array:
  """Flattens ``t`` after checking that it has an integer dtype.

  Raises:
    TypeError: if ``t`` is not an integer array (floats and bools are refused
      so that a quantizer's float output is never silently truncated).
  """
  t = jnp.asarray(t)
  if not jnp.issubdtype(t.dtype, jnp.integer):
    raise TypeError(
        f"{name} expects an integer array of ternary codes in {{-1, 0, 1}}, "
        f"got dtype {t.dtype}; cast the quantizer's output with "
        "`.astype(jnp.int8)` first")
  return t.reshape(-1)


def as_flat_uint8(b: Any, name: str) -> jax.Array:
  """Checks that ``b`` is a 1-D uint8 array and returns it as a JAX array."""
  b = jnp.asarray(b)
  if b.dtype != jnp.uint8:
    raise TypeError(f"{name} expects a uint8 byte array, got dtype {b.dtype}")
  if b.ndim != 1:
    raise ValueError(f"{name} expects a 1-D byte array, got shape {b.shape}")
  return b


def check_length(n: Any, name: str = "n") -> int:
  """Returns ``n`` as a Python int, or raises for negative / non-integer n."""
  if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
    raise TypeError(
        f"{name} must be a static Python int (the decoded length), got "
        f"{type(n).__name__}")
  n = int(n)
  if n < 0:
    raise ValueError(f"{name} must be >= 0, got {n}")
  return n


def check_ternary(t: Any, name: str = "t") -> np.ndarray:
  """Host-side check that ``t`` holds only values in {-1, 0, 1}.

  Args:
    t: integer array of any shape (concrete, not a tracer).
    name: argument name used in error messages.

  Returns:
    ``t`` as a flat ``np.int8`` array.

  Raises:
    TypeError: if ``t`` is not an integer array.
    ValueError: naming the first offending index and value otherwise.
  """
  a = np.asarray(t)
  if not np.issubdtype(a.dtype, np.integer):
    raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
  a = a.reshape(-1)
  bad = np.flatnonzero((a < -1) | (a > 1))
  if bad.size:
    i = int(bad[0])
    raise ValueError(
        f"{name} must hold ternary values in {{-1, 0, 1}}; found {a[i]} at "
        f"flat index {i} ({bad.size} offending values)")
  return a.astype(np.int8)


def ceil_div(a: int, b: int) -> int:
  return -(-a // b)


def partitions(flat: jax.Array, parts: int, length: int, fill: int = 0) -> list[jax.Array]:
  """``flat`` cut into ``parts`` contiguous pieces of ``length``, the short ones padded with ``fill``.

  Slicing first and padding only the short pieces keeps the pad out of the
  other pieces' reads, which on XLA:CPU slows every piece's loop (the base-3^5
  encoder; docs/benchmarks.md).
  """
  n = flat.shape[0]
  out = []
  for k in range(parts):
    part = flat[min(k * length, n):min((k + 1) * length, n)]
    out.append(part if part.shape[0] == length else
               jnp.pad(part, (0, length - part.shape[0]), constant_values=fill))
  return out


def join_parts(b: Any, digit: Callable[[Any, int], jax.Array], n: int,
               parts: int) -> jax.Array:
  """The first ``n`` values of ``digit(b, 0) ‖ digit(b, 1) ‖ … ‖ digit(b, parts − 1)``.

  The inverse of :func:`partitions` for the planar codecs (2-bit, base-3^5,
  the bulk of :mod:`jaxcomp.codecs.bits`): byte ``j`` of ``b`` holds value
  ``j`` of every part, and ``digit(bytes, k)`` extracts part ``k``'s values
  elementwise. ``b`` is one byte array or a tuple of them (the bit planes of
  wider codes), all ``L`` long; every part is ``L`` long.

  XLA:CPU runs a concatenation much slower when a piece starts at an odd
  offset (docs/benchmarks.md). So when ``L`` is odd, a part that would end at an odd offset keeps back its
  last value, and that value and the next part's first one travel as a
  two-value piece computed from the two bytes alone. Every piece but the last
  then has an even length.
  """
  length = jax.tree.leaves(b)[0].shape[0]
  if n == 0 or length == 0:
    return digit(jax.tree.map(lambda a: a[:0], b), 0)[:0]
  if length % 2:  # the two bytes of every pair: each part's last and the next part's first
    src = jax.tree.map(lambda a: a[jnp.array([length - 1, 0])], b)
    first = jnp.array([True, False])
  pieces, pos = [], 0
  for k in range(parts):
    if pos >= n:
      break
    lo = pos % 2  # an odd start: the value at `pos` went into the previous pair
    pair = (pos + length) % 2 == 1 and k + 1 < parts and pos + length < n
    hi = length - 1 if pair else min(length, n - pos)
    if hi > lo:
      pieces.append(digit(b, k)[lo:hi])
    if pair:
      pieces.append(jnp.where(first, digit(src, k), digit(src, k + 1)))
    pos += length
  return jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def check_byte_count(nbytes: int, n: int, per_byte: int, name: str) -> int:
  """Checks that a stream of ``n`` values, ``per_byte`` to a byte, has ``nbytes`` bytes.

  Returns:
    The expected byte count, ``ceil(n / per_byte)``.

  Raises:
    ValueError: if ``nbytes`` differs (a truncated stream or a wrong ``n``).
  """
  expected = ceil_div(n, per_byte)
  if nbytes != expected:
    raise ValueError(
        f"{name}: {n} values need {expected} bytes, got "
        f"{nbytes} (truncated or wrong n)")
  return expected


def host_bytes(b: Any, name: str) -> np.ndarray:
  """A concrete 1-D uint8 NumPy array, or a clear error."""
  a = np.asarray(b)
  if a.dtype != np.uint8:
    raise TypeError(f"{name} expects uint8 bytes, got dtype {a.dtype}")
  if a.ndim != 1:
    raise ValueError(f"{name} expects a 1-D byte array, got shape {a.shape}")
  return a


def bucket(n: int, minimum: int = 256) -> int:
  """Next power of two >= max(n, minimum): bounds jit recompiles of wrappers."""
  return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def per_segment(v: jax.Array, width: int) -> jax.Array:
  """Repeats each element of ``v`` ``width`` times (1-D)."""
  return jnp.broadcast_to(v[:, None], (v.shape[0], width)).reshape(-1)


def scan_1d(x: jax.Array, op: Callable[[jax.Array, jax.Array], jax.Array],
            identity: Any, exclusive: bool = False) -> jax.Array:
  """Inclusive (or exclusive) scan of a short 1-D array (per-row values).

  Blocked: ``lax.reduce_window`` scans inside blocks of 32, the block totals
  are scanned the same way (recursively), and the carries are added in a
  ``lax.scan`` over 16 chunks of rows.

  That last loop is there for the consumers. Scans built from elementwise
  ops end in an elementwise stage (``jnp.cumsum`` too), which XLA fuses into
  each per-byte consumer, where it is re-evaluated for every byte and stops
  the loop from vectorizing; XLA also rewrites reduce-based tricks back into
  elementwise ops. The output of a loop is a materialized array (the
  zero-run position computation's figures: docs/benchmarks.md).

  Args:
    x: 1-D array.
    op: ``lax.add``, or ``lax.max`` over non-negative values.
    identity: 0 (the identity of both).
    exclusive: whether element ``i`` leaves out ``x[i]`` (the scan of ``x``
      shifted right by one).
  """
  if exclusive and x.shape[0]:
    x = jnp.concatenate([jnp.full((1,), identity, x.dtype), x[:-1]])
  return _scan(x, op, identity, materialize=True)


def _scan(x, op, identity, materialize: bool, width: int = 32, chunks: int = 16):
  n = x.shape[0]
  init = jnp.asarray(identity, x.dtype)
  if n == 0:
    return x
  if n <= 1024:
    return lax.reduce_window(x, init, op, (n,), (1,), [(n - 1, 0)])
  rows = ceil_div(n, width)
  xp = jnp.pad(x, (0, rows * width - n), constant_values=identity)
  blocks = lax.reduce_window(xp.reshape(rows, width), init, op, (1, width),
                             (1, 1), [(0, 0), (width - 1, 0)])
  totals = _scan(blocks[:, -1], op, identity, materialize=False)
  carry = jnp.concatenate([jnp.full((1,), identity, x.dtype), totals[:-1]])
  if not materialize:
    return op(blocks, carry[:, None]).reshape(-1)[:n]
  per = ceil_div(rows, chunks)
  blocks = jnp.pad(blocks, ((0, chunks * per - rows), (0, 0)))
  carry = jnp.pad(carry, (0, chunks * per - rows))
  _, out = lax.scan(lambda c, bc: (c, op(bc[0], bc[1][:, None])), None,
                    (blocks.reshape(chunks, per, width),
                     carry.reshape(chunks, per)))
  return out.reshape(-1)[:n]


def exclusive_cumsum_i32(x: jax.Array) -> jax.Array:
  """Exclusive prefix sum in int32 of a short 1-D array (see :func:`scan_1d`)."""
  return scan_1d(x.astype(jnp.int32), lax.add, 0, exclusive=True)


ROW = 32  # bytes per row of the zero-run kernels: one uint32 mask per row


def row_masks(flags: jax.Array) -> jax.Array:
  """One uint32 per row of 32 flags: bit ``j`` is the flag of byte ``j``.

  Args:
    flags: bool or 0/1 uint8, 1-D, length a multiple of 32.
  """
  words = lax.bitcast_convert_type(flags.astype(jnp.uint8).reshape(-1, 4),
                                   jnp.uint32)  # little-endian: byte k -> bits 8k
  nibbles = (words * jnp.uint32(0x01020408)) >> 24  # byte k -> bit k
  shifts = jnp.arange(8, dtype=jnp.uint32) * 4
  return jnp.sum(nibbles.reshape(-1, 8) << shifts, axis=1, dtype=jnp.uint32)


def row_bit_planes(planes: jax.Array, count: int) -> list[jax.Array]:
  """:func:`row_masks` of bits ``0..count-1`` of uint8 bytes, in one pass.

  Returns ``count`` uint32 arrays, one mask per row for each bit plane (a
  variadic reduction, so the bytes are read once).
  """
  words = lax.bitcast_convert_type(planes.astype(jnp.uint8).reshape(-1, 4),
                                   jnp.uint32)
  shifts = jnp.arange(8, dtype=jnp.uint32) * 4
  parts = []
  for k in range(count):
    nib = (((words >> k) & jnp.uint32(0x01010101)) * jnp.uint32(0x01020408)) >> 24
    parts.append(nib.reshape(-1, 8) << shifts)
  zero = jnp.uint32(0)
  out = lax.reduce(tuple(parts), (zero,) * count,
                   lambda a, b: tuple(x | y for x, y in zip(a, b)), (1,))
  return list(out)


def ctz32(x: jax.Array) -> jax.Array:
  """Count of trailing zero bits of uint32 (32 for 0)."""
  return lax.population_count(~x & (x - jnp.uint32(1)))


def bit_length32(x: jax.Array) -> jax.Array:
  """Bit length of uint32 (0 for 0): 1 + index of the highest set bit."""
  return jnp.uint32(32) - lax.clz(x)


def scatter_1d(size: int, fill: Any, indices: jax.Array, updates: jax.Array,
               spare_slot: bool = False) -> jax.Array:
  """``jnp.full(size, fill).at[indices].set(updates)``, out of range dropped.

  XLA:CPU drops an out-of-range index with a branch per element, which
  mispredicts when kept and dropped elements interleave at random. Callers
  avoid that in one of two ways:

  * every element writes: an element with nothing to write targets a slot
    that another element writes with the same value (the order of duplicate
    writes then does not matter), and the indices past the end form one
    contiguous tail, which predicts perfectly;
  * ``spare_slot=True``: out-of-range indices (the callers' "skip" marker)
    go to a spare slot past the end, dropped with a slice afterwards.

  ``lax.scatter`` is called directly because ``.at[]`` also wraps negative
  indices (a compare and a select per element).
  """
  dnums = lax.ScatterDimensionNumbers(update_window_dims=(),
                                      inserted_window_dims=(0,),
                                      scatter_dims_to_operand_dims=(0,))
  if not spare_slot:
    return lax.scatter(jnp.full((size,), fill, updates.dtype),
                       indices[:, None], updates, dnums,
                       mode=lax.GatherScatterMode.FILL_OR_DROP)
  indices = jnp.where((indices >= 0) & (indices < size), indices, size)
  buf = lax.scatter(jnp.full((size + 1,), fill, updates.dtype),
                    indices[:, None], updates, dnums,
                    mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
  return buf[:size]
