"""A state laid out over workers cannot lose its workers' residuals silently: under pmap, under
shard_map, and through orbax checkpoints (jaxcomp.worker_layout)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel
from tests._layouts import require_devices
from tests._processes import run_workers

N = 8
PARAMS = {"w": jnp.ones((4, 3))}


def _tx(axis):  # error feedback: a residual per worker
  return optax.chain(jaxcomp.threelc(axis_name=axis), optax.sgd(0.1))


def _step(tx):
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return step


def _grads():
  return {"w": jax.random.normal(jax.random.PRNGKey(0), (N, 4, 3))}


@pytest.fixture(scope="module")
def trained():
  """Two pmap steps of a laid-out state: (the pmapped step, params, state); the residuals differ per worker."""
  require_devices(N)
  state = parallel.replicate_workers(_tx("b").init(PARAMS), N)
  axes = parallel.worker_axes(state)
  step = jax.pmap(_step(_tx("b")), axis_name="b", in_axes=(None, axes, 0), out_axes=(None, axes))
  params = PARAMS
  for _ in range(2):
    params, state = step(params, state, _grads())
  rows = np.asarray(state[0].local.residual["w"])
  assert not np.allclose(rows, rows[:1])  # each worker its own
  return step, params, state


def _residuals(state):
  return np.asarray(state[0].local.residual["w"])


@pytest.mark.parametrize("layout", ["in_axes=None", "jax_utils.replicate"])
def test_pmap_refuses_a_state_not_laid_out(layout):
  """Passed whole or stacked by hand (no mark from replicate_workers), the update refuses it by name."""
  require_devices(N)
  state = _tx("b").init(PARAMS)
  axes = None
  if layout == "jax_utils.replicate":
    state, axes = jax.tree.map(lambda a: jnp.stack([a] * N), state), 0
  step = jax.pmap(_step(_tx("b")), axis_name="b", in_axes=(None, axes, 0), out_axes=(None, axes))
  with pytest.raises(ValueError, match=r"not laid out over the workers of 'b'.*replicate_workers.*worker_axes"):
    step(PARAMS, state, _grads())


def test_pmap_refuses_a_laid_out_state_passed_whole():
  require_devices(N)
  state = parallel.replicate_workers(_tx("b").init(PARAMS), N)
  step = jax.pmap(_step(_tx("b")), axis_name="b", in_axes=(None, None, 0), out_axes=(None, None))
  with pytest.raises(ValueError, match=r"shape \(8, 4, 3\).*pmap map the state with in_axes=out_axes"):
    step(PARAMS, state, _grads())


def test_shard_map_refuses_a_worker_local_state_passed_replicated():
  """Under shard_map's varying-axes typing, a residual passed in P() is typed as the same on every device."""
  require_devices(N)
  mesh = jax.make_mesh((N,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  tx = _tx("d")
  state = tx.init(PARAMS)

  def device(params, state, grads):
    return _step(tx)(params, state, jax.tree.map(lambda g: g[0], grads))

  step = jax.jit(jax.shard_map(device, mesh=mesh, in_specs=(P(), P(), P("d")), out_specs=(P(), P())))
  with pytest.raises(ValueError, match=r"typed as the same on every device of 'd'.*worker_specs"):
    step(PARAMS, state, _grads())


def test_orbax_standard_save_and_restore_keep_every_residual(trained, tmp_path):
  """pmap's output saved as it is (one process) and restored with its structure: every worker's residual."""
  step, params, state = trained
  mngr = ocp.CheckpointManager(tmp_path)
  mngr.save(2, args=ocp.args.StandardSave(state))
  mngr.wait_until_finished()
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  restored = mngr.restore(2, args=ocp.args.StandardRestore(target))
  np.testing.assert_array_equal(_residuals(restored), _residuals(state))
  step(params, restored, _grads())  # resumes


def test_host_local_conversion_keeps_every_residual_after_to_checkpoint(trained, tmp_path):
  """The Flax examples' save: orbax's host-local conversion, then a CheckpointManager; and back."""
  step, params, state = trained
  convert = lambda s: jax.tree.map(ocp.utils.fully_replicated_host_local_array_to_global_array, s)
  collapsed = convert(state)  # each device's row taken as the whole: worker 0's residual, no worker axis
  assert collapsed[0].local.residual["w"].shape == (4, 3)
  with pytest.raises(ValueError, match=r"do not share a leading worker axis.*to_checkpoint"):
    parallel.from_checkpoint(collapsed, N)
  with pytest.raises(ValueError, match=r"do not share a leading worker axis"):
    parallel.worker_axes(collapsed)

  mngr = ocp.CheckpointManager(tmp_path)
  mngr.save(2, args=ocp.args.StandardSave(convert(parallel.to_checkpoint(state))))
  mngr.wait_until_finished()
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, parallel.to_checkpoint(state))
  restored = parallel.from_checkpoint(mngr.restore(2, args=ocp.args.StandardRestore(target)), N)
  np.testing.assert_array_equal(_residuals(restored), _residuals(state))
  new_params, new_state = step(params, restored, _grads())
  _, expected = step(params, state, _grads())
  np.testing.assert_array_equal(_residuals(new_state), _residuals(expected))


def test_from_checkpoint_marks_and_places_a_state_restored_without_the_mark(trained):
  """A target built from tx.init (no mark) restores plain WorkerLocals: from_checkpoint lays them out."""
  step, params, state = trained
  local = lambda x: isinstance(x, jaxcomp.core.WorkerLocal)
  plain = jax.tree.map(lambda x: jaxcomp.core.WorkerLocal(*x) if local(x) else x,
                       jax.device_put(state, jax.devices()[0]), is_leaf=local)  # on one device, unmarked
  back = parallel.from_checkpoint(plain, N)
  assert isinstance(back[0].local, jaxcomp.core.LaidOut)
  step(params, back, _grads())


def test_data_parallel_checkpoint_over_two_processes(tmp_path):
  """Two processes (one device each): data_parallel's state saved and restored with ocp.CheckpointManager."""
  outs = run_workers("checkpoint_worker.py", 2, tmp_path, args=(str(tmp_path / "ckpt"),))
  for out in outs:
    np.testing.assert_array_equal(out["restored"], out["saved"])
    assert not np.allclose(outs[0]["saved"], outs[1]["saved"])  # each process's worker its own


def test_flax_training_checkpoints_keep_every_residual(trained, tmp_path):
  """flax.training.checkpoints (orbax underneath), as the older Flax examples save: host copies,
  restored into the laid-out state."""
  from flax.training import checkpoints  # pylint: disable=g-import-not-at-top

  step, params, state = trained
  checkpoints.save_checkpoint(tmp_path, jax.device_get(state), 2)
  restored = parallel.from_checkpoint(checkpoints.restore_checkpoint(tmp_path, target=state), N)
  assert isinstance(restored[0].local, jaxcomp.core.LaidOut)
  np.testing.assert_array_equal(_residuals(restored), _residuals(state))
  step(params, restored, _grads())
