"""nnx.Optimizer with a compressed chain under nnx.vmap (jaxcomp.flax_nnx) gives plain optax's numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcomp
from jaxcomp import parallel

pytestmark = pytest.mark.accelerator

W = 4


class Net(nnx.Module):
  """A module named like a field of the optimizer state ("local"): not per worker for that."""

  def __init__(self, rngs):
    self.hidden = nnx.Linear(6, 5, rngs=rngs)
    self.local = nnx.Linear(5, 3, rngs=rngs)

  def __call__(self, x):
    return self.local(jnp.tanh(self.hidden(x)))


def _loss(model, batch):
  x, y = batch
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def _tx():  # error feedback (per-worker residuals) and momentum (shared)
  return optax.chain(jaxcomp.threelc(axis_name="w"), optax.sgd(0.1, momentum=0.9))


def test_nnx_optimizer_under_nnx_vmap_matches_optax():
  x = jax.random.normal(jax.random.PRNGKey(0), (W, 8, 6))
  batch = (x, jnp.argmax(x[..., :3], -1))
  model = Net(nnx.Rngs(0))
  graphdef, params = nnx.split(Net(nnx.Rngs(0)), nnx.Param)
  optimizer = nnx.Optimizer(model, _tx(), wrt=nnx.Param)
  jaxcomp.flax_nnx.replicate_workers(optimizer, W)
  per_worker = nnx.to_flat_state(nnx.state(optimizer, jaxcomp.flax_nnx.worker_filter(optimizer)))
  assert {p[:3] for p, _ in per_worker} == {("opt_state", 0, "local")}  # the momentum of `local` is shared
  assert all(v.shape[0] == W for _, v in per_worker)
  opt_axes = jaxcomp.flax_nnx.worker_axes(optimizer)

  @nnx.jit
  def nnx_step(model, optimizer, batch):
    @nnx.vmap(in_axes=(None, opt_axes, 0), axis_name="w")
    def worker(model, optimizer, batch):
      optimizer.update(model, nnx.grad(_loss)(model, batch))

    worker(model, optimizer, batch)

  # The reference: plain optax on the split parameters.
  tx = _tx()
  state = parallel.replicate_workers(tx.init(params), W)
  axes = parallel.worker_axes(state)

  def ref_step(params, state, batch):
    grads = jax.grad(lambda p: _loss(nnx.merge(graphdef, p), batch))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  ref_step = jax.jit(jax.vmap(ref_step, in_axes=(None, axes, 0), out_axes=(None, axes), axis_name="w"))
  for _ in range(3):
    nnx_step(model, optimizer, batch)
    params, state = ref_step(params, state, batch)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(params))
  assert {k: float(v) for k, v in jaxcomp.metrics(optimizer.opt_state).items()} == {
      k: float(v) for k, v in jaxcomp.metrics(state).items()}
  assert float(jaxcomp.metrics(state)["bytes_on_wire"]) > 0


def test_jit_with_named_sharding_program_gives_data_parallels_float_mean():
  """The Flax NNX examples' program (nnx.Optimizer under nnx.jit, the batch split by a NamedSharding)
  and the same model through jaxcomp.data_parallel with the float mean: the same parameters."""
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((W,), ("w",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:W])
  x = jax.random.normal(jax.random.PRNGKey(1), (W, 8, 6))
  rows = (x, jnp.argmax(x[..., :3], -1))  # a row per worker

  model = Net(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)

  @nnx.jit
  def jit_step(model, optimizer, batch):
    optimizer.update(model, nnx.grad(_loss)(model, batch))

  whole = jax.device_put(jax.tree.map(lambda b: b.reshape(-1, *b.shape[2:]), rows), NamedSharding(mesh, P("w")))

  graphdef, params = nnx.split(Net(nnx.Rngs(0)), nnx.Param)
  tx = optax.chain(jaxcomp.get_transform("none", axis_name="w"), optax.sgd(0.1, momentum=0.9))

  def worker_step(params, opt_state, batch):
    grads = jax.grad(lambda p: _loss(nnx.merge(graphdef, p), batch))(parallel.vary(params, "w"))
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  step = jaxcomp.data_parallel(worker_step, tx, mesh=mesh)
  params, opt_state = step.init(params)
  for _ in range(3):
    jit_step(model, optimizer, whole)
    params, opt_state = step(params, opt_state, rows)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(params))


def test_nnx_pmap_takes_the_laid_out_optimizer_and_refuses_one_that_is_not():
  """Under nnx.pmap (no varying-axes types) the update needs replicate_workers' mark on the optimizer."""
  x = jax.random.normal(jax.random.PRNGKey(2), (W, 8, 6))
  batch = (x, jnp.argmax(x[..., :3], -1))

  def run(lay_out):
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, _tx(), wrt=nnx.Param)
    if lay_out:
      jaxcomp.flax_nnx.replicate_workers(optimizer, W)
    opt_axes = jaxcomp.flax_nnx.worker_axes(optimizer) if lay_out else None

    @nnx.pmap(in_axes=(None, opt_axes, 0), axis_name="w", axis_size=W, devices=jax.devices()[:W])
    def step(model, optimizer, batch):
      optimizer.update(model, nnx.grad(_loss)(model, batch))

    step(model, optimizer, batch)
    return optimizer

  residual = jaxcomp.core.worker_locals(run(True).opt_state)[0].residual["local"]["kernel"]
  assert residual.shape[0] == W and not np.allclose(residual[...], residual[:1])
  with pytest.raises(ValueError, match="not laid out over the workers of 'w'"):
    run(False)
