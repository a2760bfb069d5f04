"""Helpers shared by the tests of the ternary codecs (base-3^5 and 2-bit)."""

import jax
import numpy as np


def ternary(seed: int, n: int, p_zero: float, dtype=np.int8) -> np.ndarray:
  """``n`` random values in {-1, 0, 1}, each 0 with probability ``p_zero``."""
  rs = np.random.RandomState(seed)
  t = rs.choice([-1, 1], size=n)
  t[rs.random_sample(n) < p_zero] = 0
  return t.astype(dtype)


def jit_vmap_round_trip(encode, decode, t):
  """Encodes and decodes the rows of ``t`` under one ``jit`` with ``vmap``.

  Args:
    encode: the codec's traceable encoder (values -> bytes).
    decode: the codec's traceable decoder ``(bytes, n) -> values``.
    t: 2-D array of ternary values, one message per row.

  Returns:
    ``(encoded, decoded)``, each with a leading axis of rows.
  """
  n = t.shape[1]

  @jax.jit
  def round_trip(x):
    b = jax.vmap(encode)(x)
    return b, jax.vmap(lambda c: decode(c, n))(b)

  return round_trip(t)
