"""4-bit E3M0 floats (Streaming DiLoCo §2.4): the levels, the rounding, the packing, the bytes."""

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp

from _layouts import vmap_update

fp4_lib = importlib.import_module("jaxcomp.compressors.fp4")  # the package exports the function

pytestmark = pytest.mark.accelerator

LEVELS = [0.0] + [2.0 ** -e for e in range(6, -1, -1)]  # {0, 2^-6, ..., 1}: the eight magnitudes


def _round_trip(x):
  c = jaxcomp.FP4()
  return np.asarray(jax.jit(lambda v: c.decode(c.encode(v, None, None), v.shape))(x))


def test_representable_values_round_trip_exactly():
  scale = 3.0
  x = jnp.asarray([s * scale * m for m in LEVELS for s in (1.0, -1.0)], jnp.float32)
  np.testing.assert_array_equal(_round_trip(x), np.asarray(x))


def test_rounds_to_the_nearest_level_ties_up_and_small_values_to_zero():
  rng = np.random.default_rng(0)
  m = np.concatenate([rng.uniform(0, 1, 500), [1.5 * 2.0 ** -3, 2.0 ** -7, 0.99 * 2.0 ** -7, 1.0]])
  x = np.concatenate([m, -m]).astype(np.float32)
  got = _round_trip(jnp.asarray(x))
  levels = np.asarray(LEVELS)
  for v, g in zip(x, got):
    dist = np.abs(np.abs(v) - levels)
    best = levels[np.flatnonzero(dist == dist.min()).max()]  # the nearest; a tie goes up
    assert g == math.copysign(best, v) if best else g == 0.0, (v, g, best)


def test_packing_two_values_a_byte_and_the_bytes():
  c = jaxcomp.FP4()
  for n in (1, 8, 7):
    x = jnp.arange(1, n + 1, dtype=jnp.float32) * (-1) ** jnp.arange(n)
    p = c.encode(x, None, None)
    assert p.codes.dtype == jnp.uint8 and p.codes.shape == (math.ceil(n / 2),)
    assert jaxcomp.core.tree_nbytes(p) == math.ceil(n / 2) + 4
    nib = np.asarray(fp4_lib.encode_values(x, p.scale))
    packed = np.asarray(p.codes)
    np.testing.assert_array_equal(packed & 0xF, nib[0::2])  # value 2i: the low nibble of byte i
    np.testing.assert_array_equal((packed >> 4)[: n // 2], nib[1::2])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_dtypes_zeros_scalars_and_empty(dtype):
  c = jaxcomp.FP4()
  for shape in ((), (0,), (3, 5)):
    x = jnp.zeros(shape, dtype)
    out = c.decode(c.encode(x, None, None), shape)
    assert out.shape == shape and not np.isnan(np.asarray(out)).any() and not np.asarray(out).any()
  x = jnp.asarray([-2.0, 0.5, 1.0], dtype)
  np.testing.assert_array_equal(np.asarray(c.decode(c.encode(x, None, None), (3,))), [-2.0, 0.5, 1.0])


def test_exchange_bytes_and_mean_over_workers():
  w = 4
  g = jax.random.normal(jax.random.PRNGKey(0), (w, 6, 9))
  tx = jaxcomp.fp4(axis_name="w")
  state = jaxcomp.parallel.replicate_workers(tx.init(jnp.zeros((6, 9))), w)
  mean, state = vmap_update(tx, g, state)
  decoded = np.stack([_round_trip(g[i]) for i in range(w)])
  np.testing.assert_allclose(np.asarray(mean), decoded.mean(0), rtol=1e-6, atol=1e-7)
  wire = int(jaxcomp.metrics(state)["bytes_on_wire"])
  assert 27 + 4 <= wire <= 27 + 4 + 1  # the payload, and at most a non-finite flag beside it
