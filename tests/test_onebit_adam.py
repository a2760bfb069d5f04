"""1-bit Adam: Adam before the freeze, conserved worker and server errors after, exact bytes in both stages.

One compiled run of 4 simulated workers (vmap) over both stages serves most
tests (the ``run`` fixture); the layouts test runs the same transform under
pmap, shard_map and shard_map+vmap.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel
from jaxcomp.exchange import plan
from jaxcomp.compressors.onebit_adam import OneBitAdamSign, scale_by_onebit_adam
from jaxcomp.exchange import transport

from _layouts import run_layouts

W, FREEZE, STEPS, LR, B1, B2, EPS = 4, 3, 7, 0.05, 0.9, 0.99, 1e-8
# "w" (200 values) is split over the 4 workers (two-phase, worker and server errors); "b" (3 values)
# is too small to split and takes the all-gather of 1-bit payloads (a worker error only).
PARAMS = {"w": jnp.zeros((20, 10)), "b": jnp.zeros(3)}


def _grads(t, workers=W):
  """Per-worker gradients with a shared drift (so the momentum has a sign to find) and worker noise."""
  def leaf(i, p):
    k = jax.random.fold_in(jax.random.PRNGKey(t), i)
    drift = jnp.linspace(-1.0, 1.0, p.size).reshape(p.shape)
    return drift + 0.5 * jax.random.normal(k, (workers,) + p.shape)
  return {name: leaf(i, p) for i, (name, p) in enumerate(sorted(PARAMS.items()))}


def _make_tx(axis_name, **kwargs):
  return jaxcomp.onebit_adam(LR, B1, B2, EPS, freeze_step=FREEZE, axis_name=axis_name, **kwargs)


def _inner(state):
  """The scale_by_onebit_adam state inside onebit_adam's chain."""
  return state[0]


@pytest.fixture(scope="module")
def run():
  """STEPS updates of 4 workers under vmap, one compiled step for both stages.

  Returns (grads, updates, states before each step and after the last, metrics, the jitted step).
  """
  tx = _make_tx("w")
  state = parallel.replicate_workers(tx.init(PARAMS), W)
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w"))
  grads, updates, states, metrics = [], [], [state], []
  for t in range(STEPS):
    g = _grads(t)
    u, state = step(g, state)
    grads.append(g)
    updates.append(u)
    states.append(state)
    metrics.append({k: float(v) for k, v in jaxcomp.metrics(state).items()})
  return grads, updates, states, metrics, step


def test_warmup_matches_optax_adam_on_the_mean_gradient(run):
  grads, updates, states, *_ = run
  ref = optax.adam(LR, B1, B2, EPS)
  ref_state = ref.init(PARAMS)
  ref_update = jax.jit(ref.update)  # one program for every step, not eager ops
  for t in range(FREEZE):
    mean = jax.tree.map(lambda g: g.mean(0), grads[t])
    want, ref_state = ref_update(mean, ref_state)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8), updates[t], want)
  # The compressed errors were not touched during the warm-up.
  errors = _inner(states[FREEZE]).compressed
  assert all(float(jnp.max(jnp.abs(e))) == 0 for e in jax.tree.leaves((errors.local.residual, errors.shard.residual)))
  # From the first compressed step on, the update is no longer Adam's (the momentum went through 1 bit).
  mean = jax.tree.map(lambda g: g.mean(0), grads[FREEZE])
  want, _ = ref_update(mean, ref_state)
  assert not np.allclose(updates[FREEZE]["w"], want["w"], rtol=1e-3)


def test_after_the_freeze_the_update_uses_the_frozen_variance(run):
  _, updates, states, *_ = run
  frozen = _inner(states[FREEZE]).nu
  for t in range(FREEZE, STEPS):
    s = _inner(states[t + 1])
    jax.tree.map(np.testing.assert_array_equal, s.nu, frozen)
    count = t + 1
    want = jax.tree.map(
        lambda m, v: -LR * (m / (1 - B1**count)) / (jnp.sqrt(v / (1 - B2**FREEZE)) + EPS), s.mu, frozen)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8), updates[t], want)


def test_worker_and_server_errors_are_conserved(run):
  """Σ_t m_t + mean_i(δ_i) + Σ_i δ̄_i == Σ_t mean_i(β1·m_{t−1} + (1−β1)·g_i,t) over the compressed steps."""
  grads, _, states, *_ = run
  fed = jax.tree.map(jnp.zeros_like, PARAMS)
  delivered = jax.tree.map(jnp.zeros_like, PARAMS)
  for t in range(FREEZE, STEPS):
    before, after = _inner(states[t]), _inner(states[t + 1])
    fed = jax.tree.map(lambda f, m, g: f + (B1 * m + (1 - B1) * g).mean(0), fed, before.mu, grads[t])
    delivered = jax.tree.map(lambda d, m: d + m, delivered, after.mu)
  errors = _inner(states[-1]).compressed
  worker, server = errors.local.residual, errors.shard.residual
  total = jax.tree.map(lambda d, e, s: d + e.mean(0) + s.sum(0), delivered, worker, server)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-5), total, fed)
  # Both errors are real (the identity fails without them), and the worker errors differ between workers.
  gap = jax.tree.map(lambda d, f: float(jnp.max(jnp.abs(d - f))), delivered, fed)
  assert gap["w"] > 1e-2 and gap["b"] > 1e-2
  assert float(jnp.max(jnp.abs(server["w"]))) > 1e-2 and float(jnp.max(jnp.abs(worker["w"]))) > 1e-2
  assert not np.allclose(worker["w"][0], worker["w"][1])
  # "b" is too small to split: no server error.
  np.testing.assert_array_equal(server["b"], 0.0)
  # Worker j keeps the server error of its own shard only (80 values: 200 values in 4 aligned chunks).
  nonzero = np.asarray(server["w"]).reshape(W, -1) != 0
  for j in range(W):
    outside = np.ones(200, bool)
    outside[80 * j:80 * (j + 1)] = False
    assert not nonzero[j][outside].any()


def test_exact_bytes_in_both_stages(run):
  *_, metrics, step = run
  assert step._cache_size() == 1  # pylint: disable=protected-access  # the switch is traced, not re-compiled
  n_w, n_b = 200, 3
  f32 = 4 * (n_w + n_b)
  for t in range(FREEZE):  # warm-up: every gradient in float32; a ring all-reduce brings 2(N-1)/N of each
    m = metrics[t]
    assert m["bytes_on_wire"] == m["float_bytes"] == m["float32_bytes"] == f32
    assert m["compressed_bytes_on_wire"] == 0 and m["two_phase_tensors"] == 0
    assert m["received_bytes"] == transport.allreduce_received(4 * n_w, W) + transport.allreduce_received(4 * n_b, W) == 1218
  # After the freeze, per worker: "w" is cut into 4 chunks of 80 values (ceil(200/4) rounded up to 40);
  # phase 1 hands 4 chunk payloads of 80/8 = 10 sign bytes + a float32 scale, phase 2 one shard
  # payload of 14 bytes; "b" goes to the all-gather as 1 sign byte + 4; plus one non-finite flag
  # byte per compressed tensor, riding its gather: "b"'s all-gather, "w"'s shards' (N - 1 arrive of each).
  handed = 4 * 14 + 14 + (1 + 4) + 2
  received = 3 * 14 + 3 * 14 + 3 * 5 + 3 * 1 + 3 * 1
  want = plan.traffic(OneBitAdamSign(), n_w, W, "two_phase")
  assert (want.sent, want.received) == (4 * 14 + 14, 3 * 14 + 3 * 14)
  for t in range(FREEZE, STEPS):
    m = metrics[t]
    assert m["bytes_on_wire"] == m["compressed_bytes_on_wire"] == m["encoded_bytes"] == handed == 77
    assert m["received_bytes"] == received == 105
    assert m["float_bytes"] == 0 and m["float32_bytes"] == f32 and m["two_phase_tensors"] == 1


def test_same_numbers_under_every_layout():
  """The same updates, momentum, errors and bytes under vmap, pmap, shard_map and shard_map+vmap.

  Float rounding differs between layouts (the order of a mean), and Adam's
  direction m/(sqrt(v) + eps) magnifies it where the mean gradient nearly
  cancels (v is tiny there): updates are compared with rtol 1e-4.
  """
  results = run_layouts(_make_tx, PARAMS, _grads, W, steps=FREEZE + 1)
  assert set(results) == {"vmap", "pmap", "shard_map", "shard_map+vmap"}
  ref_outs, ref_metrics, ref_state = results["vmap"]
  for layout, (outs, m, state) in results.items():
    for a, b in zip(ref_outs, outs):
      jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-7, err_msg=layout), a, b)
    assert {k: float(v) for k, v in m.items()} == {k: float(v) for k, v in ref_metrics.items()}, layout
    got, want = _inner(state), _inner(ref_state)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-6, err_msg=layout),
                 (got.mu, got.nu, got.compressed.local.residual, got.compressed.shard.residual),
                 (want.mu, want.nu, want.compressed.local.residual, want.compressed.shard.residual))
  assert float(ref_metrics["bytes_on_wire"]) == 77  # the last step was compressed


def test_the_one_bit_code():
  x = jnp.array([3.0, -1.0, 0.0, -2.0, 0.5])
  c = OneBitAdamSign()
  encode, decode = jax.jit(c.encode), jax.jit(c.decode, static_argnums=1)  # one program each, not eager ops
  payload = encode(x, None, None)
  scale = np.sqrt(np.mean(np.square(np.asarray(x))))  # ||x||_2 / sqrt(d)
  np.testing.assert_allclose(payload.scale, scale, rtol=1e-6)
  np.testing.assert_allclose(decode(payload, x.shape), scale * np.array([1, -1, 1, -1, 1]), rtol=1e-6)
  assert jaxcomp.core.tree_nbytes(payload) == 1 + 4
  np.testing.assert_array_equal(decode(encode(jnp.zeros(9), None, None), (9,)), 0.0)


def test_the_registry_wrapper_is_onebit_adam_with_the_optimizers_learning_rate():
  """make_optimizer("onebit_adam", optax.sgd(lr), ...) (what a config builds) == onebit_adam(lr, ...)."""
  schedule = optax.linear_schedule(0.1, 0.01, 4)
  kwargs = dict(freeze_step=2, axis_name=None, seed=1, skip=None, min_size=4)  # what experiments.train passes
  a = jaxcomp.make_optimizer("onebit_adam", optax.sgd(schedule), **kwargs)
  b = jaxcomp.onebit_adam(schedule, **kwargs)
  params = {"w": jnp.zeros(50), "tiny": jnp.zeros(2)}
  sa, sb = a.init(params), b.init(params)
  update_a, update_b = jax.jit(a.update), jax.jit(b.update)
  for t in range(4):
    g = jax.tree.map(lambda p: p + jnp.cos(jnp.arange(p.size) + t), params)
    ua, sa = update_a(g, sa, params)
    ub, sb = update_b(g, sb, params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), ua, ub)
    assert float(jaxcomp.metrics(sa)["bytes_on_wire"]) == float(jaxcomp.metrics(sb)["bytes_on_wire"])
  # min_size=4 kept "tiny" in float after the freeze; "w" went through 1 bit.
  m = jaxcomp.metrics(sa)
  assert float(m["float_bytes"]) == 8 and float(m["compressed_bytes_on_wire"]) == 7 + 4  # no flag: one worker
  assert "onebit_adam" in jaxcomp.compressors.WRAPPERS and "onebit_adam" in jaxcomp.names()


def test_bad_arguments():
  for bad in (dict(freeze_step=-1), dict(freeze_step=0), dict(freeze_step=1.5), dict(freeze_step=True)):
    with pytest.raises(ValueError, match="freeze_step"):
      jaxcomp.onebit_adam(0.1, **bad)
  for name, value in (("b1", 1.0), ("b1", -0.1), ("b2", 1.0), ("b2", 1.5)):
    with pytest.raises(ValueError, match=name):
      jaxcomp.onebit_adam(0.1, freeze_step=1, **{name: value})
  for eps in (0.0, -1e-8):
    with pytest.raises(ValueError, match="eps"):
      jaxcomp.onebit_adam(0.1, freeze_step=1, eps=eps)
  with pytest.raises(TypeError):
    jaxcomp.onebit_adam(0.1)  # freeze_step is required
  with pytest.raises(TypeError, match="fraction"):
    jaxcomp.onebit_adam(0.1, freeze_step=1, fraction=0.1)
  with pytest.raises(ValueError, match="error_feedback"):
    jaxcomp.onebit_adam(0.1, freeze_step=1, error_feedback=False)
  with pytest.raises(ValueError, match="exchange"):
    jaxcomp.onebit_adam(0.1, freeze_step=1, exchange="ring")
  with pytest.raises(ValueError, match="make_optimizer"):
    jaxcomp.get_transform("onebit_adam", freeze_step=1)
  # 1-bit Adam is the optimizer: one with moments of its own after it is refused.
  for opt in (optax.sgd(0.1, momentum=0.9), optax.adam(0.1)):
    with pytest.raises(ValueError, match="optimizer='sgd'"):
      jaxcomp.make_optimizer("onebit_adam", opt, freeze_step=1).init(PARAMS)
  scale_by_onebit_adam(freeze_step=1).init(PARAMS)  # the defaults are valid
