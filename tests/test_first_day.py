"""The traps a new user meets on the first day, each closed: printing, batches, dtypes, metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel

from _layouts import vmap_update

PARAMS = {"w": jnp.zeros((6, 5)), "b": jnp.zeros(5)}


def test_states_print_under_eval_shape_and_over_workers():
  tx = optax.chain(jaxcomp.threelc(axis_name="w"), optax.sgd(0.1))  # 3LC: a traced byte count
  abstract = jax.eval_shape(tx.init, PARAMS)
  text = repr(abstract)
  assert "Count(static=" in text and "traced uint32 words of shape ()" in text
  laid = parallel.replicate_workers(tx.init(PARAMS), 4)
  assert "traced uint32 words of shape (4,)" in repr(laid)
  assert "Count(" in repr(jaxcomp.metrics(laid)["encoded_bytes"])  # a concrete mean prints its value


def test_a_batch_must_have_one_row_per_worker():
  batch = {"x": jnp.zeros((16, 3)), "y": jnp.zeros((16,), jnp.int32)}
  with pytest.raises(ValueError, match=r"batch\['x'\] has shape \(16, 3\) for 8 workers.*must be 8"):
    parallel.check_batch(batch, 8)
  laid = jax.tree.map(lambda b: b.reshape((8, 2) + b.shape[1:]), batch)
  assert parallel.check_batch(laid, 8) is laid

  mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  per_device = jax.shard_map(lambda b: parallel.worker_batch(b)["x"].sum(0, keepdims=True)[None],
                             mesh=mesh, in_specs=P("d"), out_specs=P("d"))
  x = jnp.arange(8 * 2 * 3.0).reshape(8, 2, 3)
  np.testing.assert_array_equal(jax.jit(per_device)({"x": x})[:, 0], x.sum(1))  # every row, all of it
  # [16, ...] on 8 devices: each device would hold 2 rows, and b[0] would drop one of them.
  with pytest.raises(ValueError, match=r"batch\['x'\] has shape \(2, 3\) on this device.*must be 1"):
    jax.jit(per_device)({"x": x.reshape(16, 3)})


def test_a_state_must_have_its_worker_axis():
  tx = jaxcomp.int8(axis_name="w")
  with pytest.raises(ValueError, match=r"residual\['b'\] has shape \(5,\).*leading axis of 4.*replicate_workers"):
    parallel.check_state(tx.init(PARAMS), 4)
  laid = parallel.replicate_workers(tx.init(PARAMS), 4)
  assert parallel.check_state(laid, 4) is laid
  with pytest.raises(ValueError, match=r"has shape \(4, 5\).*leading axis of 8"):
    parallel.check_state(laid, 8)


@pytest.mark.parametrize("name", ["int8", "terngrad"])
def test_a_step_by_hand_without_worker_slice_is_named(name):
  """shard_map with the state's worker row of 1 left in: jaxcomp's error naming worker_slice, not JAX's rank
  error about a counter (TernGrad) or parameters silently reshaped to (1, ...) (int8)."""
  tx = jaxcomp.get_transform(name, axis_name="d")
  state = parallel.replicate_workers(tx.init(PARAMS), 4)
  mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
  specs = parallel.worker_specs(state, "d")

  def forgot(g, s):  # tx.update on the device's state as it arrives, its worker row of 1 still there
    return tx.update(jax.tree.map(lambda a: a[0], g), s)

  grads = {k: jnp.ones((4,) + v.shape) for k, v in PARAMS.items()}
  step = jax.jit(jax.shard_map(forgot, mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs)))
  with pytest.raises(ValueError, match=r"has shape \(1,.*worker_slice\(state, 0\).*expand_workers"):
    step(grads, state)


def test_a_non_float_leaf_is_named_and_can_be_skipped():
  grads = {"w": jnp.linspace(-1.0, 1.0, 30), "step": jnp.int32(7)}
  with pytest.raises(TypeError, match=r"dtype int32 at 'step'.*skip"):
    jaxcomp.terngrad().init(grads)
  with pytest.raises(TypeError, match=r"dtype int32 at 'step'"):
    jaxcomp.compress(None).init(grads)  # the float baseline too: only `skip` lets it through
  tx = jaxcomp.terngrad(axis_name="w", skip=jaxcomp.skip_by_path(lambda p: p == "step"))
  float_only = jaxcomp.terngrad(axis_name="w")
  state = parallel.replicate_workers(tx.init(grads), 2)
  laid = {"w": jnp.stack([grads["w"], -grads["w"]]), "step": grads["step"]}
  upd, state = jax.jit(jax.vmap(tx.update, in_axes=({"w": 0, "step": None}, parallel.worker_axes(state)),
                                out_axes=(None, parallel.worker_axes(state)), axis_name="w"))(laid, state)
  assert upd["step"].dtype == jnp.int32 and int(upd["step"]) == 7  # untouched
  # ... and neither exchanged nor counted: the metrics of the float leaves alone.
  ref_state = parallel.replicate_workers(float_only.init({"w": grads["w"]}), 2)
  _, ref_state = vmap_update(float_only, {"w": laid["w"]}, ref_state)
  assert ({k: float(v) for k, v in jaxcomp.metrics(state).items()}
          == {k: float(v) for k, v in jaxcomp.metrics(ref_state).items()})
  # The float0 gradient of an integer parameter, as jax.grad(..., allow_int=True) gives it.
  g = jax.grad(lambda p: jnp.sum(p["w"] ** 2), allow_int=True)(grads)
  tx1 = jaxcomp.terngrad(skip={"w": False, "step": True})
  upd, _ = tx1.update(g, tx1.init(grads))
  assert upd["step"] is g["step"]


def test_an_eager_update_is_the_jitted_update():
  """Outside jit the update runs as one compiled program, with the numbers of ``jax.jit(tx.update)``."""
  g = {"w": jnp.linspace(-1.0, 1.0, 30).reshape(5, 6), "b": jnp.arange(3.0)}
  tx = jaxcomp.onebit(seed=3)  # error feedback: the residual carries from step to step
  eager, jitted = tx.init(g), tx.init(g)
  for _ in range(2):
    u_eager, eager = tx.update(g, eager)
    u_jit, jitted = jax.jit(tx.update)(g, jitted)
    for a, b in zip(jax.tree.leaves((u_eager, eager)), jax.tree.leaves((u_jit, jitted))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(jaxcomp.metrics(eager)["bytes_on_wire"]) == float(jaxcomp.metrics(jitted)["bytes_on_wire"]) > 0


def test_metrics_says_why_it_has_nothing_to_report(tmp_path):
  with pytest.raises(ValueError, match="no compression transform"):
    jaxcomp.metrics(optax.adam(1e-3).init(PARAMS))
  tx = optax.chain(jaxcomp.terngrad(axis_name="w"), optax.sgd(0.1))
  state = parallel.replicate_workers(tx.init(PARAMS), 2)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "ckpt", state)
  with ocp.StandardCheckpointer() as ckpt:
    without_target = ckpt.restore(tmp_path / "ckpt")
    restored = ckpt.restore(tmp_path / "ckpt", jax.eval_shape(lambda: state))
  with pytest.raises(ValueError, match="lost its structure.*StandardRestore"):
    jaxcomp.metrics(without_target)
  assert float(jaxcomp.metrics(restored)["bytes_on_wire"]) == float(jaxcomp.metrics(state)["bytes_on_wire"])


def test_nonfinite_tensors_counts_bad_tensors_over_workers():
  n = 8
  tx = jaxcomp.terngrad(axis_name="w")
  state = parallel.replicate_workers(tx.init(PARAMS), n)
  g = jax.tree.map(lambda p: jnp.ones((n,) + p.shape), PARAMS)
  g = {"w": g["w"].at[5, 0, 0].set(jnp.nan), "b": g["b"].at[5, 1].set(jnp.inf)}  # two tensors, one worker
  _, state = vmap_update(tx, g, state)
  assert float(jaxcomp.metrics(state)["nonfinite_tensors"]) == 2
  g["w"] = g["w"].at[2, 1, 1].set(jnp.nan)  # and one more on another worker
  _, state = vmap_update(tx, g, state)
  assert float(jaxcomp.metrics(state)["nonfinite_tensors"]) == 3
