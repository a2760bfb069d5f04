"""Small helpers shared by the quantizers of this package (3LC, int8, QSGD, stochastic ternary)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def max_abs(x: jax.Array, axis=None) -> jax.Array:
  """``max|x|`` (0 for an empty tensor)."""
  return jnp.max(jnp.abs(x), axis=axis, initial=0.0)


def safe_reciprocal(a: jax.Array) -> jax.Array:
  """``1/a``, and 0 where ``a == 0``: a tensor (or bucket) of zeros quantizes to zeros, no 0/0."""
  return jnp.where(a > 0, 1.0 / jnp.where(a > 0, a, 1.0), 0.0)
