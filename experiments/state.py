"""The training state: its layout over the mesh, its value at step 0 and its checkpoints.

The parameters, batch-norm statistics and EMA are replicated; only the
compressors' worker-local optimizer state (error-feedback residuals) is split
over the mesh's ``"devices"`` axis (:func:`state_shardings`), and, with
``config.shard_params`` (ZeRO-3), each worker's chunks of the parameters and
of their EMA (:class:`jaxcomp.zero_params.ShardedParams`).
"""

from __future__ import annotations

import gc
import logging as pylogging
import os
import sys
import time
import types
from typing import Any, NamedTuple, Optional

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from experiments import seals
from jaxcomp import parallel
from jaxcomp import zero


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


def make_mesh(workers: int, max_devices: int = 0, hosts: int = 0) -> jax.sharding.Mesh:
  """The global mesh ``("devices",)`` the workers are laid over, or ``("hosts", "devices")``.

  Every process contributes the same number ``d`` of its devices (the largest
  divisor of ``workers / processes`` that it has, at most ``max_devices``),
  process by process, so process ``p`` holds the ``p``-th contiguous block of
  workers: the examples of the ``p``-th slice of every global batch. With
  ``hosts`` > 0 the devices are cut, in that order, into that many hosts of
  equal size (``config.hosts``, :mod:`jaxcomp.exchange.hierarchy`).
  """
  by_process: dict[int, list[Any]] = {}
  for dev in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
    by_process.setdefault(dev.process_index, []).append(dev)
  available = min(len(devs) for devs in by_process.values())
  if max_devices:
    available = min(available, max_devices)
  per_process = num_devices_for(workers // len(by_process), available)
  devices = [dev for p in sorted(by_process) for dev in by_process[p][:per_process]]
  if hosts:
    if hosts < 0 or len(devices) % hosts:
      raise ValueError(f"config.hosts={hosts} must divide the {len(devices)} devices the workers use "
                       f"({per_process} a process); 0 compresses every worker's gradient.")
    return jax.sharding.Mesh(np.array(devices).reshape(hosts, -1), ("hosts", "devices"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
  return jax.sharding.Mesh(np.array(devices), ("devices",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def state_shardings(mesh: jax.sharding.Mesh, state: TrainState) -> TrainState:
  """Replicated everywhere, but worker-local optimizer state and sharded parameters (and their EMA)
  split over the mesh's axes."""
  repl = NamedSharding(mesh, P())
  rows = lambda tree: parallel.worker_shardings(tree, mesh, mesh.axis_names)
  return TrainState(repl, rows(state.params), jax.tree.map(lambda _: repl, state.batch_stats),
                    rows(state.opt_state), rows(state.ema_params))


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
  if zero.shards_params(tx):  # ZeRO-3: every worker's chunks (jaxcomp.zero_params)
    params = tx.shard_params(params)
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


class CheckpointError(RuntimeError):
  """A checkpoint could not be saved or read: one line naming the step, the path and the cause.

  The cause is orbax's or tensorstore's innermost error, as text: the original
  exception is not chained, because its traceback keeps orbax's read and
  write tasks alive until the interpreter exits, which then prints one
  "Event loop is closed" traceback for each of them.
  """


def _cause(e: BaseException) -> str:
  """The innermost explicit cause of ``e`` (orbax wraps tensorstore's error), on one line."""
  seen = set()
  while e.__cause__ is not None and id(e) not in seen:
    seen.add(id(e))
    e = e.__cause__
  text = " ".join(str(e).split()) or "(no message)"
  return f"{type(e).__name__}: {text[:400]}"


class Checkpointer:
  """orbax checkpoints of the whole TrainState, keyed by step.

  In a multi-process run every process calls every method: orbax writes each
  array's shards from the processes that hold them (process 0 writes the
  replicated ones and the metadata) into the one shared directory.

  Each step is sealed once every process has written it (:mod:`experiments.seals`).
  :meth:`restore` has every process restore the same step, the newest that
  all have completely, and falls back past damaged checkpoints: one that a
  process lacks, whose part on a process is not as sealed (a missing, cut
  short or corrupted file) or that fails to read (bad metadata) is reported
  in one line, moved aside to ``<directory>.damaged/<step>`` (never deleted)
  and the next older one is tried. Failures to save or read raise
  :class:`CheckpointError`.
  """

  def __init__(self, directory: str, config: ml_collections.ConfigDict):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._ocp = ocp
    self.directory = os.path.abspath(directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=config.checkpoint_keep, create=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._seal)))
    self._saving: Optional[int] = None  # the step of a save that may still be under way

  def _seal(self) -> None:
    """Seals the step being saved, every process's part written (:mod:`experiments.seals`).

    orbax calls it on process 0, from its saving thread, before it commits
    the step: in its temporary directory (``<step>.orbax-checkpoint-tmp``)
    where it has one.
    """
    final = self.step_path(self._saving)
    tmp = final + ".orbax-checkpoint-tmp"
    seals.seal(tmp if os.path.isdir(tmp) else final)

  def step_path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def latest_step(self) -> Optional[int]:
    return self._mngr.latest_step()

  def save(self, step: int, state: TrainState) -> None:
    """Starts saving ``state`` as the checkpoint of ``step`` (orbax finishes it in the background)."""
    self._check(self._saving, self._mngr.wait_until_finished)  # an earlier save's error is its own
    self._saving = step
    self._check(step, lambda: self._mngr.save(step, args=self._ocp.args.StandardSave(state)))

  def wait(self) -> None:
    """Waits until the last save is complete on disk."""
    self._check(self._saving, self._mngr.wait_until_finished)

  def _check(self, step: Optional[int], operation) -> None:
    """Runs an orbax ``operation`` on the checkpoint of ``step``; raises its error as CheckpointError."""
    message = None
    try:
      operation()
    except Exception as e:  # pylint: disable=broad-exception-caught
      message = (f"could not save the checkpoint of step {step} at {self.step_path(step)}: "
                 f"{_cause(e)}")
    if message is not None:  # raised outside the except clause: nothing keeps orbax's tasks alive
      raise CheckpointError(message)

  def restore(self, abstract: TrainState, start_afresh: bool = False) -> Optional[TrainState]:
    """The newest checkpoint that every process has completely and reads, laid out as ``abstract``.

    Every process restores the same step, and says which: the newest that
    every process lists (:meth:`_agree`; one listed by only some is moved
    aside), whose part every process finds as it sealed it
    (:func:`experiments.seals.check`: not missing, cut short or corrupted)
    and reads. A step that fails either on any process is moved aside, and
    the next older one is tried.

    Args:
      abstract: the state's ``jax.ShapeDtypeStruct`` leaves, with shardings.
      start_afresh: when every checkpoint failed to read, return None (the
        run starts from step 0) instead of raising.

    Returns:
      The state, or None if there is no checkpoint.

    Raises:
      CheckpointError: there were checkpoints, none could be read, and not
        ``start_afresh``.
    """
    # Before the first read: a failing restore closes orbax's loop on reads still
    # running, and they can report before the restore returns its error.
    _drop_closed_loop_reports()
    damaged: list[int] = []
    while (step := self._agree(damaged)) is not None:
      state, error = self._read(step, abstract)
      errors = _gather_errors(error)
      if not errors:  # a warning after a fall-back, which every process's log then shows
        (logging.warning if damaged else logging.info)(
            "restoring the checkpoint of step %d: the newest that every process (%d) has completely "
            "and reads%s", step, jax.process_count(),
            f" (moved aside: step(s) {', '.join(map(str, damaged))})" if damaged else "")
        return state
      damaged.append(step)
      older = [s for s in self._mngr.all_steps() if s < step]
      logging.error("checkpoint of step %d at %s cannot be read: %s; moved it to %s; %s", step,
                    self.step_path(step), "; ".join(errors), self._move_aside(step),
                    f"trying step {max(older)}" if older else "no older checkpoint")
    if not damaged:
      return None
    message = (f"no readable checkpoint in {self.directory}: step(s) {', '.join(map(str, damaged))} "
               f"failed to read and were moved to {self.directory}.damaged")
    if start_afresh:
      logging.error("%s; starting afresh from step 0 (start_afresh_if_unreadable)", message)
      return None
    raise CheckpointError(f"{message}. Set --config.start_afresh_if_unreadable=True to start "
                          "again from step 0.")

  def _agree(self, damaged: list[int]) -> Optional[int]:
    """The newest step that every process lists (None: some process lists none).

    A step newer than that, which some processes list and others do not, is
    moved aside (and added to ``damaged``): the run goes on from the older
    one and will save that step again.
    """
    while True:
      steps = self._mngr.all_steps()
      newest = _gather_ints(max(steps) if steps else -1)
      agreed, top = int(newest.min()), int(newest.max())
      if agreed == top:
        return agreed if agreed >= 0 else None
      damaged.append(top)
      lacking = ", ".join(str(p) for p in np.flatnonzero(newest < top))
      logging.error("checkpoint of step %d is not on every process (process(es) %s list none): "
                    "moved it to %s", top, lacking, self._move_aside(top))

  def _read(self, step: int, abstract: TrainState) -> tuple[Optional[TrainState], Optional[str]]:
    """``(state, None)``, or ``(None, why)`` when this process's part of ``step`` is not whole or
    fails to read."""
    from etils import epath  # pylint: disable=g-import-not-at-top

    error = seals.check(self.step_path(step), jax.process_index())
    if error is not None:
      return None, error
    try:  # the handler, not the manager: its restore has no barrier a failed process would miss
      return self._ocp.StandardCheckpointHandler().restore(
          epath.Path(self.step_path(step)) / "default",
          args=self._ocp.args.StandardRestore(abstract)), None
    except Exception as e:  # pylint: disable=broad-exception-caught
      error = _cause(e)
    _collect_orbax_leftovers()
    return None, error

  def _move_aside(self, step: int) -> str:
    """Moves the checkpoint of ``step`` to ``<directory>.damaged/<step>[-N]`` (process 0); returns where."""
    base = os.path.join(self.directory + ".damaged", str(step))
    target, n = base, 1
    while os.path.exists(target):
      n += 1
      target = f"{base}-{n}"
    _sync("checkpoint read attempt done")  # no process reads it any more
    if jax.process_index() == 0 and os.path.exists(self.step_path(step)):
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.rename(self.step_path(step), target)
    _sync("damaged checkpoint moved")  # every process sees it gone before reloading
    self._mngr.reload()
    return target

  def close(self) -> None:
    self.wait()
    self._mngr.close()


def _collect_orbax_leftovers(timeout: float = 5.0) -> None:
  """Waits for the reads a failed orbax restore leaves behind, and collects them quietly.

  orbax stops its event loop at the first array that fails to read and
  closes it with the other reads still under way. Each of those leaves
  reports behind, printed at some later moment in the middle of training:
  "Event loop is closed" when it ends, and, when the garbage collector
  destroys it, asyncio's "Task exception was never retrieved" and orbax's
  "Encountered error while reading array index" with a page of TensorStore
  spec. Here the reads are waited for (``timeout`` seconds at most) and
  collected at once, and those reports dropped; the failure itself is
  reported in one line.

  TensorStore's own threads can still finish an abandoned read after every
  coroutine is gone, and hand its result to the closed loop, seconds later,
  and a finished read's task can be collected long after: so what drops
  those reports stays installed for the rest of the process
  (``_drop_closed_loop_reports``). It drops only those three reports.
  """
  _drop_closed_loop_reports()
  deadline = time.monotonic() + timeout
  while True:
    gc.collect()
    pending = sum(_is_orbax_coroutine(o) and o.cr_frame is not None for o in gc.get_objects())
    if not pending or time.monotonic() > deadline:
      break
    time.sleep(0.02)


def _drop_closed_loop_reports() -> None:
  """Installs (once) what drops an abandoned orbax read's reports, for the rest of the process.

  Dropped: an orbax coroutine destroyed unfinished, and a ``RuntimeError("Event
  loop is closed")``, which is what a read finishing after orbax closed its
  loop raises from ``call_soon_threadsafe`` (an unraisable hook: everything
  else goes to the hook installed before, Python's or pytest's); and asyncio's
  "Task exception was never retrieved" of an orbax coroutine's task, logged
  whenever the garbage collector gets to the task, which can be long after
  the coroutine ended (a filter on the ``asyncio`` logger: other tasks' reports
  pass).
  """
  pylogging.getLogger("asyncio").addFilter(_orbax_task_reports)  # a no-op when it is there
  if getattr(sys.unraisablehook, "_jaxcomp_drops_closed_loop", False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    if not (_is_orbax_coroutine(unraisable.object) or
            (isinstance(unraisable.exc_value, RuntimeError)
             and str(unraisable.exc_value) == "Event loop is closed")):
      previous(unraisable)

  hook._jaxcomp_drops_closed_loop = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


def _orbax_task_reports(record: pylogging.LogRecord) -> bool:
  """A logging filter: ``False`` (drop) for asyncio's report of an orbax task's unretrieved exception."""
  message = record.getMessage()
  return not ("exception was never retrieved" in message and f"{os.sep}orbax{os.sep}" in message)


def _is_orbax_coroutine(obj) -> bool:
  return (isinstance(obj, types.CoroutineType)
          and f"{os.sep}orbax{os.sep}" in obj.cr_code.co_filename)


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices(f"experiments.state: {name}")


def _gather_ints(value: int) -> np.ndarray:
  """Every process's ``value``, by process."""
  if jax.process_count() == 1:
    return np.array([value])
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return np.asarray(multihost_utils.process_allgather(np.int32(value))).reshape(-1)


def _gather_errors(error: Optional[str]) -> list[str]:
  """Every process's error (``None``: it read the checkpoint), as "process P: ERROR" with several."""
  if jax.process_count() == 1:
    return [error] if error is not None else []
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  failed = np.asarray(multihost_utils.process_allgather(np.int32(error is not None)))
  if not failed.any():
    return []
  mine = [f"process {jax.process_index()}: {error}"] if error is not None else []
  others = [f"process {p}: failed (see its log)" for p in np.flatnonzero(failed)
            if p != jax.process_index()]
  return mine + others
