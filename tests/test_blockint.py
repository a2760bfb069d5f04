"""ZeRO++'s block quantizers (jaxcomp.BlockInt): the per-block bound, the packing, the range, the bytes.

The shared requirements (dtypes, non-finite policy, layouts, error-feedback conservation, exact
bytes) run in tests/test_quantizers.py; the two-phase exchange in tests/test_two_phase.py; the
sharded optimizer's reduce-scatter and all-gather in tests/test_zero.py.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcomp
from jaxcomp import core, parallel
from jaxcomp.exchange import two_phase

from _layouts import vmap_update

pytestmark = pytest.mark.accelerator

LENGTHS = (1, 2, 9, 33, 100)  # odd, even, under / over a block, off the packing group of 8
BLOCKS = (1, 5, 32)


@functools.lru_cache(maxsize=None)
def _codec(bits, block, n):
  """Jitted ``x -> (payload, decoded, signed codes)`` for one configuration (compiled once each)."""
  comp = jaxcomp.BlockInt(bits=bits, block=block)

  def run(x):
    p = comp.encode(x, None, None)
    return p, comp.decode(p, x.shape), comp._unpack(p.codes, n)  # pylint: disable=protected-access
  return comp, jax.jit(run)


def _per_value(scales, block, n):
  return np.repeat(np.asarray(scales), block)[:n]


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from((4, 8)), block=st.sampled_from(BLOCKS), n=st.sampled_from(LENGTHS),
       data=st.data())
def test_each_value_within_half_its_blocks_step(bits, block, n, data):
  """``|x − decode| ≤ scale_B/2`` per element, ``scale_B = max|x_B| / L``, codes in ``[−L, L]``."""
  # magnitudes whose scale and reciprocal are normal floats (module docstring), and edge values
  magnitude = st.floats(float(np.float32(1e-30)), float(np.float32(1e30)), width=32)
  values = st.one_of(magnitude, magnitude.map(lambda v: -v), st.sampled_from([0.0, -0.0, 1.0, -1.0, 1.5, 2.5, -3.5]))
  x = np.asarray(data.draw(st.lists(values, min_size=n, max_size=n)), np.float32)
  comp, run = _codec(bits, block, n)
  p, out, q = jax.tree.map(np.asarray, run(jnp.asarray(x)))
  levels = 2 ** (bits - 1) - 1
  padded = np.pad(np.abs(x), (0, -n % block)).reshape(-1, block)
  # max|x_B| / L to an ulp (XLA may divide by the constant L as a multiplication by 1/L)
  np.testing.assert_allclose(p.scales, padded.max(axis=1) / np.float32(levels), rtol=2.4e-7, atol=0)
  assert q.min() >= -levels and q.max() <= levels
  scale = _per_value(p.scales, block, n).astype(np.float64)
  err = np.abs(x.astype(np.float64) - out.astype(np.float64))
  assert np.all(err <= scale / 2 * (1 + 1e-6) + 1e-45), (err - scale / 2).max()
  np.testing.assert_array_equal(out, (q * _per_value(p.scales, block, n)).astype(np.float32))
  assert comp.levels == levels


@settings(max_examples=40, deadline=None)
@given(n=st.sampled_from(LENGTHS), data=st.data())
def test_int4_nibbles_pack_two_a_byte_and_unpack(n, data):
  """Any codes in ``[−7, 7]``: two's-complement nibbles, value ``i`` of the packed stream back as itself."""
  codes = np.asarray(data.draw(st.lists(st.integers(-7, 7), min_size=n, max_size=n)), np.int8)
  packed, back = _nibbles(n)(jnp.asarray(codes))
  assert packed.dtype == jnp.uint8 and packed.shape == (math.ceil(n / 2),)
  np.testing.assert_array_equal(np.asarray(back), codes)


@functools.lru_cache(maxsize=None)
def _nibbles(n):
  comp = jaxcomp.BlockInt(bits=4, block=8)
  pack = lambda c: comp._pack(c)  # pylint: disable=protected-access,unnecessary-lambda
  return jax.jit(lambda c: (pack(c), comp._unpack(pack(c), n)))  # pylint: disable=protected-access


def test_int4_range_is_symmetric_and_minus_8_never_sent():
  """``±max`` of a block are exactly ``±7`` steps; no nibble is ``0b1000`` (−8)."""
  x = jnp.concatenate([jnp.array([-3.0, 3.0, 1.5, -0.2]), jax.random.normal(jax.random.PRNGKey(0), (997,))])
  _, run = _codec(4, 4, x.shape[0])
  p, out, q = jax.tree.map(np.asarray, run(x))
  np.testing.assert_array_equal(q[:4], [-7, 7, 4, 0])  # 1.5/(3/7) = 3.5 -> 4 (half to even), -0.47 -> 0
  np.testing.assert_allclose(out[:2], [-3.0, 3.0], rtol=2.4e-7)  # 7 steps of 3/7: max|x| to an ulp
  nibbles = np.stack([p.codes & 0xF, p.codes >> 4])
  assert not np.any(nibbles == 8) and np.any(q == -7) and np.any(q == 7)


def test_zero_blocks_scalars_and_empty_decode_to_zeros():
  comp = jaxcomp.BlockInt(bits=4, block=8)
  run = jax.jit(lambda v: (comp.encode(v, None, None), comp.decode(comp.encode(v, None, None), v.shape)))
  x = jnp.concatenate([jnp.zeros(8), jnp.linspace(-1.0, 1.0, 8), jnp.zeros(3)])  # a zero block, a partial one
  p, out = jax.tree.map(np.asarray, run(x))
  np.testing.assert_array_equal(p.scales[[0, 2]], [0.0, 0.0])
  assert np.all(out[:8] == 0) and np.all(out[16:] == 0) and np.all(np.isfinite(out))
  _, tiny = run(jnp.array([1e-40, 0.0, -5e-41]))  # a subnormal maximum: zeros or values, never NaN
  assert np.all(np.isfinite(np.asarray(tiny))) and float(tiny[1]) == 0.0
  for shape in ((), (0,), (2, 3)):
    _, z = run(jnp.zeros(shape))
    assert z.shape == shape and not np.asarray(z).any()


@pytest.mark.parametrize("bits", [8, 4])
def test_bytes_are_codes_plus_a_float32_scale_per_block(bits):
  """Payload ``⌈n·bits/8⌉ + 4·⌈n/block⌉`` bytes; the transport counts exactly that (and the flag byte)."""
  for n in (1, 7, 1001, 2560, 2561):
    p = jax.eval_shape(lambda v: jaxcomp.BlockInt(bits=bits).encode(v, None, None), jnp.zeros(n))
    assert core.tree_nbytes(p) == math.ceil(n * bits / 8) + 4 * math.ceil(n / 2560), n
  w, shape = 4, (6, 35)  # 210 values, blocks of 64: 4 scales
  tx = jaxcomp.blockint(bits=bits, block=64, axis_name="w")
  state = parallel.replicate_workers(tx.init(jnp.zeros(shape)), w)
  g = jax.random.normal(jax.random.PRNGKey(1), (w,) + shape)
  mean, state = vmap_update(tx, g, state)
  flag = 1  # the non-finite flag byte of nonfinite="propagate", one a tensor
  assert int(jaxcomp.metrics(state)["bytes_on_wire"]) == 210 * bits // 8 + 4 * 4 + flag
  comp = jaxcomp.BlockInt(bits=bits, block=64)
  decoded = np.stack([np.asarray(comp.decode(comp.encode(g[i], None, None), shape)) for i in range(w)])
  np.testing.assert_allclose(np.asarray(mean), decoded.mean(0), rtol=1e-6, atol=1e-7)


def test_error_feedback_on_by_default_and_optional():
  params = jnp.zeros(100)
  assert jaxcomp.BlockInt.error_feedback
  with_ef = jaxcomp.blockint(bits=4, block=16).init(params)
  without = jaxcomp.blockint(bits=4, block=16, error_feedback=False).init(params)
  assert with_ef.local.residual.shape == (100,) and isinstance(without.local.residual, optax.MaskedNode)
  g = jax.random.normal(jax.random.PRNGKey(2), (100,))
  out, _ = jax.jit(jaxcomp.blockint(bits=4, block=16, error_feedback=False).update)(g, without)
  comp = jaxcomp.BlockInt(bits=4, block=16)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(comp.decode(comp.encode(g, None, None), g.shape)))


def test_chunks_hold_whole_blocks_and_validation():
  assert two_phase.alignment(jaxcomp.BlockInt(block=40)) == 40
  assert two_phase.alignment(jaxcomp.BlockInt(bits=4, block=5)) == 40  # whole bytes of nibbles too
  assert two_phase.alignment(jaxcomp.BlockInt()) == 2560  # shard_optimizer's default align: whole blocks
  assert "blockint" in jaxcomp.REGISTRY and jaxcomp.blockint.static_args == ("bits", "block")
  for bad in ({"bits": 2}, {"bits": True}, {"block": 0}, {"block": 2.5}):
    with pytest.raises(ValueError, match=next(iter(bad))):
      jaxcomp.blockint(**bad)
