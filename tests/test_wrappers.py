"""optax wrappers around a compressed chain (jaxcomp.multi_steps, jaxcomp.apply_if_finite).

Each runs under vmap and shard_map (8 host devices) and gives the numbers of a
reference: the plain chain on what the wrapper should hand it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel

from _layouts import init_state, make_runners

N = 8
LAYOUTS = ("vmap", "shard_map")
PARAMS = {"w": jnp.zeros((6, 5)), "b": jnp.zeros(5)}


def _chain(axis):
  return optax.chain(jaxcomp.terngrad(axis_name=axis), optax.sgd(0.1, momentum=0.9))


def _grads(step):
  k1, k2 = jax.random.split(jax.random.PRNGKey(10 + step))
  return {"w": jax.random.normal(k1, (N, 6, 5)), "b": jax.random.normal(k2, (N, 5))}


def _run(make_tx, grads, layouts=LAYOUTS):
  """{layout: [(updates, metrics as floats) per step]} from the same initial state."""
  runners = make_runners(make_tx, N)
  out = {}
  for layout in layouts:
    state, steps = init_state(make_tx, PARAMS, N), []
    for g in grads:
      upd, state = runners[layout](g, state)
      state = jax.device_get(state)
      steps.append((jax.device_get(upd), {k: float(v) for k, v in jaxcomp.metrics(state).items()}))
    out[layout] = steps
  return out


def _assert_same(a, b, what):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, err_msg=what), a, b)


def test_multi_steps_is_the_mean_of_k_gradients_exchanged_once():
  k, grads = 2, [_grads(t) for t in range(4)]
  got = _run(lambda axis: jaxcomp.multi_steps(_chain(axis), k), grads)
  # The reference: the chain itself, once per window, on each worker's mean of the window's gradients.
  means = [jax.tree.map(lambda a, b: (a + b) / k, grads[t], grads[t + 1]) for t in (0, 2)]
  ref = _run(_chain, means, layouts=("vmap",))["vmap"]
  for layout, steps in got.items():
    for t, (upd, m) in enumerate(steps):
      if t % k == k - 1:  # exchanged: the chain's update and bytes
        ref_upd, ref_m = ref[t // k]
        _assert_same(upd, ref_upd, f"{layout} step {t}")
        assert m == ref_m, (layout, t)
        assert m["bytes_on_wire"] > 0
      else:  # accumulated only: no update, nothing on the wire, the per-step reference sizes kept
        assert all(not np.any(u) for u in jax.tree.leaves(upd)), (layout, t)
        assert m["bytes_on_wire"] == m["encoded_bytes"] == 0, (layout, t)
        assert m["float32_bytes"] == ref[0][1]["float32_bytes"]
  _assert_same(got["vmap"], got["shard_map"], "layouts")


def test_apply_if_finite_skips_on_every_worker_together():
  grads = [_grads(t) for t in range(3)]
  grads[1]["w"] = grads[1]["w"].at[3, 0, 0].set(jnp.nan)  # one worker, one tensor
  got = _run(lambda axis: jaxcomp.apply_if_finite(_chain(axis), 2, axis_name=axis), grads)
  # The reference: the chain on the finite steps only.
  ref = _run(_chain, [grads[0], grads[2]], layouts=("vmap",))["vmap"]
  for layout, steps in got.items():
    for t, r in ((0, ref[0]), (2, ref[1])):
      _assert_same(steps[t][0], r[0], f"{layout} step {t}")
      # One flag byte per worker for the agreement, on top of the chain's bytes.
      assert steps[t][1]["bytes_on_wire"] == r[1]["bytes_on_wire"] + 1, layout
    upd, m = steps[1]  # skipped by every worker: no update, only the flag crossed the wire
    assert all(not np.any(u) for u in jax.tree.leaves(upd)), layout
    assert m["bytes_on_wire"] == 1 and m["float32_bytes"] == ref[0][1]["float32_bytes"], layout
  _assert_same(got["vmap"], got["shard_map"], "layouts")


@pytest.mark.timeout(900)  # 293 s beside a second suite run and a CPU hog
def test_apply_if_finite_state_and_giving_up():
  tx = jaxcomp.apply_if_finite(_chain("w"), 0, axis_name="w")
  state = parallel.replicate_workers(tx.init(PARAMS), 2)
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w"))
  g = jax.tree.map(lambda a: jnp.ones((2,) + a.shape), PARAMS)
  g["b"] = g["b"].at[1, 0].set(jnp.inf)
  upd, state = step(g, state)
  # max_consecutive_errors=0: the first bad step already goes through (as optax), as NaN on every worker.
  assert np.isnan(upd["b"]).all() and int(state.total_notfinite) == 1 and not bool(state.last_finite)
  assert float(jaxcomp.metrics(state)["nonfinite_tensors"]) == 1
  # One worker (no axis): a bad step is skipped, and no flag crosses a wire.
  tx = jaxcomp.apply_if_finite(_chain(None), 2)
  upd, state = tx.update(jax.tree.map(lambda a: a[1], g), tx.init(PARAMS), PARAMS)
  assert all(not np.any(u) for u in jax.tree.leaves(upd)) and int(state.notfinite_count) == 1
  assert float(jaxcomp.metrics(state)["bytes_on_wire"]) == 0


@pytest.mark.parametrize("wrap", [lambda c: optax.MultiSteps(c, 2), lambda c: optax.apply_if_finite(c, 2)])
def test_optax_wrappers_around_a_compressor_are_refused_by_path(wrap):
  state = {"opt": wrap(_chain("w")).init(PARAMS)}
  for layout_fn in (lambda s: parallel.replicate_workers(s, N), parallel.worker_axes,
                    lambda s: parallel.worker_specs(s, "d")):
    with pytest.raises(ValueError, match=r"opt_state\['opt'\].*jaxcomp\.(multi_steps|apply_if_finite)"):
      layout_fn(state)
  # The same wrappers around an optimizer that follows the compressor hold no per-worker state: accepted.
  tx = optax.chain(jaxcomp.terngrad(axis_name="w"), wrap(optax.sgd(0.1)))
  parallel.worker_axes(parallel.replicate_workers(tx.init(PARAMS), N))


def test_multi_steps_bad_schedule():
  with pytest.raises(TypeError, match="int"):
    jaxcomp.multi_steps(_chain("w"), lambda step: 2)
  with pytest.raises(ValueError, match="k must be"):
    jaxcomp.multi_steps(_chain("w"), 0)
