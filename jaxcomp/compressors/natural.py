"""Natural compression C_nat: unbiased stochastic rounding to a power of two (Horváth et al.).

Per element ``t ≠ 0`` with ``2^e ≤ |t| < 2^(e+1)`` (arXiv:1905.10988, §2,
the definition of ``C_nat``)::

    C_nat(t) = sign(t)·2^e       with probability (2^(e+1) − |t|) / 2^e
               sign(t)·2^(e+1)   with probability (|t| − 2^e) / 2^e

so ``E[C_nat(t)] = t`` and ``E[C_nat(t)²] ≤ 9/8·t²`` (variance at most
``t²/8``, reached at ``|t| = 4/3·2^e``; the paper's bound ``ω = 1/8``). For
a float32 ``t = ±2^(E−127)·(1 + m/2^23)`` the probability of rounding up is
the mantissa fraction ``m/2^23``: the encoder compares a 24-bit random
integer with ``2m`` and adds 1 to the exponent ``E`` if it is below. Zero
stays zero. The workers' decoded tensors are averaged after an
``all_gather`` (the default exchange), like the other quantizers.

The wire: **8 bits per value** plus **1 byte per tensor**:

* a ``uint8`` per value: bit 7 the sign, bits 0–6 a code ``c``: ``c = 0`` is
  zero, ``c ∈ [1, 127]`` is the power of two ``2^(base + c − 1 − 127)``
  (``base + c − 1`` a float32 biased exponent);
* a ``uint8`` ``base`` per tensor and worker: the lowest biased exponent the
  codes reach, ``base = max(top − 126, 1)`` with ``top = min(max E + 1, 254)``
  (``max E`` the largest exponent in the tensor, ``+1`` for rounding up).

So ``n + 1`` bytes for ``n`` values. The paper packs sign and the whole
8-bit exponent, 9 bits a value (its "3.56× for binary32"); here the exponent
is relative to the tensor's own ``base``, which covers the 127 powers of two
from the tensor's largest magnitude down to ``2^-125`` times it, and makes
a value one byte.

Out-of-range exponents (tested in ``tests/test_zoo_sparse_half_natural.py``):

* **zeros** (``±0``) are code 0, decoded as ``0`` (exactly);
* **values below the lowest level** ``L = 2^(base − 127)`` (below ``2^-125``
  times the tensor's largest power of two, or below float32's smallest normal
  ``2^-126``; this includes every **subnormal**) are rounded stochastically to
  ``0`` or ``±L`` with probability ``floor(2^24·|t|/L)/2^24`` (computed from
  the bits, so subnormals are handled exactly even where the platform flushes
  them to zero in arithmetic): ``|E[C(t)]|`` lies in ``(|t| − 2^-24·L, |t|]``
  (a bias below ``2^-24·L`` per element, from the 24-bit random integer) and
  the variance is at most ``L²/4``;
* **values with** ``|t| ≥ 2^127`` cannot round up (float32 has no ``2^128``):
  they are sent as ``±2^127`` (biased, by ``|t| − 2^127``);
* ``±inf``/``NaN`` never reach the encoder inside :func:`jaxcomp.compress`
  (its ``nonfinite`` policy sets them aside).

Within the range the rounding is exactly unbiased with the ``"hash"``
generator (``P(up) = 2m/2^24`` exactly, :func:`jaxcomp.rng.bernoulli`).
No error feedback (the operator is unbiased; the paper uses none).

References:
  Horváth, Ho, Horváth, Sahu, Canini, Richtárik. *Natural Compression for
  Distributed Deep Learning*. arXiv:1905.10988 (MSML 2022), §2: the
  definition of ``C_nat`` and the bound ``E[C_nat(t)²] ≤ 9/8·t²``
  (``C_nat ∈ B(1/8)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.compressors import _quant

LEVELS = 127  # codes 1..127: powers of two; code 0: zero
MAX_EXPONENT = 254  # float32's largest finite biased exponent


class NaturalPayload(NamedTuple):
  codes: jax.Array  # uint8[n]: bit 7 sign, bits 0-6 the code c (0: zero; else exponent base + c - 1)
  base: jax.Array  # uint8[]: the lowest biased exponent the codes reach, in [1, 128]


def _fields(flat: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(sign, biased exponent E, mantissa m)`` of float32 values, as uint32."""
  bits = lax.bitcast_convert_type(flat, jnp.uint32)
  return bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF


def base_exponent(flat: jax.Array) -> jax.Array:
  """The payload's ``base`` (uint32): ``max(min(max E + 1, 254) − 126, 1)``.

  ``max E`` is the exponent of ``max|t|``: the float maximum, which XLA:CPU
  vectorizes (an integer maximum over the bit patterns, equal for
  non-negative floats, runs several times slower there). Where subnormals
  read as zero, a tensor of subnormals has ``max|t| = 0`` and ``max E = 0``
  either way.
  """
  top_abs = _quant.max_abs(flat)
  top = jnp.minimum((lax.bitcast_convert_type(top_abs, jnp.uint32) >> 23) + 1, MAX_EXPONENT)
  return jnp.maximum(top, LEVELS) - (LEVELS - 1)


def round_up_threshold(exponent: jax.Array, mantissa: jax.Array, base: jax.Array) -> jax.Array:
  """``T`` (uint32 ``< 2^24``): the value goes to the upper level with probability ``T / 2^24``.

  In range (``E ≥ base``): ``T = 2m`` (the mantissa fraction), the upper
  level ``2^(E+1)``. Below it: ``T = floor(2^24·|t|/L)``, the upper level
  ``L = 2^(base−127)`` and the lower one 0 (a subnormal has ``E = 0`` and no
  implicit bit: its value is ``m·2^-149``, read as ``E = 1`` without the bit).
  """
  in_range = exponent >= base
  sig = jnp.where(exponent == 0, mantissa, mantissa | (1 << 23))
  shift = jnp.minimum(base - jnp.maximum(exponent, 1), 31)  # >= 0 below the range
  below = (sig << 1) >> jnp.where(in_range, 0, shift)
  return jnp.where(in_range, mantissa << 1, below)


@dataclasses.dataclass(frozen=True)
class Natural(core.Compressor):
  """Natural compression ``C_nat`` (see the module docstring).

  Attributes:
    rng: uniform generator, ``"hash"`` (default) or ``"threefry"``.
  """

  rng: rng.RngImpl = "hash"

  unbiased = True

  def __post_init__(self):
    rng.check_impl(self.rng)

  def encode(self, x, key, agreed):
    del agreed
    flat = x.reshape(-1).astype(jnp.float32)
    sign, exponent, mantissa = _fields(flat)
    base = base_exponent(flat)
    threshold = round_up_threshold(exponent, mantissa, base)
    up = rng.bernoulli(key, threshold.astype(jnp.float32) * jnp.float32(2.0**-24), self.rng).astype(jnp.uint32)
    in_range = exponent >= base
    # In range: the code of exponent E + up (E + 1 capped at 254). Below: code `up` (0 or the level L).
    code = jnp.where(in_range, jnp.minimum(exponent + up, MAX_EXPONENT) - base + 1, up)
    return NaturalPayload(codes=((sign << 7) | code).astype(jnp.uint8), base=base.astype(jnp.uint8))

  def decode(self, payload, shape):
    c = payload.codes.astype(jnp.uint32)
    code = c & 0x7F
    bits = ((c >> 7) << 31) | ((code + payload.base.astype(jnp.uint32) - 1) << 23)
    values = lax.bitcast_convert_type(jnp.where(code == 0, 0, bits), jnp.float32)
    return values.reshape(shape)


@hyperparams.factory()
def natural(*, rng: rng.RngImpl = "hash", **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """Natural compression (Horváth et al., arXiv:1905.10988) as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.natural(axis_name="workers"), optax.sgd(0.1, momentum=0.9))

  Args:
    rng: uniform generator, ``"hash"`` or ``"threefry"``.
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: off).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(Natural(rng=rng), **kwargs)
