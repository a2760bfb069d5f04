"""The exchange gives the same numbers under vmap, pmap, shard_map and shard_map+vmap."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp
from jaxcomp import core, parallel
from jaxcomp.exchange import allgather

from _layouts import init_state, make_runners

N = 8


def _grads(step):
  k = jax.random.PRNGKey(100 + step)
  k1, k2, k3 = jax.random.split(k, 3)
  return {
      "conv": jax.random.normal(k1, (N, 5, 5, 3, 8)),
      "bias": jax.random.normal(k2, (N, 8)) * 0.1,
      "fc": jax.random.normal(k3, (N, 37, 11)),
  }


FACTORIES = {
    "terngrad": lambda axis: jaxcomp.terngrad(axis_name=axis),
    "terngrad_threefry_noshare": lambda axis: jaxcomp.terngrad(axis_name=axis, rng="threefry", scalar_sharing=False),
    "float": lambda axis: jaxcomp.compress(None, axis_name=axis),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_layouts_agree(name):
  assert len(jax.devices()) >= N, "tests/conftest.py should give 8 host devices"
  make_tx = FACTORIES[name]
  params = jax.tree.map(lambda g: g[0], _grads(0))
  results = {}
  for layout, run in make_runners(make_tx, N).items():
    state = init_state(make_tx, params, N)
    outs = []
    for step in range(2):
      upd, state = run(_grads(step), state)
      outs.append(upd)
    results[layout] = (outs, jaxcomp.metrics(state))
  assert set(results) == {"vmap", "pmap", "shard_map", "shard_map+vmap"}
  ref_outs, ref_metrics = results["vmap"]
  for layout, (outs, m) in results.items():
    for a, b in zip(ref_outs, outs):
      jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, err_msg=layout), a, b)
    for k in ref_metrics:
      assert float(ref_metrics[k]) == float(m[k]), (layout, k)


def test_float_baseline_is_the_mean():
  make_tx = FACTORIES["float"]
  g = _grads(0)
  params = jax.tree.map(lambda a: a[0], g)
  state = init_state(make_tx, params, N)
  upd, st = make_runners(make_tx, N)["vmap"](g, state)
  jax.tree.map(lambda u, a: np.testing.assert_allclose(u, a.mean(0), rtol=1e-6, atol=1e-7), upd, g)
  m = jaxcomp.metrics(st)
  assert float(m["bytes_on_wire"]) == float(m["float32_bytes"]) == 4 * sum(a[0].size for a in g.values())


def test_terngrad_mean_is_average_of_worker_decodes():
  """The decode-once aggregate equals decoding each worker's payload and averaging."""
  comp = jaxcomp.TernGrad()
  xs = jax.random.normal(jax.random.PRNGKey(0), (N, 64, 3))
  keys = jax.random.split(jax.random.PRNGKey(1), N)

  def worker(x, k):
    ex = allgather.exchange(comp, x, k, "w", need_own=True)
    return ex.mean, ex.own

  mean, owns = jax.jit(jax.vmap(worker, axis_name="w", out_axes=(None, 0)))(xs, keys)  # one program
  np.testing.assert_allclose(mean, owns.mean(0), rtol=1e-6, atol=1e-7)


def test_workers_draw_independently():
  """The transform folds in lax.axis_index: identical inputs on all workers give different codes.

  With error feedback on, each worker's residual is its input minus its own
  decoded message, so the residuals show the codes each worker drew.
  """
  tx = jaxcomp.terngrad(axis_name="w", clip_sigma=None, error_feedback=True)
  x = jnp.linspace(-1, 1, 4000)
  state = parallel.replicate_workers(tx.init(x), 4)
  axes = parallel.worker_axes(state)
  _, state = jax.jit(jax.vmap(tx.update, in_axes=(None, axes), out_axes=(None, axes), axis_name="w"))(x, state)
  owns = x - state.local.residual
  for i in range(4):
    for j in range(i + 1, 4):
      assert not np.array_equal(owns[i], owns[j])


def test_axis_helpers():
  def f(x):
    return parallel.axis_index(("a", "b")), parallel.axis_size(("a", "b")), parallel.all_gather(x, ("a", "b"))

  x = jnp.arange(6).reshape(2, 3)
  idx, size, gathered = jax.vmap(jax.vmap(f, axis_name="b"), axis_name="a")(x)
  np.testing.assert_array_equal(idx, np.arange(6).reshape(2, 3))
  assert int(size[0, 0]) == 6
  np.testing.assert_array_equal(gathered[0, 0], np.arange(6))
  with pytest.raises(TypeError):
    parallel.axis_size(("a", 3))


def test_reductions_match_lax_under_vmap_and_devices():
  """parallel.psum/pmean/pmax over a vmap axis (halving) equal lax's, for odd sizes too."""
  for n in (1, 3, 7, 8):
    x = jax.random.normal(jax.random.PRNGKey(n), (n, 33))
    xi = jax.random.randint(jax.random.PRNGKey(n), (n, 5), -1, 2).astype(jnp.int8)
    got = jax.vmap(lambda a: (parallel.psum(a, "w"), parallel.pmean(a, "w"), parallel.pmax(a, "w")),
                   axis_name="w", out_axes=None)(x)
    np.testing.assert_allclose(got[0], x.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2], x.max(0))
    s = jax.vmap(lambda a: parallel.psum(a, "w"), axis_name="w", out_axes=None)(xi)
    assert s.dtype == jnp.int8  # the dtype of the input, as lax.psum
    np.testing.assert_array_equal(core.sum_leading(xi), np.asarray(xi, np.int32).sum(0))
  # Over a device axis (shard_map) the real collective runs; same numbers.
  from _layouts import _mesh
  from jax.sharding import PartitionSpec as P
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 5))
  f = jax.shard_map(lambda a: parallel.pmean(a[0], "d"), mesh=_mesh(8), in_specs=P("d"), out_specs=P())
  np.testing.assert_allclose(jax.jit(f)(x), x.mean(0), rtol=1e-6)


@pytest.mark.parametrize("exchange", ["all_gather", "two_phase"])
def test_collectives_in_pieces_give_the_same_numbers(monkeypatch, exchange):
  # On CPU the device collectives go in pieces of at most PIECE_BYTES; with a
  # tiny PIECE_BYTES every payload here is split into many pieces, and the
  # devices' result must equal the vmap layout's (which never splits).
  monkeypatch.setattr(parallel, "PIECE_BYTES", 16)
  assert parallel.pieces_for(100) == 7 and parallel.pieces_for(16) == 1
  make_tx = lambda axis: jaxcomp.terngrad(axis_name=axis, exchange=exchange, min_size=64)
  params = jax.tree.map(lambda g: g[0], _grads(0))
  runners = make_runners(make_tx, N)
  results = {}
  for layout in ("vmap", "shard_map", "shard_map+vmap"):
    state = init_state(make_tx, params, N)
    upd, state = runners[layout](_grads(0), state)
    results[layout] = upd
  for layout in ("shard_map", "shard_map+vmap"):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, err_msg=layout),
                 results["vmap"], results[layout])
