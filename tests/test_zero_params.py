"""``jaxcomp.shard_optimizer(shard_params=True)``: the parameters sharded over the workers too (ZeRO-3).

What must hold: through ``jaxcomp.data_parallel`` each worker stores only its
chunk of every cut tensor; with a float gather the step gives the replicated
step's parameters (to an ulp: no reduction is reordered) under ``vmap`` and with one worker per device; the gradients' shard
is the same as with sharded states alone (the reduce-scatter is unchanged);
the bytes are an all-gather of the parameters and a reduce-scatter of the
gradients, as the messages' shapes say; a compressed gather (qwZ) keeps each
worker's master chunk exact and every replica's view of the others the same;
and misuse is refused by name. Tiny trees, 4 workers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

import jaxcomp
from jaxcomp import parallel
from jaxcomp import zero_params

N = 4
ALIGN = 40
PARAMS = {"w": jnp.linspace(-1.0, 1.0, 3 * 500).reshape(3, 500), "b": jnp.ones(7), "v": jnp.linspace(0.5, -0.5, 1201)}
BATCH = jax.random.normal(jax.random.PRNGKey(1), (N, 4, 1500))
CHUNKS = 400 + 320  # w: 1500 values, 375 a worker rounded up to 40; v: 1201 -> 320; b stays whole


def _loss(params, batch):
  """Gradients with no reduction over a parameter's own values (the mean is over the batch): with the same
  parameters, XLA computes them in the same order whether the parameters were gathered or not."""
  w = params["w"].reshape(-1)
  return jnp.sum(w * jnp.mean(batch, 0)) + jnp.sum(jnp.sin(w) ** 2) + jnp.sum(params["v"] ** 2 * params["b"][0])


def _matmul_loss(params, batch):
  """A product over the weights' values: its order may differ with the producer of the gathered weights."""
  return jnp.mean((batch @ params["w"].reshape(-1, 1)) ** 2) + jnp.sum(params["v"] ** 2 * params["b"][0])


def _train(tx, steps=2, loss=_loss, **where):
  """``steps`` data-parallel steps: the parameters (as the step keeps them), the state, the step."""

  def worker_step(params, opt_state, batch):
    grads = jax.grad(loss)(parallel.vary(params, "workers"), batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  step = jaxcomp.data_parallel(worker_step, tx, **(where or {"workers": N}))
  params, state = step.init(PARAMS)
  for _ in range(steps):
    params, state = step(params, state, BATCH)
  return params, state, step


def _chain(opt, name="none"):
  return optax.chain(jaxcomp.get_transform(name, axis_name="workers"), opt)


def _zero(chain, **kwargs):
  return jaxcomp.shard_optimizer(chain, axis_name="workers", num_workers=N, align=ALIGN, **kwargs)


OPTIMIZERS = {"sgd_momentum": lambda: optax.sgd(0.1, momentum=0.9), "lion": lambda: optax.lion(1e-3),
              "adamw": lambda: optax.adamw(1e-2, weight_decay=0.1)}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_float_sharded_parameters_equal_replicated(opt):
  replicated = _train(_chain(OPTIMIZERS[opt]()))[0]
  tx = _zero(_chain(OPTIMIZERS[opt]()), shard_params=True)
  sharded, _, _ = _train(tx)
  assert isinstance(sharded, zero_params.ShardedParams)
  assert sharded.local.residual["w"].shape == (N, 400) and sharded.whole["b"].shape == (7,)
  for want, got in zip(jax.tree.leaves(replicated), jax.tree.leaves(tx.unshard(sharded))):
    # to an ulp: no sum is reordered, but XLA fuses the chunk's update with other neighbours (the
    # dynamic update of a whole-shaped tensor, not a collective), and may contract its last multiply
    # and the addition to the parameters otherwise
    np.testing.assert_allclose(got, want, rtol=2.5e-7, atol=3e-8)


def test_one_worker_per_device_equals_vmap_and_stores_a_chunk_per_device():
  mesh = Mesh(np.array(jax.devices()[:N]), ("workers",))
  make = lambda: _zero(_chain(optax.sgd(0.1, momentum=0.9)), shard_params=True)
  on_devices, _, step = _train(make(), loss=_matmul_loss, mesh=mesh)
  simulated = _train(make(), loss=_matmul_loss)[0]
  w = on_devices.local.residual["w"]
  assert [s.data.shape for s in w.addressable_shards] == [(1, 400)] * N  # each device holds its chunk only
  for a, b in zip(jax.tree.leaves(on_devices), jax.tree.leaves(simulated)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # device all-to-alls sum in their own order
  assert step.compiles() == 1


def test_bytes_are_a_parameter_gather_and_a_gradient_reduce_scatter():
  _, zero3, _ = _train(_zero(_chain(optax.sgd(0.1)), shard_params=True), steps=1)
  _, zero1, _ = _train(_zero(_chain(optax.sgd(0.1))), steps=1)
  m3, m1 = jaxcomp.metrics(zero3), jaxcomp.metrics(zero1)
  assert int(m3["gather_bytes"]) == 4 * CHUNKS  # the float32 chunks of w and v this worker sends
  assert int(m3["bytes_on_wire"]) == int(m1["bytes_on_wire"])  # the same volume as stage 1/2 in float
  assert int(m3["received_bytes"]) == int(m1["received_bytes"])


def test_int8_gather_keeps_master_chunks_exact_and_costs_a_byte_a_value():
  """qwZ: c + 4 bytes a chunk; the master chunks are the float step's on the params the forward pass saw."""
  tx = _zero(_chain(optax.sgd(0.1)), shard_params=True, param_gather=jaxcomp.Int8())
  params, state, _ = _train(tx, steps=2)
  assert int(jaxcomp.metrics(state)["gather_bytes"]) == (400 + 4) + (320 + 4)
  float_params = _train(_zero(_chain(optax.sgd(0.1)), shard_params=True), steps=2)[0]
  w, w_float = tx.unshard(params)["w"], tx.unshard(float_params)["w"]
  assert 0 < float(jnp.max(jnp.abs(w - w_float))) < 1e-3  # the forward pass saw int8 weights: close, not equal


def test_refusals_name_the_fix():
  with pytest.raises(ValueError, match="shard_params=True and a deterministic codec"):
    _zero(_chain(optax.sgd(0.1)), param_gather=jaxcomp.Int8())
  with pytest.raises(ValueError, match="shard_params=True and a deterministic codec"):
    _zero(_chain(optax.sgd(0.1)), shard_params=True, param_gather=jaxcomp.TernGrad())
  tx = _zero(_chain(optax.sgd(0.1)), shard_params=True)
  step = jaxcomp.data_parallel(lambda p, s, b: (p, s), tx, workers=N)
  _, state = step.init(PARAMS)
  with pytest.raises(ValueError, match="make them with step.init"):
    step(PARAMS, state, BATCH)


def test_sizes_hold_for_a_billion_parameters():
  """The shard of a 2**31-value tensor, abstractly (no memory): rows of int64-safe sizes, bytes counted exactly."""
  tx = _zero(_chain(optax.adamw(1e-3)), shard_params=True)
  big = {"w": jax.ShapeDtypeStruct((2 ** 16, 2 ** 15), jnp.float32)}
  sharded = jax.eval_shape(tx.shard_params, big)
  assert sharded.local.residual["w"].shape == (N, -(-2 ** 29 // ALIGN) * ALIGN)
  assert jax.eval_shape(tx.unshard, sharded)["w"].shape == (2 ** 16, 2 ** 15)


def test_zeropp_weights_int8_and_gradients_int4_send_under_a_quarter_of_float():
  """ZeRO++ (qwZ int8 weights, qgZ 4-bit gradients; blocks of 40 values here): the weights' chunks exactly,
  the gradients' reduce-scatter as stage 1/2 sends it, and a quarter of float ZeRO-3's bytes or less."""
  qgz = lambda: optax.chain(jaxcomp.blockint(bits=4, block=40, error_feedback=False, axis_name="workers"),
                            optax.sgd(0.1))
  _, state, _ = _train(_zero(qgz(), shard_params=True, param_gather=jaxcomp.BlockInt(bits=8, block=40)), steps=1)
  _, stage2, _ = _train(_zero(qgz()), steps=1)
  _, float_state, _ = _train(_zero(_chain(optax.sgd(0.1)), shard_params=True), steps=1)
  m, m2, f = jaxcomp.metrics(state), jaxcomp.metrics(stage2), jaxcomp.metrics(float_state)
  assert int(m["gather_bytes"]) == CHUNKS + 4 * CHUNKS // 40  # an int8 code a value, a float32 scale a block
  assert int(m["bytes_on_wire"]) - int(m["gather_bytes"]) == int(m2["bytes_on_wire"]) - int(m2["gather_bytes"])
  assert int(m["bytes_on_wire"]) / int(f["bytes_on_wire"]) <= 0.25
