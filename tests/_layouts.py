"""Run a per-worker optax update under vmap, pmap, shard_map and shard_map+vmap.

Every runner takes gradients with a leading worker axis of N and a state laid
out with jaxcomp.parallel.replicate_workers, and returns (updates, new_state)
with the updates unbatched (they are the same on every worker: the runners
check that by declaring them unmapped) and the worker-local state batched.
"""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel


def _mesh(n):
  return jax.make_mesh((n,), ("d",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])


def on_mesh(step, mesh, axis, state_template):
  """``step(grads, state)`` with the state first laid out as the step returns it.

  A state straight from ``init`` sits on one device and the step returns it
  split over ``mesh``: two input shardings, so the jitted step would compile
  twice, for its first call and again for every later one. Laid out up front
  (``device_put`` of an array already laid out so is free), it compiles once.
  """
  shardings = parallel.worker_shardings(state_template, mesh, axis)

  def placed(grads, state):
    return step(grads, jax.device_put(state, shardings))

  placed.lower = lambda grads, state: step.lower(grads, jax.device_put(state, shardings))
  return placed


def device_update(tx):
  """``tx.update`` for one worker per device under ``shard_map``: the gradients' and the state's local
  worker axis of size 1 dropped, and the state's put back."""

  def per_device(g, s):
    upd, s2 = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    return upd, parallel.expand_workers(s2)

  return per_device


def require_devices(n):
  """Skips the test where the default backend is an accelerator with fewer than ``n`` devices.

  On the host CPU fewer is a mistake (tests/conftest.py gives 8 devices): it fails there.
  ``benchmarks.accelerator`` runs the marked tests on the default backend, often one GPU.
  """
  if len(jax.devices()) < n:
    if jax.default_backend() != "cpu":
      pytest.skip(f"needs {n} devices; {jax.default_backend()} has {len(jax.devices())}")
    raise AssertionError(f"tests/conftest.py should give {n} host devices; got {len(jax.devices())}")


def make_runners(make_tx, n_workers):
  """make_tx(axis_name) -> optax transform. Returns {name: runner(grads, state)}."""
  runners = {}

  def vmap_runner(state):
    tx = make_tx("w")
    axes = parallel.worker_axes(state)
    return jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w"))

  runners["vmap"] = vmap_runner

  if len(jax.devices()) >= n_workers:

    def pmap_runner(state):
      tx = make_tx("w")
      axes = parallel.worker_axes(state)
      # pmap is a shard_map over a mesh of these devices, axis "w" (JAX 0.10).
      mesh = jax.sharding.Mesh(np.array(jax.devices()[:n_workers]), ("w",),
                               axis_types=(jax.sharding.AxisType.Auto,))
      step = jax.pmap(tx.update, axis_name="w", in_axes=(0, axes), out_axes=(None, axes))
      return on_mesh(step, mesh, "w", state)

    def shard_map_runner(state):
      tx = make_tx("d")
      mesh = _mesh(n_workers)
      specs = parallel.worker_specs(state, "d")

      f = jax.shard_map(device_update(tx), mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs))
      return on_mesh(jax.jit(f), mesh, "d", state)

    def shard_map_vmap_runner(state):
      # Half the workers per device: vmap over "w" inside shard_map over "d".
      n_dev = n_workers // 2
      tx = make_tx(("d", "w"))
      mesh = _mesh(n_dev)
      specs = parallel.worker_specs(state, "d")
      axes = parallel.worker_axes(state)
      inner = jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w")
      f = jax.shard_map(inner, mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs), check_vma=False)
      return on_mesh(jax.jit(f), mesh, "d", state)

    runners["pmap"] = pmap_runner
    runners["shard_map"] = shard_map_runner
    runners["shard_map+vmap"] = shard_map_vmap_runner
  return {name: _built_once(build) for name, build in runners.items()}


def _built_once(build):
  """A runner that builds its jit/pmap function once per state structure.

  A fresh jit/pmap wrapper on every call is a cache miss for JAX, so every
  step would re-trace and re-compile (about 1 s per step per layout on a
  2-core machine).
  """
  built = {}

  def runner(grads, state):
    key = jax.tree.structure(state)
    if key not in built:
      built[key] = build(state)
    return built[key](grads, state)

  return runner


def init_state(make_tx, params, n_workers):
  # Initialized by a transform with a worker axis, as every runner's is: the
  # state records the per-step sizes, and those count the agreement bytes.
  return parallel.replicate_workers(make_tx("w").init(params), n_workers)


def run_layouts(make_tx, params, grads_fn, n_workers, steps=2):
  """Runs ``steps`` updates under every layout from the same initial state.

  ``grads_fn(step)`` returns the gradients with a leading worker axis.
  Returns ``{layout: (list of updates, jaxcomp.metrics of the final state, final state)}``.
  """
  results = {}
  for layout, run in make_runners(make_tx, n_workers).items():
    state = init_state(make_tx, params, n_workers)
    outs = []
    for step in range(steps):
      upd, state = run(grads_fn(step), state)
      # Wait for the step before dispatching more work: several cross-device programs in flight
      # at once can deadlock XLA:CPU's host devices under load (docs/design.md, "Host devices").
      jax.block_until_ready((upd, state))
      outs.append(upd)
    # The metrics from host copies: no cross-device program at all. What is compared is the
    # values, so nothing is lost.
    state = jax.device_get(state)
    results[layout] = (outs, jaxcomp.metrics(state), state)
  return results


def assert_error_feedback_conserves(tx, workers=4, steps=12, shape=(6, 9)):
  """Per worker, Σ own decodes + the final residual = Σ inputs, so the Σ of updates is the mean of
  (Σ inputs − residual); checked over ``steps`` updates of Gaussian gradients of growing scale."""
  state = parallel.replicate_workers(tx.init(jax.numpy.zeros(shape)), workers)
  total_in, total_upd = jax.numpy.zeros((workers,) + shape), jax.numpy.zeros(shape)
  for t in range(steps):
    g = jax.random.normal(jax.random.PRNGKey(t), (workers,) + shape) * (1 + t % 3)
    upd, state = vmap_update(tx, g, state)
    total_in, total_upd = total_in + g, total_upd + upd
  np.testing.assert_allclose(total_upd, (total_in - state.local.residual).mean(0), atol=2e-5)
  return state


_VMAPPED = {}


def vmap_train(tx, grads_fn, steps, params, workers, axis_name="w"):
  """``steps`` updates of ``tx`` over ``workers`` vmapped workers, shared parameters: the params and every state.

  ``grads_fn(t)`` gives step ``t``'s gradients, a row per worker; each state is copied to the host.
  """
  state = parallel.replicate_workers(tx.init(params), workers)
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(lambda p, s, g: tx.update(g, s, p), in_axes=(None, axes, 0),
                          out_axes=(None, axes), axis_name=axis_name))
  states = []
  for t in range(steps):
    updates, state = step(params, state, grads_fn(t))
    params = optax.apply_updates(params, updates)
    states.append(jax.device_get(state))
  return params, states


def vmap_update(tx, grads, state):
  """``tx.update`` over a ``"w"`` worker axis under jit; compiled once per transform and state structure."""
  key = (id(tx), jax.tree.structure(state))
  if key not in _VMAPPED:
    axes = parallel.worker_axes(state)
    _VMAPPED[key] = (tx, jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w")))
  return _VMAPPED[key][1](grads, state)


def per_shard_step(tx, params, mesh):
  """``(step, state)``: ``tx`` (a ``per_shard`` transform over ``"model"``) on 2 ``"data"`` workers of
  ``mesh``, jitted under ``shard_map`` over ``"data"``; ``params`` are placed on ``mesh`` already.
  ``step(grads, state)`` takes gradients with a leading ``"data"`` axis and returns ``(updates, state)``."""
  state = parallel.replicate_workers(tx.init(params), 2)
  state = jax.device_put(state, parallel.worker_shardings(state, mesh, "data"))
  wspecs = parallel.worker_specs(state, "data")

  def per_device(g, s):
    u, s = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    return u, parallel.expand_workers(s)

  step = jax.jit(jax.shard_map(per_device, in_specs=(P("data"), wspecs), out_specs=(P(), wspecs),
                               axis_names={"data"}))
  return step, state
