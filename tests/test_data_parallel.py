"""``jaxcomp.data_parallel``: one call from a per-worker step to the data-parallel step, and no silent trap.

Each mistake a hand-written step invites either cannot happen through
the entry point (it slices, lays out and places) or gets jaxcomp's own error
naming the fix: a state without its worker axis, a batch that is not one row
per worker, a state laid out or placed otherwise than the step returns it, a
gradient of replicated parameters, a compressor over other axes or none.
Tiny sizes, 8 host devices; the runs are shared between the tests.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel

N = 8
X = jax.random.normal(jax.random.PRNGKey(0), (N, 4, 6))
BATCH = (X, jnp.argmax(X[..., :3], axis=-1))
PARAMS = {"w": jnp.zeros((6, 3)), "b": jnp.zeros(3)}


def _loss(params, batch):
  x, y = batch
  return optax.softmax_cross_entropy_with_integer_labels(x @ params["w"] + params["b"], y).mean()


def _worker_step(tx, vary=True, axis="workers"):
  def worker_step(params, opt_state, batch):
    at = parallel.vary(params, axis) if vary else params
    loss, grads = jax.value_and_grad(_loss)(at, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return worker_step


def _tx(axis="workers"):
  # int8 carries an error-feedback residual per worker: the leaf a wrong layout gets wrong.
  return optax.chain(jaxcomp.int8(axis_name=axis), optax.sgd(0.5, momentum=0.9))


@pytest.fixture(scope="module")
def mesh():
  return jax.make_mesh((N,), ("workers",), axis_types=(jax.sharding.AxisType.Auto,))


@pytest.fixture(scope="module")
def vmap_run():
  """Three steps of N simulated workers: the reference every layout must give."""
  tx = _tx()
  step = jaxcomp.data_parallel(_worker_step(tx), tx, workers=N)
  params, state = step.init(PARAMS)
  for _ in range(3):
    params, state, loss = step(params, state, BATCH)
  return params, state, loss


@pytest.fixture(scope="module")
def sharded():
  tx = _tx()
  return tx, jaxcomp.data_parallel(_worker_step(tx), tx, mesh=jax.make_mesh(
      (N,), ("workers",), axis_types=(jax.sharding.AxisType.Auto,)))


def _three_steps(step, params, state):
  for _ in range(3):
    params, state, loss = step(params, state, BATCH)
  return params, state, loss


def _assert_same(run, ref):
  for a, b in zip(jax.tree.leaves(run), jax.tree.leaves(ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_devices_give_the_simulated_workers_numbers_compiled_once(sharded, vmap_run):
  tx, step = sharded
  params, state = step.init(PARAMS)
  run = _three_steps(step, params, state)
  _assert_same(run, vmap_run)
  residual = np.asarray(run[1][0].local.residual["w"])
  assert residual.shape == (N, 6, 3) and not np.allclose(residual[0], residual[1])  # each worker's own
  assert run[2].shape == (N,)  # the loss, per worker
  assert step.compiles() == 1
  assert float(jnp.abs(PARAMS["w"]).sum()) == 0  # the caller's parameters: copied, not donated
  assert params["w"].is_deleted() and not run[0]["w"].is_deleted()  # the step's own: updated in place


def test_explicit_axes_give_the_auto_numbers(vmap_run):
  tx = _tx()
  mesh = jax.make_mesh((N,), ("workers",), axis_types=(jax.sharding.AxisType.Explicit,))
  step = jaxcomp.data_parallel(_worker_step(tx), tx, mesh=mesh)
  _assert_same(_three_steps(step, *step.init(PARAMS)), vmap_run)
  assert step.compiles() == 1


def test_several_workers_per_device_give_the_simulated_workers_numbers(vmap_run):
  """``workers=8`` on 4 devices: two simulated workers on each, ``vmap`` inside the ``shard_map``."""
  mesh = jax.make_mesh((4,), ("devices",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
  tx = _tx(("devices", "workers"))
  step = jaxcomp.data_parallel(_worker_step(tx, axis=("devices", "workers")), tx, mesh=mesh, workers=N)
  params, state = step.init(PARAMS)
  assert state[0].local.residual["w"].sharding.spec == P("devices")
  _assert_same(_three_steps(step, params, state), vmap_run)
  assert step.compiles() == 1
  with pytest.raises(ValueError, match=r"workers=6 is not a multiple of the \('devices',\) devices"):
    jaxcomp.data_parallel(_worker_step(tx), tx, mesh=mesh, workers=6).init(PARAMS)


def test_a_state_without_its_worker_axis_is_refused(sharded):
  """The plain optax layout (``tx.init(params)``): every device would get a slice of one residual."""
  tx, step = sharded
  params, _ = step.init(PARAMS)
  with pytest.raises(ValueError, match=r"residual\['b'\] has shape \(3,\).*leading axis of 8.*step.init"):
    step(params, tx.init(PARAMS), BATCH)
  simulated = jaxcomp.data_parallel(_worker_step(tx), tx, workers=N)
  with pytest.raises(ValueError, match=r"leading axis of 8.*replicate_workers\(tx.init\(params\), 8\)"):
    simulated(PARAMS, tx.init(PARAMS), BATCH)


@pytest.mark.parametrize("layout", ["replicated", "one device"])
def test_a_state_laid_out_otherwise_is_moved_not_recompiled(sharded, vmap_run, mesh, layout):
  """Laid out P() (every worker's rows on every device), or straight from init on one device:
  moved to the step's layout first, so the residuals stay per worker and the step compiles once."""
  tx, step = sharded
  params, state = step.init(PARAMS)
  if layout == "replicated":
    state = jax.device_put(state, NamedSharding(mesh, P()))
  else:
    state = parallel.replicate_workers(tx.init(PARAMS), N)
    params = jax.tree.map(jnp.array, PARAMS)  # the step donates what it is given
  run = _three_steps(step, params, state)
  _assert_same(run, vmap_run)
  assert step.compiles() == 1


def test_a_batch_not_one_row_per_worker_is_refused(sharded):
  """16 rows on 8 devices: each device would hold two, and ``b[0]`` would drop half the batch."""
  tx, step = sharded
  params, state = step.init(PARAMS)
  rows = jax.tree.map(lambda b: b.reshape((2 * N, -1) + b.shape[2:]), BATCH)
  with pytest.raises(ValueError, match=r"batch\[0\] has shape \(16, 2, 6\) for 8 workers.*must be 8"):
    step(params, state, rows)
  simulated = jaxcomp.data_parallel(_worker_step(tx), tx, workers=N)
  with pytest.raises(ValueError, match=r"batch\[0\] has shape \(16, 2, 6\) for 8 workers.*must be 8"):
    simulated(*simulated.init(PARAMS), rows)


def test_gradients_of_replicated_parameters_are_refused(mesh):
  """Without ``vary`` under shard_map, jax.grad sums the gradient over the devices in float."""
  tx = _tx()
  step = jaxcomp.data_parallel(_worker_step(tx, vary=False), tx, mesh=mesh)
  with pytest.raises(ValueError, match=r"'[wb]' is the same on every worker of 'workers'.*jaxcomp.parallel.vary"):
    step(*step.init(PARAMS), BATCH)


@pytest.mark.parametrize("layout", ["workers", "mesh"])
def test_a_compressor_over_other_axes_or_none_is_named(mesh, layout):
  where = {"workers": N} if layout == "workers" else {"mesh": mesh}
  for axis, message in (("data", r"unbound axis name: data.*axis_name='workers'"),
                        (None, r"differ between the workers.*axis_name='workers'")):
    tx = _tx(axis)
    step = jaxcomp.data_parallel(_worker_step(tx), tx, **where)
    with pytest.raises(ValueError, match=message):
      step(*step.init(PARAMS), BATCH)


def test_what_worker_step_returns_and_the_layout_are_checked():
  tx = _tx()
  with pytest.raises(TypeError, match="takes workers=N .*mesh="):
    jaxcomp.data_parallel(_worker_step(tx), tx)
  step = jaxcomp.data_parallel(lambda p, s, b: p, tx, workers=N)
  with pytest.raises(TypeError, match=r"must return \(params, opt_state\)"):
    step(*step.init(PARAMS), BATCH)
