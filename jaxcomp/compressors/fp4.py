"""4-bit floats E3M0 with a per-tensor scale (Streaming DiLoCo's outer-gradient format).

Streaming DiLoCo (Douillard et al., arXiv:2501.18512, §2.4, "Quantized outer gradients")
exchanges the outer gradients in 4-bit floats, E3M0: one sign bit, three exponent bits and no
mantissa, and accumulates them in float32. Per tensor, on every worker:

1. ``scale = max|x|`` (float32), ``m = |x| / scale ∈ [0, 1]``;
2. ``m`` rounded to the nearest of the eight magnitudes ``{0} ∪ {2^-6, 2^-5, …, 2^-1, 1}``;
   code ``c ∈ [0, 7]``: ``c = 0`` is zero, ``c ≥ 1`` is ``2^(c − 7)``;
3. the wire: a nibble a value, ``s·8 + c`` (``s`` the sign bit), two a byte (value ``2i`` in the
   low nibble of byte ``i``), and the float32 scale: ``ceil(n/2) + 4`` bytes;
4. decoded as ``±scale·2^(c − 7)`` (0 for ``c = 0``); the workers' decoded tensors are averaged
   after an all-gather (the default exchange), in float32.

Decisions (tested in ``tests/test_fp4.py``):

* **The exponent's range.** E3M0 has eight exponent codes; the paper does not say how they are
  placed, so here the code ``0`` is zero (as the all-zero exponent of a subnormal with no
  mantissa) and the other seven are the powers of two from the tensor's maximum down by six
  binades, ``max|x|`` itself exactly representable.
* **Rounding** is to the nearest level in linear terms (between ``2^k`` and ``2^(k+1)`` the
  midpoint is ``1.5·2^k``), ties upwards; below ``2^-7`` (half the smallest level) to zero. It is
  deterministic: the paper gives no stochastic rounding.
* **No error feedback by default** (the paper describes none); ``error_feedback=True`` keeps the
  rounding error in the shared residual.
* A tensor of zeros has ``scale = 0`` and decodes to zeros; a negative zero is sent as ``+0``.

References:
  Douillard, Donchev, Rush, Kale, Charles, Garrett, Teston, Lacey, McIlroy, Shen, Ramé, Szlam,
  Ranzato, Barham. *Streaming DiLoCo with overlapping communication: Towards a Distributed Free
  Lunch*. arXiv:2501.18512, §2.4 (4-bit E3M0 outer gradients, float32 accumulation).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import transforms
from jaxcomp.compressors._quant import max_abs, safe_reciprocal

TOP = 7  # the largest code: 2^(TOP − 7) = 1, the scale itself
SIGN = 8  # the sign bit of a nibble


class FP4Payload(NamedTuple):
  codes: jax.Array  # uint8[ceil(n/2)]: two nibbles a byte, value 2i in the low nibble of byte i
  scale: jax.Array  # float32[]: max|x|


def encode_values(x: jax.Array, scale: jax.Array) -> jax.Array:
  """The nibbles ``s·8 + c`` (uint8) of flat float32 ``x`` against ``scale`` (module docstring)."""
  m = jnp.abs(x) * safe_reciprocal(scale)
  mantissa, exponent = jnp.frexp(m)  # m = mantissa · 2^exponent, mantissa in [0.5, 1) (0 for m = 0)
  nearest = jnp.where(mantissa >= 0.75, exponent, exponent - 1)  # log2 of the nearer power of two
  code = jnp.where(m < 2.0 ** -7, 0, jnp.clip(nearest, -6, 0) + TOP)
  sign = jnp.where((x < 0) & (code > 0), SIGN, 0)
  return (code + sign).astype(jnp.uint8)


def decode_values(nib: jax.Array, scale: jax.Array) -> jax.Array:
  """float32 values of nibbles ``nib`` against ``scale``."""
  code = (nib & (SIGN - 1)).astype(jnp.int32)
  magnitude = jnp.where(code > 0, jnp.ldexp(jnp.float32(1), code - TOP), 0.0) * scale
  return jnp.where(nib & SIGN, -magnitude, magnitude).astype(jnp.float32)


def pack(nib: jax.Array) -> jax.Array:
  """Two nibbles a byte: ``uint8[ceil(n/2)]``, value ``2i`` in the low nibble of byte ``i``."""
  pairs = jnp.pad(nib, (0, nib.shape[0] % 2)).reshape(-1, 2)
  return (pairs[:, 0] | (pairs[:, 1] << 4)).astype(jnp.uint8)


def unpack(codes: jax.Array, n: int) -> jax.Array:
  """Inverse of :func:`pack`: the ``n`` nibbles."""
  return jnp.stack([codes & 0xF, codes >> 4], axis=1).reshape(-1)[:n]


@dataclasses.dataclass(frozen=True)
class FP4(core.Compressor):
  """4-bit E3M0 floats with a per-tensor scale (see the module docstring)."""

  def encode(self, x, key, agreed):
    del key, agreed
    flat = x.reshape(-1).astype(jnp.float32)
    scale = max_abs(flat).astype(jnp.float32)
    return FP4Payload(codes=pack(encode_values(flat, scale)), scale=scale)

  def decode(self, payload, shape):
    return decode_values(unpack(payload.codes, core.size_of(shape)), payload.scale).reshape(shape)


@hyperparams.factory()
def fp4(**kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """4-bit E3M0 floats (Streaming DiLoCo, arXiv:2501.18512 §2.4) as an optax transform.

  Example::

    # Streaming DiLoCo's 4-bit outer gradients:
    tx = jaxcomp.diloco(optax.adamw(4e-4), 100, fragments=4, axis_name="workers", exchange="fp4")

  Args:
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``, ``min_size``,
      ``seed``, ``nonfinite``, ``error_feedback``: off by default).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(FP4(), **kwargs)
