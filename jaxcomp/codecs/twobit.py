"""2-bit packing of ternary codes: TernGrad's wire format.

TernGrad (Wen et al., 2017) sends each gradient element as one of three values
{-1, 0, +1} times a shared scalar; on the wire every element takes two bits,
four elements per byte. 3LC §3.2 points out that this is 26% above the
log2(3) ≈ 1.585-bit minimum; :mod:`jaxcomp.codecs.base243` is the denser
alternative.

Bit layout (decided here, fixed, and tested byte for byte):

* code ``c = t + 1`` ∈ {0, 1, 2} (so -1 → 0b00, 0 → 0b01, +1 → 0b10; the
  code 0b11 is never produced and is rejected by :func:`unpack_2bit_checked`);
* planar, like 3LC's base-3^5 (§3.2): the flattened input is padded with the
  code of 0 (0b01) to ``4m`` elements, ``m = ceil(n / 4)``, and split into four
  equal contiguous planes ``P0..P3`` (plane ``j`` holds elements ``j*m ..
  (j+1)*m - 1``); byte ``k`` is ``P0[k] | P1[k] << 2 | P2[k] << 4 | P3[k] << 6``.
  So element ``i`` sits in bits ``2j .. 2j+1`` of byte ``k`` with
  ``j, k = divmod(i, m)``, and ``pack_2bit([1])`` is ``0b01_01_01_10 = 0x56``.
  Contiguous planes make packing and unpacking plain vector work (unpacking
  an interleaved layout is much slower on XLA:CPU; docs/benchmarks.md).

Both directions are pure ``jax.numpy``, jit-able and usable inside a caller's
``jit``/``vmap``/``shard_map``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxcomp.codecs._common import (as_flat_int, as_flat_uint8, ceil_div,
                                    check_byte_count, check_length,
                                    check_ternary, host_bytes, join_parts,
                                    partitions)

__all__ = [
    "pack_2bit",
    "pack_2bit_checked",
    "packed_2bit_size",
    "unpack_2bit",
    "unpack_2bit_checked",
]

_PAD_CODE = 1  # the code of value 0


def packed_2bit_size(n: int) -> int:
  """Bytes that :func:`pack_2bit` produces for ``n`` values: ``ceil(n / 4)``."""
  return ceil_div(check_length(n), 4)


@jax.jit
def _pack(flat: jax.Array) -> jax.Array:
  n = flat.shape[0]
  m = ceil_div(n, 4)
  codes = (flat.astype(jnp.int8) + 1).astype(jnp.uint8)
  return pack_planes(partitions(codes, 4, m, _PAD_CODE))


def pack_planes(codes: Any) -> jax.Array:
  """Bytes of the codes ``t + 1`` of the four planes: ``codes[k]`` (uint8, any shape) in bits ``2k .. 2k+1``.

  ``codes`` is ``uint8[4, ...]`` or a list of four; plane ``k`` of a tensor is
  its ``k``-th contiguous quarter (the bucket layout of :mod:`jaxcomp.exchange.layout`
  holds them as its planes).
  """
  return codes[0] | (codes[1] << 2) | (codes[2] << 4) | (codes[3] << 6)


def plane(b: jax.Array, k: int) -> jax.Array:
  """The codes ``t + 1`` of plane ``k`` (bits ``2k .. 2k+1``) of every byte of ``b``: :func:`pack_planes` undone."""
  return (b >> (2 * k)) & 3


def unpack_codes(b: jax.Array, n: int) -> jax.Array:
  """The codes ``t + 1`` ∈ {0, 1, 2} (uint8[n]) of a packed stream, unchecked.

  Callers that scale the codes anyway convert these directly, saving a pass.
  """
  return join_parts(b, plane, n, 4)


# Sums of codes over workers, on the packed bytes. A byte's four codes (planes
# 0..3, two bits each) are spread into the four 8-bit lanes of a uint32, so an
# integer sum of spread bytes adds every plane's codes in its own lane: one
# addition per byte instead of four per value, and no unpacked codes per worker.
# A code is at most 2, so a lane holds the sum of up to LANE_WORKERS workers.
LANE_WORKERS = 255 // 2


def spread_lanes(b: jax.Array) -> jax.Array:
  """``b`` (uint8, any shape) as uint32 with byte ``b``'s code of plane ``k`` in bits ``8k .. 8k+1``."""
  w = b.astype(jnp.uint32)
  return (w & 3) | ((w & 0xC) << 6) | ((w & 0x30) << 12) | ((w & 0xC0) << 18)


def lane_planes(s: jax.Array) -> jax.Array:
  """The four planes' lane values (int32) of summed :func:`spread_lanes` words, ``int32[4, ...]``.

  For ``s = Σ_i spread_lanes(b_i)`` over at most :data:`LANE_WORKERS` packed
  streams plane ``k`` equals ``Σ_i plane(b_i, k)`` (as int32), exactly.
  """
  return jnp.stack([((s >> (8 * k)) & 0xFF).astype(jnp.int32) for k in range(4)])


@functools.partial(jax.jit, static_argnums=1)
def _unpack(b: jax.Array, n: int) -> jax.Array:
  return unpack_codes(b, n).astype(jnp.int8) - 1


def pack_2bit(t: Any) -> jax.Array:
  """Packs ternary codes four to a byte (TernGrad's 2-bit wire).

  Args:
    t: integer array (int8 preferred, any integer dtype accepted) of any
      shape, holding values in {-1, 0, 1}; it is flattened in C order.
      Values outside {-1, 0, 1} are not checked here (this path is traced
      into ``jit``); use :func:`pack_2bit_checked` to validate.

  Returns:
    ``uint8[ceil(n / 4)]`` in the layout described in the module docstring.

  Raises:
    TypeError: if ``t`` does not have an integer dtype.
  """
  return _pack(as_flat_int(t, "pack_2bit"))


def unpack_2bit(b: Any, n: int) -> jax.Array:
  """Inverse of :func:`pack_2bit`.

  Args:
    b: ``uint8[ceil(n / 4)]`` as produced by :func:`pack_2bit`.
    n: number of values to return (static Python int).

  Returns:
    ``int8[n]`` with values in {-1, 0, 1} (a corrupted 0b11 code decodes to 2;
    :func:`unpack_2bit_checked` rejects it instead).

  Raises:
    TypeError: if ``b`` is not uint8 or ``n`` not an int.
    ValueError: if ``n < 0`` or ``len(b) != ceil(n / 4)``.
  """
  n = check_length(n)
  b = as_flat_uint8(b, "unpack_2bit")
  check_byte_count(b.shape[0], n, 4, "unpack_2bit")
  return _unpack(b, n)


def pack_2bit_checked(t: Any) -> jax.Array:
  """:func:`pack_2bit` after a host-side check that ``t`` is ternary.

  Raises:
    ValueError: naming the first value outside {-1, 0, 1}.
  """
  return pack_2bit(check_ternary(t, "pack_2bit_checked: t"))


def unpack_2bit_checked(b: Any, n: int) -> jax.Array:
  """:func:`unpack_2bit` that validates the stream on the host first.

  Raises:
    ValueError: on a wrong length, on the unused code 0b11, or on padding
      codes that are not the code of 0 (all signs of a corrupted stream).
  """
  n = check_length(n)
  a = host_bytes(b, "unpack_2bit_checked")
  check_byte_count(a.shape[0], n, 4, "unpack_2bit_checked")
  codes = ((a[None, :] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3).reshape(-1)
  bad = np.flatnonzero(codes[:n] == 3)
  if bad.size:
    raise ValueError(
        f"unpack_2bit_checked: invalid 2-bit code 0b11 for element "
        f"{int(bad[0])} (byte {int(bad[0]) % max(a.shape[0], 1)}); corrupted stream")
  pad = np.flatnonzero(codes[n:] != _PAD_CODE)
  if pad.size:
    raise ValueError(
        f"unpack_2bit_checked: padding code of element {n + int(pad[0])} is "
        f"{int(codes[n + pad[0]])}, expected {_PAD_CODE} (the code of 0); "
        "corrupted stream or wrong n")
  return _unpack(jnp.asarray(a), n)
