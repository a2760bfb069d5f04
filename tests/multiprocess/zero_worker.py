"""One process of the multi-process test of ``jaxcomp.shard_optimizer``: jax.distributed on localhost.

Usage: python zero_worker.py PORT NUM_PROCESSES PROCESS_ID OUT.npz CHECKPOINTS
A mesh of one CPU device per process, ``jaxcomp.data_parallel``'s layout
(cases.ZERO), for every run of cases.ZERO_RUNS (sharded state; sharded
parameters too). A float run runs all the steps ("RUN/"). A compressed run
runs the first steps, is checkpointed with orbax into CHECKPOINTS/RUN (each
process writes its own shards), runs the rest ("RUN/"), is restored into
``step.abstract(params)`` and runs the rest again ("RUN/resumed/"). Saves, for
each, this process's part of every leaf of ``(params, opt_state)``, and how
many times each run's step compiled ("RUN/compiles").
"""

import os
import sys

import jax

port, nproc, pid, out, checkpoints = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                           process_id=pid, local_device_ids=[0])

import numpy as np  # noqa: E402

import jaxcomp  # noqa: E402
from cases import ZERO, ZERO_RUNS, leaves_by_path, restore_checkpoint, save_checkpoint  # noqa: E402  (this directory is on sys.path)

make_tx, worker_step, init_params, batch, (before, after) = ZERO(nproc)
mesh = jax.make_mesh((nproc,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
got = {}


def record(prefix, tree):
  for path, leaf in leaves_by_path(tree).items():
    got[prefix + path] = np.asarray(leaf.addressable_data(0))


def steps(step, params, state, n):
  for _ in range(n):
    params, state = step(params, state, batch)
  return params, state


for run, (compressor, _) in ZERO_RUNS.items():
  tx = make_tx(run, "d")
  step = jaxcomp.data_parallel(worker_step(tx, "d"), tx, mesh=mesh)
  params, state = steps(step, *step.init(init_params), before)
  if compressor != "none":
    directory = os.path.join(checkpoints, run)
    save_checkpoint(directory, before, (params, state))
  record(f"{run}/", steps(step, params, state, after))
  if compressor != "none":
    record(f"{run}/resumed/", steps(step, *restore_checkpoint(directory, step.abstract(init_params)), after))
  got[f"{run}/compiles"] = np.asarray(step.compiles())
np.savez(out, **got)
jax.distributed.shutdown()
