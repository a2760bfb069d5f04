"""Optimizer states laid out over workers: the check in ``update``, and checkpoints.

:func:`jaxcomp.parallel.replicate_workers` gives every worker-local leaf
(residuals, per-worker counters) a leading worker axis and marks its
:class:`~jaxcomp.core.WorkerLocal` as :class:`~jaxcomp.core.LaidOut`. Two ways
to lose that state without an error are closed here:

* **In the step.** Under ``jax.pmap`` (and ``shard_map(..., check_vma=False)``)
  a value's type does not say whether it differs between workers: a state
  passed ``in_axes=None`` reaches every device whole, and ``out_axes=None``
  returns device 0's residuals to every worker at the next step. A
  compression transform's ``update`` calls :func:`check_laid_out`, which
  refuses a worker-local part without the mark there (and, under
  ``shard_map``'s varying-axes typing, one typed as the same on every device).
* **In checkpoints.** A state laid out over devices saves and restores as it
  is with ``ocp.CheckpointManager`` and ``ocp.args.StandardSave`` /
  ``StandardRestore`` (restore with the laid-out state, or its
  ``jax.eval_shape``, as the target). A conversion that takes each device's
  piece of an array as the whole, such as orbax's
  ``fully_replicated_host_local_array_to_global_array`` on ``pmap``'s output,
  would keep one worker's residuals: :func:`to_checkpoint` makes the state
  safe to hand to it, and :func:`from_checkpoint` checks a restored state's
  worker axis and lays it back out for the step.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcomp import core
from jaxcomp import parallel


def _locals(state: Any) -> list[tuple[str, core.WorkerLocal]]:
  found = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, core.WorkerLocal))[0]
  return [(jax.tree_util.keystr(path), x) for path, x in found if isinstance(x, core.WorkerLocal)]


def _spread(axis_name: parallel.AxisName) -> list[str]:
  """The device axes (``pmap``, ``shard_map``) of ``axis_name`` with more than one worker."""
  return [n for n in parallel.axis_names(axis_name) if parallel.is_device_axis(n) and lax.axis_size(n) > 1]


def check_laid_out(state: Any, axis_name: parallel.AxisName, who: str) -> None:
  """Raises if a worker-local part of ``state`` reaches ``update`` the same on every worker.

  Over a device axis whose values are typed (``shard_map``'s ``check_vma``)
  every worker-local leaf must be typed as varying over it; over one whose
  are not (``pmap``, ``check_vma=False``) the :class:`~jaxcomp.core.WorkerLocal`
  must carry :func:`jaxcomp.parallel.replicate_workers`' mark. ``vmap``'s
  simulated workers need neither: ``vmap`` itself refuses a state mapped
  ``None`` whose update differs between workers.
  """
  spread = _spread(axis_name)
  if not spread:
    return
  typed = parallel.checked_axes(tuple(spread))
  untyped = [n for n in spread if n not in typed]
  for path, local in _locals(state):
    if untyped and not isinstance(local, core.LaidOut):
      raise ValueError(
          f"{who}: the state{path} is per worker (residuals, counters) but was not laid out over the "
          f"workers of {untyped[0]!r}: under jax.pmap (or shard_map with check_vma=False) a state passed "
          "whole (in_axes=None, or jax_utils.replicate and in_axes=0) gives every device the same one, "
          "and out_axes=None would keep device 0's residuals for all. Lay it out with state = "
          "jaxcomp.parallel.replicate_workers(state, num_workers) and map it with in_axes=out_axes="
          "jaxcomp.parallel.worker_axes(state) (or use jaxcomp.data_parallel, which does both); a "
          "restored state: jaxcomp.parallel.from_checkpoint(state, num_workers).")
    for sub, leaf in jax.tree_util.tree_flatten_with_path(local)[0]:
      missing = sorted(typed - parallel.varying_axes(leaf))
      if missing:
        raise ValueError(
            f"{who}: the state{path}{jax.tree_util.keystr(sub)} is per worker but typed as the same on "
            f"every device of {missing[0]!r} (passed in replicated, P()): each worker's own would be "
            "lost. Split the state over the workers with in_specs=out_specs=jaxcomp.parallel."
            "worker_specs(state, axis) after jaxcomp.parallel.replicate_workers(state, num_workers), or "
            "use jaxcomp.data_parallel.")


def check_rows(state: Any) -> None:
  """Raises if a laid-out worker-local leaf lost its worker axis (every one must lead with the same size)."""
  sizes = {}
  for path, local in _locals(state):
    if not isinstance(local, core.LaidOut):
      continue
    for sub, leaf in jax.tree_util.tree_flatten_with_path(local)[0]:
      sizes[f"opt_state{path}{jax.tree_util.keystr(sub)}"] = tuple(np.shape(leaf))[:1]
  if len(set(sizes.values())) > 1 or () in sizes.values():
    shapes = ", ".join(f"{k}: {v or 'none'}" for k, v in list(sizes.items())[:3])
    raise ValueError(
        f"the state's worker-local leaves do not share a leading worker axis ({shapes}, ...): a "
        "checkpoint conversion kept one worker's piece of each (orbax's "
        "fully_replicated_host_local_array_to_global_array on pmap's output does), or the state was "
        "sliced. Hand the state to such a conversion after jaxcomp.parallel.to_checkpoint(state), and "
        "restore it with jaxcomp.parallel.from_checkpoint(restored, num_workers).")


def _replicated(a: Any) -> Any:
  sharding = getattr(a, "sharding", None)
  if not isinstance(sharding, NamedSharding):
    return a
  return jax.device_put(a, NamedSharding(sharding.mesh, P()))


def to_checkpoint(state: Any) -> Any:
  """``state`` with every worker-local leaf whole on each of its devices: safe to hand to a conversion.

  A laid-out leaf that ``pmap`` returns (``out_axes=0`` from
  :func:`jaxcomp.parallel.worker_axes`) is split over the devices, a row
  each. orbax's ``fully_replicated_host_local_array_to_global_array`` (as
  written before a save in the Flax examples) takes each device's piece of
  an array as the whole value, which keeps worker 0's residuals and drops
  the worker axis. Replicated first, each device holds every row, and the
  conversion keeps them all. On one process; take the result back with
  :func:`from_checkpoint`.
  """
  return parallel._map_local(_replicated, state)  # pylint: disable=protected-access


def from_checkpoint(state: Any, num_workers: int, axis_name: str = "workers") -> Any:
  """A restored laid-out ``state``, checked and placed for the step: the inverse of :func:`to_checkpoint`.

  Raises a ValueError naming the leaf if a worker-local leaf has no leading
  axis of ``num_workers`` (a checkpoint of one worker's view). With at least
  ``num_workers`` local devices, the worker-local leaves are split over the
  first ``num_workers`` (as ``pmap`` with ``in_axes=0`` and a
  ``shard_map`` over them take them: an array restored onto one device, or
  whole on each, fails their sharding check); the rest are left where they
  are (``pmap`` broadcasts a leaf mapped ``None``, :func:`jaxcomp.data_parallel`
  places every input).
  """
  check_rows(state)
  state = parallel.mark_laid_out(parallel.check_state(state, num_workers))
  devices = jax.local_devices()
  if len(devices) < num_workers:
    return state
  rows = NamedSharding(jax.sharding.Mesh(np.array(devices[:num_workers]), (axis_name,)), P(axis_name))
  return parallel._map_local(lambda a: jax.device_put(a, rows), state)  # pylint: disable=protected-access
