"""Streaming DiLoCo (arXiv:2501.18512, Alg. 2) as jaxcomp.diloco's fragments, delay and mix: against a
direct transcription of the algorithm, the fragments' schedule and bytes, one fragment as DiLoCo."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp

from _layouts import run_layouts, vmap_train

diloco_lib = importlib.import_module("jaxcomp.compressors.diloco")  # the package exports the function

pytestmark = pytest.mark.accelerator

W, H, LR = 3, 4, 0.1
SHAPES = {"a": (4, 3), "b": (5,), "c": (2, 2), "d": (6,)}


def _params():
  return {k: jnp.full(s, 0.5, jnp.float32) for k, s in SHAPES.items()}


def _grads(t):
  keys = jax.random.split(jax.random.PRNGKey(t), len(SHAPES))
  return {k: jax.random.normal(key, (W,) + s) for key, (k, s) in zip(keys, SHAPES.items())}


def _run(tx, steps):
  """``tx`` over W vmapped workers; the shared params, each worker's local params and each step's state."""
  params, states = vmap_train(tx, _grads, steps, _params(), W)
  local = jax.tree.map(lambda p, o: p + o, params, states[-1].offset.residual)
  return params, local, states


def _reference(fragments, delay, mix, steps):
  """Alg. 2, transcribed: inner SGD on every worker; per fragment p, at the inner step t with
  t mod H = s_p the outer gradient θ_p − θ_m,p is sent; τ steps later (at once for τ = 0) the outer
  Nesterov step applies its mean to θ_p and each worker's fragment becomes α θ_m,p + (1 − α) θ_p
  (θ_p itself for τ = 0)."""
  names = list(SHAPES)
  of = diloco_lib.fragment_of_leaves([int(np.prod(SHAPES[k])) for k in names], fragments)
  parts = [[k for k, f in zip(names, of) if f == p] for p in range(fragments)]
  theta = {k: np.asarray(v, np.float64) for k, v in _params().items()}
  local = [dict(theta) for _ in range(W)]
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  outer_states = [outer.init({k: theta[k] for k in part}) for part in parts]
  pending = [None] * fragments

  def outer_step(p, deltas):
    nonlocal theta
    mean = {k: np.mean([d[k] for d in deltas], axis=0) for k in parts[p]}
    u, outer_states[p] = outer.update(mean, outer_states[p], {k: theta[k] for k in parts[p]})
    theta = {**theta, **{k: theta[k] + np.asarray(u[k]) for k in parts[p]}}

  for t in range(steps):
    g = _grads(t)
    local = [{k: v - LR * np.asarray(g[k][m]) for k, v in local[m].items()} for m in range(W)]
    for p in range(fragments):
      s = diloco_lib.send_step(p, fragments, H)
      if delay and t % H == (s + delay) % H and pending[p] is not None:
        outer_step(p, pending[p])
        local = [{**lm, **{k: mix * lm[k] + (1 - mix) * theta[k] for k in parts[p]}} for lm in local]
      if t % H == s:
        deltas = [{k: theta[k] - lm[k] for k in parts[p]} for lm in local]
        if delay:
          pending[p] = deltas
        else:
          outer_step(p, deltas)
          local = [{**lm, **{k: theta[k] for k in parts[p]}} for lm in local]
  return theta, local


@pytest.mark.parametrize("fragments, delay", [(2, 0), (3, 1), (2, 2), ("tensors", 1)])
def test_matches_algorithm_2(fragments, delay):
  steps = 3 * H + 1
  tx = jaxcomp.diloco(optax.sgd(LR), H, fragments=fragments, delay=delay, mix=0.5, axis_name="w")
  params, local, _ = _run(tx, steps)
  count = len(SHAPES) if fragments == "tensors" else fragments
  theta, ref_local = _reference(count, delay, 0.5, steps)
  for k in SHAPES:
    np.testing.assert_allclose(params[k], theta[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for m in range(W):
      np.testing.assert_allclose(local[k][m], ref_local[m][k], rtol=1e-5, atol=1e-6, err_msg=f"{k} worker {m}")


def test_one_fragment_without_delay_is_diloco_bit_for_bit():
  """The streaming arguments at their DiLoCo values (one fragment, τ = 0; α unused) give DiLoCo's
  bits; tests/golden/exchange.json holds DiLoCo's digests from before the fragments existed."""
  inner = optax.adamw(0.05, weight_decay=0.1)
  ref, ref_local, ref_states = _run(jaxcomp.diloco(inner, H, axis_name="w", exchange="int8"), 2 * H)
  got, got_local, states = _run(jaxcomp.diloco(inner, H, fragments=1, delay=0, mix=0.2, axis_name="w",
                                               exchange="int8"), 2 * H)
  jax.tree.map(np.testing.assert_array_equal, (got, got_local), (ref, ref_local))
  jax.tree.map(np.testing.assert_array_equal, states, ref_states)
  assert states[-1].pending is None


@pytest.mark.parametrize("delay", [0, 1])
def test_fragments_spread_the_bytes_over_the_inner_steps(delay):
  """F fragments: each step of a window moves one fragment's pseudo-gradient (τ steps after its send),
  the window moves the model once, and the largest step is the largest fragment, not the model."""
  sizes = [int(np.prod(s)) for s in SHAPES.values()]
  of = diloco_lib.fragment_of_leaves(sizes, 4)
  frag_bytes = [4 * sum(n for n, f in zip(sizes, of) if f == p) for p in range(4)]
  tx = jaxcomp.diloco(optax.sgd(LR), H, fragments=4, delay=delay, axis_name="w")
  _, _, states = _run(tx, 3 * H)
  wire = [int(jaxcomp.metrics(s)["bytes_on_wire"]) for s in states]
  expected = [frag_bytes[(t - delay) % H] if t >= delay else 0 for t in range(3 * H)]  # send_step(p, 4, 4) = p
  assert wire == expected
  assert int(jaxcomp.metrics(states[-1])["float32_bytes"]) == 4 * sum(sizes)  # the reference size, every step


def test_four_bit_outer_gradients():
  tx = jaxcomp.diloco(optax.sgd(LR), H, fragments=2, axis_name="w", exchange="fp4")
  params, _, states = _run(tx, H)
  sizes = {k: int(np.prod(s)) for k, s in SHAPES.items()}
  of = dict(zip(SHAPES, diloco_lib.fragment_of_leaves(list(sizes.values()), 2)))
  flags = 1  # the non-finite flag byte a tensor that rides the all-gather
  for t, state in enumerate(states):
    sent = [k for k in SHAPES if diloco_lib.send_step(of[k], 2, H) == t]
    assert int(jaxcomp.metrics(state)["bytes_on_wire"]) == sum(-(-sizes[k] // 2) + 4 + flags for k in sent)
  assert all(np.isfinite(np.asarray(v)).all() for v in params.values())


def test_fragment_of_leaves():
  assert diloco_lib.fragment_of_leaves([10, 10, 10, 10], 2) == [0, 0, 1, 1]
  assert diloco_lib.fragment_of_leaves([100, 1, 1, 1], 3) == [0, 1, 2, 2]  # a share reached: the next fragment
  assert diloco_lib.fragment_of_leaves([1, 1, 1, 100], 3) == [0, 0, 1, 2]  # every fragment gets a tensor
  assert diloco_lib.fragment_of_leaves([5, 5, 5, 5, 5], 2, "strided") == [0, 1, 0, 1, 0]
  assert [diloco_lib.send_step(p, 4, 8) for p in range(4)] == [1, 3, 5, 7]
  assert diloco_lib.send_step(0, 1, 8) == 7  # one fragment: DiLoCo's outer step after the H-th inner step


def test_bad_arguments():
  with pytest.raises(ValueError, match="fragments"):
    jaxcomp.diloco(optax.sgd(0.1), 2, fragments=3)
  with pytest.raises(ValueError, match="delay"):
    jaxcomp.diloco(optax.sgd(0.1), 2, delay=2)
  with pytest.raises(ValueError, match="mix"):
    jaxcomp.diloco(optax.sgd(0.1), 2, delay=1, mix=1.5)
  with pytest.raises(ValueError, match="fragments"):
    jaxcomp.diloco(optax.sgd(0.1), 8, fragments=5).init(_params())  # 4 tensors


def test_every_layout_agrees():
  def make_tx(axis):
    return jaxcomp.diloco(optax.adam(0.1), 2, fragments=2, delay=1, axis_name=axis, exchange="int8",
                          error_feedback=True)

  params = {"a": jnp.zeros((6, 9)), "b": jnp.zeros((7,))}
  grads = lambda t: {"a": jax.random.normal(jax.random.PRNGKey(t), (4, 6, 9)),
                     "b": jax.random.normal(jax.random.PRNGKey(50 + t), (4, 7))}
  results = run_layouts(make_tx, params, grads, 4, steps=4)
  ref_updates, ref_metrics, ref_state = results.pop("vmap")
  assert float(jnp.abs(ref_updates[1]["a"]).max()) > 0 and float(jnp.abs(ref_updates[2]["b"]).max()) > 0
  for layout, (updates, metrics, state) in results.items():
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, err_msg=layout), updates, ref_updates)
    assert {k: float(v) for k, v in metrics.items() if k not in diloco_lib.NORMS} == {
        k: float(v) for k, v in ref_metrics.items() if k not in diloco_lib.NORMS}, layout
    for k in diloco_lib.NORMS:  # float sums over the workers, in each layout's order
      np.testing.assert_allclose(float(metrics[k]), float(ref_metrics[k]), rtol=1e-6, err_msg=f"{layout} {k}")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, err_msg=layout), state, ref_state)
