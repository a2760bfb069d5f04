r"""Multi-process JAX from the environment ``experiments.launch`` sets.

A script started by the launcher calls :func:`initialize_from_env` before it
touches any device::

  from experiments import distributed
  distributed.initialize_from_env()   # no-op (returns False) outside a launch
  import jax
  ...                                 # jax.devices() now spans every process

The launcher gives every process these variables:

* ``JAX_COORDINATOR_ADDRESS``: ``HOST:PORT`` of rank 0's coordination
  service. JAX reads this one itself.
* ``JAXCOMP_NUM_PROCESSES``: the number of processes ``P``.
* ``JAXCOMP_PROCESS_ID``: this process's rank, ``0 <= id < P``.
* ``JAXCOMP_HEARTBEAT_TIMEOUT``, ``JAXCOMP_SHUTDOWN_TIMEOUT``,
  ``JAXCOMP_INIT_TIMEOUT`` (seconds, optional): passed to
  ``jax.distributed.initialize`` as ``heartbeat_timeout_seconds``,
  ``shutdown_timeout_seconds`` and ``initialization_timeout``.

JAX 0.10 reads no process count or id of its own outside the clusters it
auto-detects (SLURM, Open MPI, mpi4py, Kubernetes, Cloud TPU), hence the
``JAXCOMP_`` names. On several hosts without the launcher, set the same
variables by hand on every host (``JAX_COORDINATOR_ADDRESS`` is the address of
the host running process 0).

Why the timeouts matter. JAX's default heartbeat timeout is 100 s: when a peer
dies, a survivor's gloo collective fails at once ("Connection reset by peer")
but the process only aborts, with a C++ stack trace, when the coordination
service declares the peer dead about that long later. The launcher ends the
survivors itself as soon as a process dies; the shorter heartbeat timeout it
passes down bounds the wait on several hosts or when a link, not a process,
fails.

Training on several processes (``experiments.train``). A run is
multi-process when any of these says so, and then
``jax.distributed.initialize`` is called (:func:`initialize_distributed`)
before anything touches a device:

* the environment: ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0's
  coordinator; JAX reads it too), ``JAXCOMP_NUM_PROCESSES`` and
  ``JAXCOMP_PROCESS_ID`` (JAX 0.10 reads no variables for these two, so this
  module does; a launcher sets all three);
* a SLURM job step or an Open MPI job of more than one task (``SLURM_NTASKS``,
  ``OMPI_COMM_WORLD_SIZE``): JAX's own cluster detection supplies the rest;
* ``--config.distributed.*`` (``configs/common.py``), which overrides both.

JAX itself also reads ``JAX_LOCAL_DEVICE_IDS`` and
``JAX_COORDINATOR_BIND_ADDRESS``. The mesh then spans every process's devices
(the same number from each, process by process), so process ``p`` holds
workers ``p * N/P .. (p+1) * N/P - 1``, and reads only their examples: the
``p``-th slice of every global batch (``jaxcomp.data.pipeline``), the same
global batches in the same order as a single-process run. Metrics, the
summary and the config are written by process 0; every process takes part in
the (orbax) checkpoints. One process or several, with the same config and
seed a run computes the same numbers (``tests/test_multiprocess_train.py``).
When a process dies, the others stop within
``config.distributed.heartbeat_timeout_seconds`` (a collective with it fails
at once, the coordination service then ends them); started again with the
same workdir, the run resumes from its last checkpoint and ends as if nothing
had happened. On SIGTERM (a SLURM time limit, a preemption) the processes
instead stop after the same step, save it and exit with code 75
(:mod:`experiments.preemption`).

``python -m experiments.distributed`` is a self-check: every process
contributes ``rank + 1`` per local device to one ``psum`` under
``jax.shard_map`` and checks the total.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional

from absl import logging

if TYPE_CHECKING:
  import ml_collections

COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "JAXCOMP_NUM_PROCESSES"
PROCESS_ID_ENV = "JAXCOMP_PROCESS_ID"
HEARTBEAT_TIMEOUT_ENV = "JAXCOMP_HEARTBEAT_TIMEOUT"
SHUTDOWN_TIMEOUT_ENV = "JAXCOMP_SHUTDOWN_TIMEOUT"
INIT_TIMEOUT_ENV = "JAXCOMP_INIT_TIMEOUT"


class LaunchEnv(NamedTuple):
  """What the launcher told this process (see the module docstring)."""
  coordinator_address: str
  num_processes: int
  process_id: int
  heartbeat_timeout_seconds: int | None
  shutdown_timeout_seconds: int | None
  initialization_timeout: int | None


def _int_var(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
  raw = environ.get(name)
  if raw is None or raw == "":
    return None
  try:
    value = int(raw)
  except ValueError:
    raise ValueError(f"{name}={raw!r} is not an integer.") from None
  if value < minimum:
    raise ValueError(f"{name}={value} must be at least {minimum}.")
  return value


def launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
  """Reads the launcher's variables; ``None`` when this is not a launched process.

  Args:
    environ: the environment to read (default ``os.environ``).

  Returns:
    A :class:`LaunchEnv`, or ``None`` if ``JAXCOMP_NUM_PROCESSES`` is unset.

  Raises:
    ValueError: a variable is malformed, or the process count is set without
      the process id or the coordinator address.
  """
  environ = os.environ if environ is None else environ
  num = _int_var(environ, NUM_PROCESSES_ENV, 1)
  if num is None:
    return None
  pid = _int_var(environ, PROCESS_ID_ENV, 0)
  if pid is None:
    raise ValueError(f"{NUM_PROCESSES_ENV} is set but {PROCESS_ID_ENV} is not.")
  if pid >= num:
    raise ValueError(f"{PROCESS_ID_ENV}={pid} must be below {NUM_PROCESSES_ENV}={num}.")
  address = environ.get(COORDINATOR_ENV, "")
  host, sep, port = address.rpartition(":")
  if not (host and sep and port.isdigit()):
    raise ValueError(f"{NUM_PROCESSES_ENV} is set, so {COORDINATOR_ENV} must be HOST:PORT; "
                     f"got {address!r}.")
  return LaunchEnv(address, num, pid,
                   _int_var(environ, HEARTBEAT_TIMEOUT_ENV, 1),
                   _int_var(environ, SHUTDOWN_TIMEOUT_ENV, 1),
                   _int_var(environ, INIT_TIMEOUT_ENV, 1))


def initialize_from_env(*, heartbeat_timeout_seconds: int | None = None,
                        shutdown_timeout_seconds: int | None = None,
                        initialization_timeout: int | None = None,
                        local_device_ids=None) -> bool:
  """Calls ``jax.distributed.initialize`` from the launcher's variables.

  Call it before anything touches a device. Outside a launch (no
  ``JAXCOMP_NUM_PROCESSES``) it does nothing, so one script serves both.
  On CPU the cross-process collectives are gloo's unless the user chose
  another implementation (``jax_cpu_collectives_implementation``).

  Args:
    heartbeat_timeout_seconds: seconds after which the coordination service
      declares a silent process dead; overrides ``JAXCOMP_HEARTBEAT_TIMEOUT``;
      JAX's default (100) when neither is given.
    shutdown_timeout_seconds: how long ``jax.distributed.shutdown`` waits for
      the other processes; overrides ``JAXCOMP_SHUTDOWN_TIMEOUT``.
    initialization_timeout: how long to wait for every process to connect;
      overrides ``JAXCOMP_INIT_TIMEOUT``.
    local_device_ids: passed through to ``jax.distributed.initialize``.

  Returns:
    True if JAX's distributed runtime was initialized, False outside a launch.
  """
  env = launch_env()
  if env is None:
    return False
  import jax  # pylint: disable=g-import-not-at-top  (keeps the launcher free of jax)
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs = {}
  for key, arg, from_env in (
      ("heartbeat_timeout_seconds", heartbeat_timeout_seconds, env.heartbeat_timeout_seconds),
      ("shutdown_timeout_seconds", shutdown_timeout_seconds, env.shutdown_timeout_seconds),
      ("initialization_timeout", initialization_timeout, env.initialization_timeout)):
    value = arg if arg is not None else from_env
    if value is not None:
      kwargs[key] = int(value)
  jax.distributed.initialize(coordinator_address=env.coordinator_address,
                             num_processes=env.num_processes, process_id=env.process_id,
                             local_device_ids=local_device_ids,
                             cluster_detection_method="deactivate", **kwargs)
  return True


def _env_int(name: str) -> Optional[int]:
  value = os.environ.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"${name}={value!r} is not an integer.") from None


def _cluster_tasks() -> int:
  """Tasks of the SLURM job step or Open MPI job this process belongs to (1 if none).

  The same variables JAX's cluster detection reads; only a job of more than
  one task makes the run multi-process (a one-task job stays single-process).
  """
  if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_NODELIST" in os.environ:
    return _env_int("SLURM_NTASKS") or 1
  if "OMPI_MCA_orte_hnp_uri" in os.environ:
    return _env_int("OMPI_COMM_WORLD_SIZE") or 1
  return 1


def distributed_settings(config: ml_collections.ConfigDict) -> Optional[dict[str, Any]]:
  """The arguments of ``jax.distributed.initialize`` for this run, or None (one process).

  ``config.distributed`` overrides the environment (see the module docstring);
  what neither gives is left to JAX's cluster detection.

  Raises:
    ValueError: inconsistent or incomplete settings.
  """
  d = config.get("distributed") or {}
  address = d.get("coordinator_address") or os.environ.get(COORDINATOR_ENV) or None
  num = d.get("num_processes")
  num = _env_int(NUM_PROCESSES_ENV) if num is None else num
  pid = d.get("process_id")
  pid = _env_int(PROCESS_ID_ENV) if pid is None else pid
  method = d.get("cluster_detection_method")
  if num == 1:
    return None
  if num is None and method is None:
    if _cluster_tasks() > 1:
      pass  # JAX detects the address, count and id of a SLURM / Open MPI job.
    elif address is None and pid is None:
      return None
    else:
      raise ValueError(
          f"Bad config: a coordinator address or process id is set but not the number of "
          f"processes; set ${NUM_PROCESSES_ENV} and ${PROCESS_ID_ENV} (or "
          f"--config.distributed.num_processes / process_id), or unset ${COORDINATOR_ENV}.")
  if num is not None and (num < 1 or (pid is not None and not 0 <= pid < num)):
    raise ValueError(f"Bad config: process_id={pid} must be in [0, num_processes={num}).")
  heartbeat = d.get("heartbeat_timeout_seconds")
  if heartbeat is None:  # the launcher's --heartbeat-timeout, else JAX's default
    heartbeat = _env_int(HEARTBEAT_TIMEOUT_ENV) or 100
  if heartbeat < 1:
    raise ValueError(f"Bad config: distributed.heartbeat_timeout_seconds must be >= 1, got {heartbeat}.")
  return dict(coordinator_address=address, num_processes=num, process_id=pid,
              cluster_detection_method=method, heartbeat_timeout_seconds=heartbeat,
              initialization_timeout=d.get("initialization_timeout_seconds", 300))


def initialize_distributed(config: ml_collections.ConfigDict) -> bool:
  """Starts multi-process JAX if this run is multi-process; returns whether it is.

  Idempotent: a process where ``jax.distributed`` is already initialized (by
  an earlier call, or by its launcher) is left as it is. Must run before
  anything touches a device (``train_and_evaluate`` calls it first).

  Raises:
    RuntimeError: the run is multi-process but a device was already used.
  """
  import jax  # pylint: disable=g-import-not-at-top  (keeps the launcher free of jax)

  if jax.distributed.is_initialized():
    return True
  settings = distributed_settings(config)
  if settings is None:
    return False
  # XLA:CPU moves cross-process collectives through gloo (JAX 0.10's default;
  # set for releases without one). GPU and TPU backends ignore this option.
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(**settings)
  except RuntimeError as e:
    if "before" in str(e):
      raise RuntimeError(
          "This run is multi-process, but JAX already used a device in this process: call "
          "experiments.distributed.initialize_distributed(config) before any JAX computation.") from e
    raise
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


def is_writer() -> bool:
  """Whether this process writes the run's files (process 0)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def _self_check() -> int:
  """One psum across every device of every process; prints and checks the total."""
  if not initialize_from_env():
    print(f"not under experiments.launch ({NUM_PROCESSES_ENV} unset): single process")
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((jax.device_count(),), ("p",), axis_types=(jax.sharding.AxisType.Auto,))
  rank, nproc, nlocal = jax.process_index(), jax.process_count(), jax.local_device_count()
  local = np.full((nlocal,), rank + 1, np.float32)
  x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")), local)
  total_fn = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "p"), mesh=mesh,
                                   in_specs=P("p"), out_specs=P()))
  total = float(np.asarray(total_fn(x).addressable_data(0))[0])
  expected = nlocal * nproc * (nproc + 1) / 2  # every process has the same device count
  ok = total == expected
  print(f"process {rank} of {nproc} ({nlocal} local devices, {jax.device_count()} in all): "
        f"psum {total:g}, expected {expected:g}: {'ok' if ok else 'WRONG'}", flush=True)
  if jax.process_count() > 1:
    jax.distributed.shutdown()
  return 0 if ok else 1


if __name__ == "__main__":
  raise SystemExit(_self_check())
