"""EF-SignSGD: scaled sign compression with error feedback (Karimireddy et al., ICML 2019).

Per tensor, on every worker (Algorithm 1 of the paper, with the learning rate
applied after the exchange): ``p = g + e`` (the shared error feedback of
:func:`jaxcomp.compress`), ``Δ = (‖p‖₁ / d) · sign(p)`` with ``d`` the number
of elements, ``e <- p − Δ``. The workers' ``Δ`` are averaged.

The wire: the sign bits packed eight per byte (the same
:func:`jaxcomp.compressors.signsgd.sign_bits` as signSGD) plus the float32
scale ``‖p‖₁/d``: ``ceil(n/8) + 4`` bytes.

Decisions (tested in ``tests/test_quantizers.py``):

* ``sign(0) = +1`` (one bit); a zero element is then sent as ``+‖p‖₁/d`` and
  the error feedback keeps the difference.
* A tensor of zeros has scale 0 and decodes to zeros.
* The paper's Algorithm 1 compresses ``γ·g + e`` (learning rate inside);
  here the compressor sees ``g + e`` and the optimizer that follows applies
  the learning rate, which is the same algorithm for a constant learning
  rate (the compressor is positively homogeneous) and keeps the residual in
  gradient units when the learning rate changes.
* No cross-worker agreement: each worker sends its own scale.

References:
  Karimireddy, Rebjock, Stich, Jaggi. *Error Feedback Fixes SignSGD and other
  Gradient Compression Schemes*. ICML 2019, Algorithm 1 (EF-SIGNSGD),
  ``C(v) = (‖v‖₁/d) · sign(v)``.
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
from jaxcomp.compressors.signsgd import sign_bits, unpack_signs


class ScaledSignPayload(NamedTuple):
  signs: jax.Array  # uint8[ceil(n/8)]: bit 1 <=> x >= 0, LSB first
  scale: jax.Array  # float32[]: ||x||_1 / d


@dataclasses.dataclass(frozen=True)
class EFSignSGD(core.Compressor):
  """EF-SignSGD's scaled sign compressor (see the module docstring)."""

  error_feedback = True

  def encode(self, x, key, agreed):
    del key, agreed
    scale = jnp.sum(jnp.abs(x)) / max(x.size, 1)
    return ScaledSignPayload(signs=sign_bits(x), scale=scale.astype(jnp.float32))

  def decode(self, payload, shape):
    signs = unpack_signs(payload.signs, core.size_of(shape))
    return (signs.astype(jnp.float32) * payload.scale).reshape(shape)


@hyperparams.factory()
def ef_signsgd(**kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """EF-SignSGD as an optax transform.

  Args:
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: on).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(EFSignSGD(), **kwargs)
