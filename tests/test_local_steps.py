"""Local steps: the optimizer and the wire act only on exchange steps; the accounting of the mean.

The same numbers under every layout are checked with the other transforms in
tests/test_column_compressors.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel

from _layouts import vmap_update as _vmap_update

pytestmark = pytest.mark.accelerator


def test_local_steps_matches_multisteps_single_worker():
  """One worker, float exchange: the same trajectory as optax.MultiSteps (mean of k gradients)."""
  opt = optax.sgd(0.1, momentum=0.9)
  ours = jaxcomp.local_steps(opt, k=3)
  ref = optax.MultiSteps(opt, every_k_schedule=3, use_grad_mean=True)
  params = {"w": jnp.ones((5, 4)), "b": jnp.zeros(4)}
  s1, s2 = ours.init(params), ref.init(params)
  u1f, u2f = jax.jit(ours.update), jax.jit(ref.update)
  for t in range(7):
    g = jax.tree.map(lambda p: jax.random.normal(jax.random.PRNGKey(t), p.shape), params)
    u1, s1 = u1f(g, s1, params)
    u2, s2 = u2f(g, s2, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), u1, u2)
    if t % 3 != 2:
      assert all(float(jnp.max(jnp.abs(u))) == 0 for u in jax.tree.leaves(u1))

def test_local_steps_optimizer_and_wire_only_on_exchange_steps():
  W, k = 4, 2
  tx = jaxcomp.make_optimizer("local_steps", optax.sgd(1.0, momentum=0.9), k=k, axis_name="w")
  params = {"w": jnp.zeros((6, 4))}
  state = parallel.replicate_workers(tx.init(params), W)
  step = jax.jit(lambda g, s: _vmap_update(tx, g, s))
  wire = []
  prev_trace = state.inner[0].trace
  for t in range(5):
    g = {"w": jax.random.normal(jax.random.PRNGKey(t), (W, 6, 4))}
    upd, state = step(g, state)
    m = jaxcomp.metrics(state)
    wire.append(float(m["bytes_on_wire"]))
    assert float(m["float32_bytes"]) == 4 * 24  # the reference size, every step
    if t % k == 0:  # no exchange: zero update, momentum untouched
      np.testing.assert_array_equal(upd["w"], 0.0)
      np.testing.assert_array_equal(state.inner[0].trace["w"], prev_trace["w"])
    else:
      assert float(jnp.max(jnp.abs(upd["w"]))) > 0
    prev_trace = state.inner[0].trace
  assert wire == [0.0, 4 * 24, 0.0, 4 * 24, 0.0]
  # The open window (step 4) is in the worker's accumulator.
  np.testing.assert_allclose(state.local.residual["w"], jax.random.normal(jax.random.PRNGKey(4), (W, 6, 4)), atol=1e-6)

def test_local_steps_accounting_float_exchange():
  """k * sum of updates (sgd, lr 1) + mean_w(accumulator) == mean_w(sum of gradients)."""
  W, k, T = 3, 3, 7
  tx = jaxcomp.local_steps(optax.sgd(1.0), k=k, axis_name="w")
  state = parallel.replicate_workers(tx.init(jnp.zeros(5)), W)
  step = jax.jit(lambda g, s: _vmap_update(tx, g, s))
  total_in, total_upd = jnp.zeros((W, 5)), jnp.zeros(5)
  for t in range(T):
    g = jax.random.normal(jax.random.PRNGKey(t), (W, 5))
    upd, state = step(g, state)
    total_in += g
    total_upd += upd
  acc = state.local.residual
  assert float(jnp.max(jnp.abs(acc))) > 0  # T is not a multiple of k: an open window
  np.testing.assert_allclose(-k * total_upd + acc.mean(0), total_in.mean(0), atol=1e-5)

def test_local_steps_k1_is_a_chain_and_bad_arguments():
  opt = optax.sgd(0.1, momentum=0.9)
  a = jaxcomp.local_steps(opt, k=1, exchange="topk", fraction=0.5, sample=None)
  b = optax.chain(jaxcomp.topk(0.5, sample=None), opt)
  params = jnp.zeros(10)
  sa, sb = a.init(params), b.init(params)
  update_a, update_b = jax.jit(a.update), jax.jit(b.update)  # one program each, not eager ops
  for t in range(3):
    g = jax.random.normal(jax.random.PRNGKey(t), (10,))
    ua, sa = update_a(g, sa, params)
    ub, sb = update_b(g, sb, params)
    np.testing.assert_allclose(ua, ub, atol=1e-7)
  with pytest.raises(ValueError, match="k must"):
    jaxcomp.local_steps(opt, k=0)
  with pytest.raises(TypeError, match="compressor"):
    jaxcomp.local_steps(opt, k=2, fraction=0.1)
