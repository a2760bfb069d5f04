"""Model-sharded parameters (``jaxcomp.per_shard``): each device compresses its own shard.

A (data x model) mesh of 2 x 2 host CPU devices, parameters sharded over
``model``, the exchange over ``data`` inside ``jax.shard_map(...,
axis_names={"data"})``, with Auto and with Explicit axis types. The reference
for shard k is the same transform on the k-th slices alone, under ``vmap``
over the 2 workers: the updates, states and per-device counts must be its.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel

from _layouts import device_update

D, M = 2, 2
# name -> (shape, its spec over "model"): split along the last axis, along the rows, or not at all.
TENSORS = {
    "kernel": ((3, 3, 2, 8), P(None, None, None, "model")),
    "rows": ((8, 6), P("model", None)),
    "bias": ((12,), P("model")),
    "scale": ((5,), P()),
}
NAMES = sorted(jaxcomp.REGISTRY)
KWARGS = {"dgc": {"warmup_steps": 0}}


def _mesh(kind):
  return jax.make_mesh((D, M), ("data", "model"), axis_types=(kind, kind), devices=jax.devices()[:D * M])


def _grads(step):
  rng = np.random.default_rng(200 + step)
  return {k: rng.standard_normal((D,) + s).astype(np.float32) for k, (s, _) in TENSORS.items()}


def _shard(a, spec, k, lead=0):
  """Model shard ``k`` of ``a`` (whose first ``lead`` axes are not in ``spec``)."""
  for axis, entry in enumerate(spec):
    if entry == "model":
      n = a.shape[lead + axis] // M
      a = np.take(a, np.arange(k * n, (k + 1) * n), axis=lead + axis)
  return a


def _sharded_run(name, kind, steps=2):
  """``steps`` updates of the per-shard transform on the mesh: [(updates, metrics)], final state."""
  mesh = _mesh(kind)
  specs = {k: spec for k, (_, spec) in TENSORS.items()}
  params = jax.device_put({k: jnp.zeros(s) for k, (s, _) in TENSORS.items()},
                          {k: NamedSharding(mesh, spec) for k, spec in specs.items()})
  tx = jaxcomp.per_shard(jaxcomp.get_transform(name, axis_name="data", **KWARGS.get(name, {})), "model")
  with jax.set_mesh(mesh):
    state = parallel.replicate_workers(tx.init(params), D)
    state = jax.device_put(state, parallel.worker_shardings(state, mesh, "data"))
    wspecs = parallel.worker_specs(state, "data")
    step = jax.jit(jax.shard_map(device_update(tx), in_specs=(P("data"), wspecs), out_specs=(P(), wspecs),
                                 axis_names={"data"}))
    gspecs = {k: NamedSharding(mesh, P("data", *spec)) for k, spec in specs.items()}
    outs = []
    for t in range(steps):
      upd, state = step(jax.device_put(_grads(t), gspecs), state)
      outs.append((jax.tree.map(np.asarray, upd), {k: float(v) for k, v in jaxcomp.metrics(state).items()}))
    assert step._cache_size() == 1, "the state's layout changed between steps"
  return outs, state


def _references(name, steps=2):
  """Per model shard k, the same transform on shard k's slices alone, under vmap over the workers.

  Every shard has the same shapes: one transform and one compiled step serve them all.
  """
  tx = jaxcomp.get_transform(name, axis_name="data", **KWARGS.get(name, {}))
  params = {n: jnp.zeros(_shard(np.zeros(s), spec, 0).shape) for n, (s, spec) in TENSORS.items()}
  initial = parallel.replicate_workers(tx.init(params), D)
  axes = parallel.worker_axes(initial)
  step = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="data"))
  refs = []
  for k in range(M):
    state, outs = initial, []
    for t in range(steps):
      g = {n: _shard(a, TENSORS[n][1], k, lead=1) for n, a in _grads(t).items()}
      upd, state = step(g, state)
      outs.append((jax.tree.map(np.asarray, upd), {n: float(v) for n, v in jaxcomp.metrics(state).items()}))
    refs.append(outs)
  return refs


@pytest.fixture(scope="module", params=NAMES)
def runs(request):
  name = request.param
  return name, {kind: _sharded_run(name, kind) for kind in (AxisType.Auto, AxisType.Explicit)}


def test_each_shard_is_compressed_alone(runs):
  """Every device's updates and counts are those of its shard compressed alone (Auto axes)."""
  name, by_kind = runs
  outs, _ = by_kind[AxisType.Auto]
  refs = _references(name)
  for t, (upd, metrics) in enumerate(outs):
    for n, (_, spec) in TENSORS.items():
      for k in range(M):
        np.testing.assert_allclose(_shard(upd[n], spec, k), refs[k][t][0][n], rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name} step {t} {n} shard {k}")
    for key in ("bytes_on_wire", "float32_bytes", "encoded_bytes"):
      # per device: the mean over the model devices of each shard's own count
      assert metrics[key] == pytest.approx(np.mean([r[t][1][key] for r in refs]), rel=1e-12), (name, t, key)
  shard_floats = sum(4 * int(np.prod(_shard(np.zeros(s), spec, 0).shape)) for s, spec in TENSORS.values())
  assert outs[0][1]["float32_bytes"] == shard_floats


def test_explicit_axes_give_the_auto_numbers(runs):
  """The same updates, bit for bit, and the same counts with AxisType.Explicit as with Auto."""
  name, by_kind = runs
  (auto, _), (explicit, state) = by_kind[AxisType.Auto], by_kind[AxisType.Explicit]
  for (ua, ma), (ue, me) in zip(auto, explicit):
    for n in TENSORS:
      np.testing.assert_array_equal(ua[n], ue[n], err_msg=f"{name} {n}")
    assert ma == me
  # The state stays split: each device holds one model shard's entry of every leaf (and one
  # worker's, of a worker-local leaf).
  for leaf in jax.tree.leaves(state):
    per_device = int(np.prod(leaf.sharding.shard_shape(leaf.shape)))
    assert per_device * M in (leaf.size, leaf.size // D), (name, leaf.shape, leaf.sharding.spec)


def test_parameters_off_the_mesh_are_refused():
  tx = jaxcomp.per_shard(jaxcomp.terngrad(axis_name="data"))
  with pytest.raises(ValueError, match=r"params\['w'\] has no NamedSharding"):
    tx.init({"w": np.zeros((4, 4), np.float32)})


def test_parameters_split_over_the_worker_axis_are_refused():
  mesh = _mesh(AxisType.Auto)
  params = jax.device_put({"w": jnp.zeros((4, 4))}, {"w": NamedSharding(mesh, P("data", "model"))})
  with pytest.raises(ValueError, match=r"params\['w'\] is sharded over \['data'\]"):
    jaxcomp.per_shard(jaxcomp.terngrad(axis_name="data")).init(params)


def test_a_chain_with_momentum_is_per_shard_too():
  """optax's own state (momentum) follows the same per-device layout."""
  mesh = _mesh(AxisType.Auto)
  params = jax.device_put({"w": jnp.zeros((6, 12))}, {"w": NamedSharding(mesh, P(None, "model"))})
  tx = jaxcomp.per_shard(optax.chain(jaxcomp.int8(axis_name="data"), optax.sgd(0.1, momentum=0.9)))
  state = tx.init(params)
  trace = state.inner[1][0].trace["w"]
  assert trace.shape == (M, 6, 6) and trace.sharding.shard_shape(trace.shape) == (1, 6, 6)


def test_explicit_shards_without_per_shard_are_refused():
  """Under Explicit axes a compressor alone meets a split gradient: an error that names the way."""
  mesh = _mesh(AxisType.Explicit)
  params = jax.device_put({"w": jnp.zeros((4, 4))}, {"w": NamedSharding(mesh, P(None, "model"))})
  tx = jaxcomp.terngrad(axis_name="data")
  state = parallel.replicate_workers(tx.init({"w": jnp.zeros((4, 4))}), D)
  wspecs = parallel.worker_specs(state, "data")

  def worker(p, s):
    g = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(parallel.vary(p, "data"))
    upd, s = tx.update(g, parallel.worker_slice(s, 0))
    return upd, parallel.expand_workers(s)

  with jax.set_mesh(mesh):
    step = jax.jit(jax.shard_map(worker, in_specs=(P(), wspecs), out_specs=(P(), wspecs), axis_names={"data"}))
    pattern = r"split over the mesh axes \['model'\].*jaxcomp.per_shard\(tx, \('model',\)\)"
    with pytest.raises(ValueError, match=pattern):
      step(params, state)


def test_outside_shard_map_the_mesh_comes_from_the_parameters():
  """One worker (axis_name=None), no mesh context: jitted and eager updates run on the parameters' mesh."""
  mesh = jax.make_mesh((M,), ("model",), axis_types=(AxisType.Auto,), devices=jax.devices()[:M])
  on_mesh = lambda tree: jax.device_put(tree, {"w": NamedSharding(mesh, P(None, "model"))})
  params, g = on_mesh({"w": jnp.ones((4, 6))}), on_mesh({"w": jnp.arange(24.0).reshape(4, 6)})
  tx = jaxcomp.per_shard(optax.chain(jaxcomp.int8(), optax.sgd(0.1)), "model")
  state = tx.init(params)
  for update in (jax.jit(tx.update), tx.update):
    upd, state = update(g, state, params)
    # within a shard's int8 step (with error feedback: half of one, plus the residual)
    np.testing.assert_allclose(upd["w"], -0.1 * np.arange(24.0).reshape(4, 6), atol=0.1 * 23 / 127 + 1e-6)
    assert int(jaxcomp.metrics(state)["bytes_on_wire"]) == 4 * 3 + 4  # a shard's int8 codes and its scale
