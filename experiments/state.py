"""The training state: its layout over the mesh, its value at step 0 and its checkpoints.

The parameters, batch-norm statistics and EMA are replicated; only the
compressors' worker-local optimizer state (error-feedback residuals) is split
over the mesh's ``"devices"`` axis (:func:`state_shardings`).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from jaxcomp import parallel


class TrainState(NamedTuple):
  """Everything a step changes; ``opt_state`` holds the compressors' worker-local state."""

  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any
  ema_params: Any


def num_devices_for(workers: int, available: int) -> int:
  """The largest divisor of ``workers`` that is at most ``available``."""
  return max(d for d in range(1, min(workers, available) + 1) if workers % d == 0)


def make_mesh(workers: int, max_devices: int = 0) -> jax.sharding.Mesh:
  """The global mesh ``("devices",)`` the workers are laid over.

  Every process contributes the same number ``d`` of its devices (the largest
  divisor of ``workers / processes`` that it has, at most ``max_devices``),
  process by process, so process ``p`` holds the ``p``-th contiguous block of
  workers: the examples of the ``p``-th slice of every global batch.
  """
  by_process: dict[int, list[Any]] = {}
  for dev in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
    by_process.setdefault(dev.process_index, []).append(dev)
  available = min(len(devs) for devs in by_process.values())
  if max_devices:
    available = min(available, max_devices)
  per_process = num_devices_for(workers // len(by_process), available)
  devices = [dev for p in sorted(by_process) for dev in by_process[p][:per_process]]
  return jax.sharding.Mesh(np.array(devices), ("devices",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def state_shardings(mesh: jax.sharding.Mesh, state: TrainState) -> TrainState:
  """Replicated everywhere, but worker-local optimizer state split over ``"devices"``."""
  repl = NamedSharding(mesh, P())
  return TrainState(
      repl, jax.tree.map(lambda _: repl, state.params),
      jax.tree.map(lambda _: repl, state.batch_stats),
      jax.tree.map(lambda s: NamedSharding(mesh, s), parallel.worker_specs(state.opt_state, "devices")),
      jax.tree.map(lambda _: repl, state.ema_params))


def _to_global(tree, shardings):
  """Host values, identical in every process, as (global) arrays laid out by ``shardings``.

  Every leaf gets its own buffer (the step donates them: two leaves must not
  share one, as the initial EMA and parameters otherwise would).
  """

  def put(x, sharding):
    x = np.array(x)  # a private host copy
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, tree, shardings)


def _host_state(config, tx, variables) -> TrainState:
  """The state at step 0, as this process computes it (the same in every process)."""
  params = variables["params"]
  opt_state = parallel.replicate_workers(tx.init(params), config.workers)
  ema = params if config.ema_decay > 0 else {}
  return TrainState(jnp.zeros((), jnp.int32), params, variables.get("batch_stats", {}), opt_state, ema)


def initial_state(config, tx, variables, abstract: TrainState) -> TrainState:
  """The state at step 0, laid out as ``abstract``."""
  return _to_global(_host_state(config, tx, variables), jax.tree.map(lambda a: a.sharding, abstract))


def abstract_state(config, mesh, tx, variables) -> TrainState:
  """Shapes, dtypes and shardings of the state, computing nothing."""
  shapes = jax.eval_shape(lambda v: _host_state(config, tx, v), variables)
  return jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                      shapes, state_shardings(mesh, shapes))


class Checkpointer:
  """orbax checkpoints of the whole TrainState, keyed by step.

  In a multi-process run every process calls every method: orbax writes each
  array's shards from the processes that hold them (process 0 writes the
  replicated ones and the metadata) into the one shared directory.
  """

  def __init__(self, directory: str, config: ml_collections.ConfigDict):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._ocp = ocp
    self._mngr = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=config.checkpoint_keep, create=True))

  def latest_step(self) -> Optional[int]:
    return self._mngr.latest_step()

  def save(self, step: int, state: TrainState) -> None:
    self._mngr.save(step, args=self._ocp.args.StandardSave(state))

  def restore(self, abstract: TrainState) -> TrainState:
    """The latest checkpoint, laid out as ``abstract`` (``jax.ShapeDtypeStruct`` with shardings)."""
    return self._mngr.restore(self._mngr.latest_step(), args=self._ocp.args.StandardRestore(abstract))

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()
