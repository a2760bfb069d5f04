"""Dense bit packing: 1-bit signs and ``w``-bit unsigned codes in ``uint8``.

One place for every compressor that sends a fixed number of bits per element:
signSGD / EF-SignSGD and 1-bit SGD (one sign bit per element, eight per byte)
and QSGD (``w = ceil(log2(2s + 1))`` bits per element).

Bit layout (fixed, and tested against NumPy's ``packbits``):

* the codes form one little-endian bit stream: bit ``t`` of code ``i``
  (``t = 0`` the least significant) is stream bit ``i*w + t``;
* stream bit ``q`` is bit ``q mod 8`` (LSB first) of byte ``q // 8``, i.e.
  ``np.packbits(bits, bitorder="little")``; for ``w = 1`` this is
  ``np.packbits(b, bitorder="little")`` of the booleans themselves;
* the stream is zero-padded to a whole byte and nothing more, so ``n`` codes
  take exactly ``ceil(n*w / 8)`` bytes (:func:`packed_size`).

Internally eight codes at a time fill ``w`` whole bytes; every output byte is
an OR of at most ``ceil(8/w) + 1`` shifted codes, all static, so XLA fuses a
pack or unpack into one loop. Codes of up to 8 bits are shifted in ``uint8``
(wider shifts would be masked off anyway), wider ones in ``uint32``.

All functions are pure ``jax.numpy``, jit-able and usable inside a caller's
``jit``/``vmap``/``shard_map``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxcomp.codecs._common import as_flat_uint8, ceil_div, check_length

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


def pack_uint(codes: Any, width: int) -> jax.Array:
  """Packs unsigned ``width``-bit codes densely (see the module docstring).

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
  groups = ceil_div(n, 8)
  dt = _work_dtype(width)
  c = jnp.pad(flat.astype(dt), (0, 8 * groups - n)).reshape(groups, 8)
  out = []
  for k in range(width):  # output byte k of each group holds stream bits 8k .. 8k+7
    acc = None
    for j in range(8):  # code j holds stream bits j*w .. j*w+w-1
      lo, hi = j * width, (j + 1) * width
      if hi <= 8 * k or lo >= 8 * k + 8:
        continue
      shift = lo - 8 * k
      part = c[:, j] << dt(shift) if shift >= 0 else c[:, j] >> dt(-shift)
      acc = part if acc is None else acc | part
    out.append(acc if dt == jnp.uint8 else (acc & dt(0xFF)).astype(jnp.uint8))
  stream = jnp.stack(out, axis=1).reshape(-1)
  return stream[: ceil_div(n * width, 8)]


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
  groups = ceil_div(n, 8)
  dt = _work_dtype(width)
  by = jnp.pad(b, (0, groups * width - b.shape[0])).reshape(groups, width).astype(dt)
  mask = dt((1 << width) - 1)
  cols = []
  for j in range(8):
    lo, hi = j * width, (j + 1) * width
    acc = None
    for k in range(lo // 8, ceil_div(hi, 8)):
      shift = lo - 8 * k
      part = by[:, k] >> dt(shift) if shift >= 0 else by[:, k] << dt(-shift)
      acc = part if acc is None else acc | part
    cols.append(acc & mask if width < 8 * jnp.dtype(dt).itemsize else acc)
  return jnp.stack(cols, axis=1).reshape(-1)[:n]


def pack_bits(bits: Any) -> jax.Array:
  """Packs booleans eight per byte, LSB first (``np.packbits(..., bitorder="little")``).

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
