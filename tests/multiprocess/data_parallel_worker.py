"""One process of the multi-process test of ``jaxcomp.data_parallel``: jax.distributed on localhost.

Usage: python data_parallel_worker.py PORT NUM_PROCESSES PROCESS_ID OUT.npz
A mesh of one CPU device per process; the step, its initial state and its
placement are ``jaxcomp.data_parallel``'s, fed the global batch (the same host
values in every process). Saves the parameters and this process's residual.
"""

import sys

import jax

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                           process_id=pid, local_device_ids=[0])

import numpy as np  # noqa: E402

import jaxcomp  # noqa: E402
from cases import DATA_PARALLEL  # noqa: E402  (this directory is on sys.path)

make_tx, worker_step, params, batch, steps = DATA_PARALLEL(nproc)
tx = make_tx("d")
step = jaxcomp.data_parallel(worker_step(tx, "d"), tx,
                             mesh=jax.make_mesh((nproc,), ("d",), axis_types=(jax.sharding.AxisType.Auto,)))
params, state = step.init(params)
for _ in range(steps):
  params, state = step(params, state, batch)
got = {f"param_{k}": np.asarray(v.addressable_data(0)) for k, v in params.items()}
got["residual_w"] = np.asarray(state[0].local.residual["w"].addressable_data(0))
got["compiles"] = np.asarray(step.compiles())
np.savez(out, **got)
jax.distributed.shutdown()
