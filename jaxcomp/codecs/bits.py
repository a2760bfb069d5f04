"""Dense bit packing: 1-bit signs and ``w``-bit unsigned codes in ``uint8``.

One place for every compressor that sends a fixed number of bits per element:
signSGD / EF-SignSGD and 1-bit SGD (one sign bit per element, eight per byte)
and QSGD (``w = ceil(log2(2s + 1))`` bits per element). ``n`` codes of ``w``
bits take exactly ``ceil(n*w / 8)`` bytes (:func:`packed_size`).

Layout (fixed, and tested against a NumPy reference). Write ``n = 8G + r``
with ``0 <= r < 8``:

* **bulk**: the first ``8G`` codes are cut into eight contiguous partitions
  ``P_j = codes[j*G:(j+1)*G]`` (as base-3^5 cuts five, 3LC §3.2). Group ``g``
  is ``(P_0[g], …, P_7[g])``, whose ``8w``-bit little-endian stream is
  ``S_g = Σ_j P_j[g] << (j*w)``. Plane ``k`` (``k = 0 … w-1``) is the ``G``
  bytes ``(S_g >> 8k) & 0xFF``; the bulk is ``plane_0 ‖ … ‖ plane_{w-1}``.
  For ``w = 1``: bit ``j`` (LSB first) of byte ``g`` is code ``j*G + g``.
* **tail**: the last ``r`` codes as one little-endian bit stream (bit ``t`` of
  code ``i`` is stream bit ``i*w + t``; stream bit ``q`` is bit ``q mod 8`` of
  byte ``q // 8``, i.e. ``np.packbits(…, bitorder="little")``), zero-padded
  to a whole byte: ``ceil(r*w / 8)`` bytes.

Why partitions rather than eight consecutive codes per byte: every plane and
every partition is a contiguous slice, so XLA:CPU fuses packing with the
quantizer that produces the codes, and unpacking with the scaling that
consumes them, into vectorised loops with no padding inside the fusion (a
``pad`` of a fused producer, or an interleaved gather, is much slower there;
``docs/benchmarks.md``). Codes of up to 8 bits are
shifted in ``uint8`` (wider shifts would be masked off anyway), wider ones in
``uint32``.

All functions are pure ``jax.numpy``, jit-able and usable inside a caller's
``jit``/``vmap``/``shard_map``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxcomp.codecs._common import as_flat_uint8, ceil_div, check_length, join_parts

__all__ = [
    "MAX_WIDTH",
    "pack_bits",
    "pack_uint",
    "packed_size",
    "unpack_bits",
    "unpack_uint",
]

MAX_WIDTH = 24
"""Widest code :func:`pack_uint` accepts (shifts stay inside ``uint32``)."""


def _check_width(width: Any) -> int:
  if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
    raise ValueError(f"width must be an int in [1, {MAX_WIDTH}]; got {width!r}.")
  return width


def packed_size(n: int, width: int = 1) -> int:
  """Bytes of ``n`` packed ``width``-bit codes: ``ceil(n * width / 8)``."""
  return ceil_div(check_length(n) * _check_width(width), 8)


def _work_dtype(width: int):
  return jnp.uint8 if width <= 8 else jnp.uint32


def _shift(a: jax.Array, shift: int, dt) -> jax.Array:
  """``a << shift`` for ``shift >= 0``, else ``a >> -shift``."""
  return a << dt(shift) if shift >= 0 else a >> dt(-shift)


def _pack_bulk(parts: list, width: int, dt) -> list:
  """Planes of eight equal partitions (the bulk layout)."""
  planes = []
  for k in range(width):  # plane k holds bits 8k .. 8k+7 of every group's stream
    acc = None
    for j in range(8):  # code j of a group holds stream bits j*w .. j*w+w-1
      lo, hi = j * width, (j + 1) * width
      if hi <= 8 * k or lo >= 8 * k + 8:
        continue
      part = _shift(parts[j], lo - 8 * k, dt)
      acc = part if acc is None else acc | part
    planes.append(acc if dt == jnp.uint8 else (acc & dt(0xFF)).astype(jnp.uint8))
  return planes


def _unpack_part(planes, j: int, width: int, dt) -> jax.Array:
  """Partition ``j`` (of eight) back from the planes."""
  lo, hi = j * width, (j + 1) * width
  acc = None
  for k in range(lo // 8, ceil_div(hi, 8)):
    part = _shift(planes[k], 8 * k - lo, dt)
    acc = part if acc is None else acc | part
  return acc & dt((1 << width) - 1) if width < 8 * jnp.dtype(dt).itemsize else acc


def _unpack_bulk(planes: list, width: int, dt) -> list:
  """The eight partitions back from the planes."""
  return [_unpack_part(planes, j, width, dt) for j in range(8)]


def pack_uint(codes: Any, width: int) -> jax.Array:
  """Packs unsigned ``width``-bit codes densely (layout: the module docstring).

  Args:
    codes: integer array of any shape (flattened in C order) with values in
      ``[0, 2**width)``. Higher bits are not checked on this traceable path;
      they would corrupt neighbouring codes.
    width: bits per code, 1 to :data:`MAX_WIDTH` (static).

  Returns:
    ``uint8[ceil(n * width / 8)]``.
  """
  width = _check_width(width)
  flat = jnp.asarray(codes).reshape(-1)
  if not jnp.issubdtype(flat.dtype, jnp.integer) and flat.dtype != jnp.bool_:
    raise TypeError(f"pack_uint expects integer codes; got dtype {flat.dtype}.")
  n = flat.shape[0]
  if width == 8:  # every plane is a partition and the tail is byte-aligned: the bytes are the codes
    return flat.astype(jnp.uint8)
  dt = _work_dtype(width)
  flat = flat.astype(dt)
  g, r = divmod(n, 8)
  out = _pack_bulk([flat[j * g:(j + 1) * g] for j in range(8)], width, dt) if g else []
  if r:  # the tail: r < 8 codes as one group padded with zero codes, cut to ceil(r*w/8) bytes
    tail = jnp.pad(flat[8 * g:], (0, 8 - r))
    planes = _pack_bulk([tail[j:j + 1] for j in range(8)], width, dt)
    out.append(jnp.concatenate(planes)[: ceil_div(r * width, 8)])
  if not out:
    return jnp.zeros((0,), jnp.uint8)
  return jnp.concatenate(out) if len(out) > 1 else out[0]


def unpack_uint(b: Any, width: int, n: int) -> jax.Array:
  """Inverse of :func:`pack_uint`.

  Args:
    b: ``uint8[ceil(n * width / 8)]``.
    width: bits per code (static).
    n: number of codes (static).

  Returns:
    ``uint8[n]`` for ``width <= 8``, else ``uint32[n]``.

  Raises:
    ValueError: if ``len(b)`` is not ``ceil(n * width / 8)``.
  """
  width = _check_width(width)
  n = check_length(n)
  b = as_flat_uint8(b, "unpack_uint")
  if b.shape[0] != ceil_div(n * width, 8):
    raise ValueError(
        f"unpack_uint: {n} codes of {width} bits need {ceil_div(n * width, 8)} bytes, "
        f"got {b.shape[0]} (truncated or wrong n/width)")
  if width == 8:
    return b
  dt = _work_dtype(width)
  g, r = divmod(n, 8)
  by = b.astype(dt)
  # The partitions joined from even-length pieces (join_parts): with an odd g,
  # a plain concatenation is slow on XLA:CPU (see join_parts).
  planes = tuple(by[k * g:(k + 1) * g] for k in range(width))
  out = [join_parts(planes, lambda p, j: _unpack_part(p, j, width, dt), 8 * g, 8)] if g else []
  if r:
    tail = jnp.pad(by[g * width:], (0, width - ceil_div(r * width, 8)))
    out.append(jnp.concatenate(_unpack_bulk([tail[k:k + 1] for k in range(width)], width, dt))[:r])
  if not out:
    return jnp.zeros((0,), dt)
  return jnp.concatenate(out) if len(out) > 1 else out[0]


def pack_bits(bits: Any) -> jax.Array:
  """Packs booleans eight per byte (the ``w = 1`` layout of the module docstring).

  Args:
    bits: boolean (or 0/1 integer) array of any shape, flattened in C order.

  Returns:
    ``uint8[ceil(n / 8)]``; the pad bits of the last byte are 0.
  """
  flat = jnp.asarray(bits).reshape(-1)
  if flat.dtype != jnp.bool_:
    flat = flat != 0
  return pack_uint(flat.astype(jnp.uint8), 1)


def unpack_bits(b: Any, n: int) -> jax.Array:
  """Inverse of :func:`pack_bits`: ``bool[n]``."""
  return unpack_uint(b, 1, n).astype(jnp.bool_)
