"""Small helpers shared by the quantizers of this package (3LC, int8, QSGD, stochastic ternary)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def max_abs(x: jax.Array, axis=None) -> jax.Array:
  """``max|x|`` (0 for an empty tensor)."""
  return jnp.max(jnp.abs(x), axis=axis, initial=0.0)


def safe_reciprocal(a: jax.Array) -> jax.Array:
  """``1/a``, and 0 where ``a == 0``: a tensor (or bucket) of zeros quantizes to zeros, no 0/0."""
  return jnp.where(a > 0, 1.0 / jnp.where(a > 0, a, 1.0), 0.0)


def materialize(a: jax.Array) -> jax.Array:
  """``a`` unchanged, but computed into its own buffer before its consumers run.

  XLA fuses an elementwise producer (a quantizer) into its consumer. Before
  base-3^5 encoding that is slow on XLA:CPU: the encoder pads the codes and
  cuts them into five partitions, and the fused loop evaluates the quantizer
  through the pad (docs/benchmarks.md). XLA does not fuse a reduction into its
  consumers, so a sum over the stacked pair ``(a, 0)`` (exact for integers)
  ends the fusion here; ``lax.optimization_barrier`` does not (see
  :func:`jaxcomp.parallel.exchange` for what it does). On GPU/TPU this costs one extra pass over ``a``;
  ``a`` itself is the plain form.
  """
  return lax.reduce(jnp.stack([a, jnp.zeros_like(a)]), jnp.zeros((), a.dtype), lax.add, (0,))
