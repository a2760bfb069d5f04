"""Base-3^5 encoding: five ternary values per byte (3LC §3.2).

3LC (Lim et al., MLSys 2019) packs five 3-values into one byte, 1.6 bits per
value, 0.95% above the log2(3) bound. The encoding follows the paper's five
steps exactly, so that any implementation of the paper produces the same
bytes:

1. add 1 to every value (−1, 0, +1 → 0, 1, 2);
2. cast to ``uint8``;
3. flatten (C order) to a 1-D array of length ``n``;
4. pad with zeros *in this shifted domain* to ``5 * L``, ``L = ceil(n / 5)``
   (a pad digit of 0 stands for the value −1; it is never decoded because
   the decoder is given ``n``);
5. split into five equal **contiguous** arrays ``P0 … P4`` of length ``L``
   (``Pk = shifted[k*L:(k+1)*L]``) and emit
   ``byte = P0·81 + P1·27 + P2·9 + P3·3 + P4``.

Byte ``j`` therefore carries the values at flat indices ``j, L+j, 2L+j,
3L+j, 4L+j``; five zero values give the byte 121 (= 81+27+9+3+1), which
:mod:`jaxcomp.codecs.zerorun` compresses. Only bytes 0–242 occur; a byte
>= 243 in a base-3^5 stream is corruption and
:func:`base243_decode_checked` rejects it.

Both directions are pure ``jax.numpy``, jit-able and usable inside a caller's
``jit``/``vmap``/``shard_map``; all arithmetic stays in ``uint8`` (the largest
intermediate is 242).
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
    "ZERO_GROUP_BYTE",
    "base243_decode",
    "base243_decode_checked",
    "base243_encode",
    "base243_encode_checked",
    "base243_size",
]

ZERO_GROUP_BYTE = 121
"""The byte of five zero values: (0+1)·(81+27+9+3+1)."""

WEIGHTS = (81, 27, 9, 3, 1)
"""The weight of each of a byte's five base-3 digits, partition 0 first (step 5)."""


def base243_size(n: int) -> int:
  """Bytes that :func:`base243_encode` produces for ``n`` values: ceil(n/5)."""
  return ceil_div(check_length(n), 5)


@jax.jit
def _encode(flat: jax.Array) -> jax.Array:
  n = flat.shape[0]
  length = ceil_div(n, 5)
  shifted = (flat.astype(jnp.int8) + 1).astype(jnp.uint8)
  return pack_digits(partitions(shifted, 5, length))  # steps 4-5: five contiguous partitions, zero-padded


def digit(b: jax.Array, k: int) -> jax.Array:
  """Digit ``k`` (0 = most significant, weight 81) of uint8 bytes, as uint32.

  Each digit straight from the byte (a division by a constant and a mod 3, which
  LLVM turns into multiply-shifts), not from the previous digit's remainder.
  """
  x = b.astype(jnp.uint32)
  w = WEIGHTS[k]
  q = x // jnp.uint32(w) if w > 1 else x
  if k == 0:
    return q  # no mod 3: a byte >= 243 decodes out of range (3 - 1 = 2), as documented
  return q - (q // jnp.uint32(3)) * jnp.uint32(3)


@functools.partial(jax.jit, static_argnums=1)
def _decode(b: jax.Array, n: int) -> jax.Array:
  # The first n of P0 ‖ P1 ‖ … ‖ P4, joined from even-length pieces
  # (join_parts): concatenating all five and slicing the result to n, or
  # pieces at odd offsets, are slow on XLA:CPU.
  return join_parts(b, lambda x, k: digit(x, k).astype(jnp.int8) - jnp.int8(1), n, 5)


def pack_digits(digits: jax.Array) -> jax.Array:
  """Step 5 on digits already shifted and cut: ``digits[0]·81 + … + digits[4]`` (uint8, any trailing shape).

  ``digits`` is ``uint8[5, ...]`` (or a list of five), partition ``k`` in ``digits[k]`` (the
  bucket layout of :mod:`jaxcomp.exchange.layout` holds a tensor's five partitions as
  its planes).
  """
  out = digits[0] * jnp.uint8(WEIGHTS[0])
  for k in range(1, 5):
    out = out + digits[k] * jnp.uint8(WEIGHTS[k])
  return out


def ternary_planes(b: jax.Array) -> list[jax.Array]:
  """The values ``digit − 1`` ∈ {−1, 0, 1} of every byte's five planes, int8, plane by plane (a list).

  Each plane apart, for a decoder to scale and sum plane by plane (see
  :meth:`jaxcomp.core.BucketCompressor.decode_planes`).
  """
  return [digit(b, k).astype(jnp.int8) - jnp.int8(1) for k in range(5)]


def unpack_digits(b: jax.Array) -> jax.Array:
  """The inverse of :func:`pack_digits`: the five digits of every byte, ``uint8[5, ...]``.

  Computed in uint32 (:func:`digit`) and kept as bytes: where XLA writes the
  digits out before their consumers (a bucket's decode, read by every
  tensor's slice), they take a quarter of the memory.
  """
  return jnp.stack([digit(b, k).astype(jnp.uint8) for k in range(5)])


def base243_encode(t: Any) -> jax.Array:
  """Base-3^5-encodes ternary codes, exactly as 3LC §3.2.

  Args:
    t: integer array (int8 preferred, any integer dtype accepted) of any
      shape with values in {-1, 0, 1}; flattened in C order. Values are not
      checked on this traceable path; see :func:`base243_encode_checked`.

  Returns:
    ``uint8[ceil(n / 5)]``.

  Raises:
    TypeError: if ``t`` does not have an integer dtype.
  """
  return _encode(as_flat_int(t, "base243_encode"))


def base243_decode(b: Any, n: int) -> jax.Array:
  """Inverse of :func:`base243_encode`.

  Args:
    b: ``uint8[ceil(n / 5)]``.
    n: the original number of values (static Python int).

  Returns:
    ``int8[n]`` in {-1, 0, 1}. Bytes >= 243 are not detected here (they
    decode to out-of-range values); use :func:`base243_decode_checked`.

  Raises:
    TypeError: if ``b`` is not uint8 or ``n`` not an int.
    ValueError: if ``n < 0`` or ``len(b) != ceil(n / 5)``.
  """
  n = check_length(n)
  b = as_flat_uint8(b, "base243_decode")
  check_byte_count(b.shape[0], n, 5, "base243_decode")
  return _decode(b, n)


def base243_encode_checked(t: Any) -> jax.Array:
  """:func:`base243_encode` after a host-side check that ``t`` is ternary.

  Raises:
    ValueError: naming the first value outside {-1, 0, 1}.
  """
  return base243_encode(check_ternary(t, "base243_encode_checked: t"))


def base243_decode_checked(b: Any, n: int) -> jax.Array:
  """:func:`base243_decode` that validates the stream on the host first.

  Raises:
    ValueError: on a wrong length, on a byte >= 243 (not a base-3^5 byte), or
      on a padding digit that is not 0 (step 4 pads the shifted array with 0).
  """
  n = check_length(n)
  a = host_bytes(b, "base243_decode_checked")
  length = check_byte_count(a.shape[0], n, 5, "base243_decode_checked")
  bad = np.flatnonzero(a >= 243)
  if bad.size:
    i = int(bad[0])
    raise ValueError(
        f"base243_decode_checked: byte {i} is {int(a[i])} >= 243, not a "
        "base-3^5 byte (a zero-run stream must be expanded first, see "
        "jaxcomp.codecs.zerorun); corrupted stream")
  pad = 5 * length - n
  if pad:
    digits = np.stack([(a // w) % 3 for w in WEIGHTS])  # (5, L) = P0..P4
    tail = digits.reshape(-1)[n:]
    nz = np.flatnonzero(tail)
    if nz.size:
      f = n + int(nz[0])
      raise ValueError(
          f"base243_decode_checked: padding digit at flat index {f} (byte "
          f"{f % length}, P{f // length}) is {int(tail[nz[0]])}, expected 0; "
          "corrupted stream or wrong n")
  return _decode(jnp.asarray(a), n)
