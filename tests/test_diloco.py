"""DiLoCo (arXiv:2311.08105, Alg. 1): H = 1 against data-parallel training, silent inner steps
and their bytes, conservation with error feedback on the pseudo-gradient, every layout."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel

from _layouts import run_layouts, vmap_train, vmap_update

diloco_lib = importlib.import_module("jaxcomp.compressors.diloco")  # the package exports the function

pytestmark = pytest.mark.accelerator

W = 4


def _grads(t, shape=(W, 6, 5)):
  return {"w": jax.random.normal(jax.random.PRNGKey(t), shape), "b": jax.random.normal(jax.random.PRNGKey(100 + t), shape[:1] + (5,))}


def _params():
  return {"w": jnp.ones((6, 5)), "b": jnp.zeros(5)}


def _run(tx, grads_fn, steps, params):
  """Trains ``params`` with ``tx`` over W vmapped workers; returns the params and every state."""
  return vmap_train(tx, grads_fn, steps, params, W)


@pytest.mark.parametrize("same_grads", [True, False])
def test_h1_float_outer_sgd_lr1_is_data_parallel(same_grads):
  """H = 1, float exchange, outer SGD lr 1: AdamW when the workers' gradients agree; with
  differing gradients the identity holds for a linear inner optimizer (SGD with momentum is not
  linear per worker either, so plain SGD)."""
  adamw = optax.adamw(0.05, weight_decay=0.1)
  inner = adamw if same_grads else optax.sgd(0.05)
  tx = jaxcomp.diloco(inner, 1, outer=optax.sgd(1.0), axis_name="w")
  fn = (lambda t: jax.tree.map(lambda g: jnp.broadcast_to(g[:1], g.shape), _grads(t))) if same_grads else _grads
  ours, _ = _run(tx, fn, 5, _params())
  ref_tx = optax.chain(jaxcomp.compress(None, axis_name="w"), inner)
  ref, _ = _run(ref_tx, fn, 5, _params())
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), ours, ref)


def test_inner_steps_are_silent_and_local():
  """Between outer steps the shared parameters stay put and nothing crosses the wire; each
  worker's local parameters move with its own AdamW; the outer step sends the pseudo-gradient."""
  h = 3
  tx = jaxcomp.make_optimizer("diloco", optax.adam(0.1), inner_steps=h, axis_name="w")
  params = _params()
  state = parallel.replicate_workers(tx.init(params), W)
  axes = parallel.worker_axes(state)

  def worker(p, s, g):
    local = jaxcomp.local_params(s, p)
    u, s = tx.update(g, s, p)
    return u, s, local

  step = jax.jit(jax.vmap(worker, in_axes=(None, axes, 0), out_axes=(None, axes, 0), axis_name="w"))
  wire, float_bytes = [], 4 * (30 + 5)
  for t in range(2 * h):
    updates, state, local = step(params, state, _grads(t))
    m = jaxcomp.metrics(state)
    wire.append(int(m["bytes_on_wire"]))
    assert int(m["float32_bytes"]) == float_bytes  # the reference size, every step
    if t % h == 0:  # the first inner step starts from the shared parameters
      np.testing.assert_array_equal(local["w"], jnp.broadcast_to(params["w"], local["w"].shape))
    else:  # later ones from each worker's own
      assert float(jnp.abs(local["w"][0] - local["w"][1]).max()) > 0
    if t % h != h - 1:
      assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree.leaves(updates))
    params = optax.apply_updates(params, updates)
  assert wire == [0, 0, float_bytes] * 2
  assert int(state.inner_step) == 0 and float(jnp.abs(state.offset.residual["w"]).max()) == 0


def test_outer_nesterov_of_the_mean_pseudo_gradient():
  """The outer step is the paper's: SGD with Nesterov momentum (lr 0.7, 0.9) of mean_i Δ_i."""
  h, inner = 2, optax.sgd(0.1)
  tx = jaxcomp.diloco(inner, h, axis_name="w")
  params = _params()
  got, _ = _run(tx, _grads, 2 * h, params)
  outer, theta = optax.sgd(0.7, momentum=0.9, nesterov=True), params
  outer_state = outer.init(theta)
  for k in range(2):  # inner SGD: Δ_i = 0.1 Σ g_i over the window
    delta = jax.tree.map(lambda *g: 0.1 * sum(x.mean(0) for x in g), *[_grads(k * h + j) for j in range(h)])
    u, outer_state = outer.update(delta, outer_state, theta)
    theta = optax.apply_updates(theta, u)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, theta)


def test_outer_step_norms_in_the_metrics():
  """jaxcomp.metrics gives the outer step's norms (0 on the silent steps): each worker's Δ_i (mean
  over workers), mean_i Δ_i, the outer momentum after the step and the outer update."""
  h, lr = 2, 0.1
  tx = jaxcomp.diloco(optax.sgd(lr), h, axis_name="w")
  _, states = _run(tx, _grads, 2 * h, _params())
  norm = lambda tree: float(optax.tree.norm(tree))
  trace = jax.tree.map(jnp.zeros_like, _params())
  for t, state in enumerate(states):
    m = jaxcomp.metrics(state)
    if t % h != h - 1:
      assert all(float(m[k]) == 0.0 for k in diloco_lib.NORMS), t
      continue
    window = [_grads(t - j) for j in range(h)]  # inner SGD: Δ_i = lr Σ g_i over the window
    deltas = [jax.tree.map(lambda *g: lr * sum(x[i] for x in g), *window) for i in range(W)]
    mean = jax.tree.map(lambda *d: sum(d) / W, *deltas)
    trace = jax.tree.map(lambda g, m_: g + 0.9 * m_, mean, trace)
    update = jax.tree.map(lambda g, m_: 0.7 * (g + 0.9 * m_), mean, trace)
    expected = {"diloco_pseudo_grad_norm": np.mean([norm(d) for d in deltas]), "diloco_outer_grad_norm": norm(mean),
                "diloco_outer_state_norm": norm(trace), "diloco_outer_update_norm": norm(update)}
    for k, v in expected.items():
      np.testing.assert_allclose(float(m[k]), v, rtol=1e-5, err_msg=f"{k} at step {t}")


def test_error_feedback_conserves_the_pseudo_gradient():
  """int8 with error feedback on Δ: Σ averaged Δ over outer steps = mean_i (Σ Δ_i − residual_i)."""
  h, windows = 2, 4
  tx = jaxcomp.diloco(optax.sgd(1.0), h, outer=optax.sgd(1.0), axis_name="w", exchange="int8",
                      error_feedback=True)
  state = parallel.replicate_workers(tx.init(jnp.zeros((6, 9))), W)
  total_in, total_upd = jnp.zeros((W, 6, 9)), jnp.zeros((6, 9))
  for t in range(h * windows):
    g = jax.random.normal(jax.random.PRNGKey(t), (W, 6, 9)) * (1 + t % 3)
    upd, state = vmap_update(tx, g, state)
    total_in, total_upd = total_in + g, total_upd + upd
  residual = state.exchange.local.residual
  assert float(jnp.abs(residual).max()) > 0  # int8 dropped something, kept for later
  # Inner SGD lr 1: Δ_i is the sum of the window's gradients; outer SGD lr 1: the update is −mean Δ.
  np.testing.assert_allclose(-total_upd, (total_in - residual).mean(0), atol=2e-5)
  assert float(jaxcomp.metrics(state)["bytes_on_wire"]) < 4 * 54 / 3  # int8 on the wire


def test_every_layout_agrees():
  def make_tx(axis):
    return jaxcomp.diloco(optax.adam(0.1), 2, axis_name=axis, exchange="int8", error_feedback=True)

  results = run_layouts(make_tx, jnp.zeros((6, 9)), lambda t: jax.random.normal(jax.random.PRNGKey(t), (W, 6, 9)),
                        W, steps=4)
  ref_updates, ref_metrics, ref_state = results.pop("vmap")
  assert float(jnp.abs(ref_updates[1]).max()) > 0 and float(jnp.abs(ref_updates[2]).max()) == 0
  for layout, (updates, metrics, state) in results.items():
    for a, b in zip(updates, ref_updates):
      np.testing.assert_allclose(a, b, atol=1e-6, err_msg=layout)
    assert metrics == ref_metrics, layout
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, err_msg=layout), state, ref_state)


def test_bad_arguments():
  with pytest.raises(ValueError, match="inner_steps"):
    jaxcomp.diloco(optax.adamw(1e-3), 0)
  with pytest.raises(TypeError, match="not both"):
    jaxcomp.diloco(optax.adamw(1e-3), 2, outer=optax.sgd(1.0), outer_learning_rate=0.5)
  with pytest.raises(TypeError, match="float exchange"):
    jaxcomp.diloco(optax.adamw(1e-3), 2, fraction=0.1)
  with pytest.raises(ValueError, match="pseudo-gradients"):
    jaxcomp.diloco(optax.adamw(1e-3), 2, exchange="two_phase")
  assert jaxcomp.local_params({"no": "diloco"}, 1.0) == 1.0
