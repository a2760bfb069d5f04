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
