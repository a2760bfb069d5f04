"""One process of the two-process checkpoint test: data_parallel's state through ocp.CheckpointManager.

Usage: python checkpoint_worker.py PORT NUM_PROCESSES PROCESS_ID OUT.npz CKPT_DIR
A mesh of one CPU device per process (jax.distributed on localhost); the state
is saved with ocp.args.StandardSave as the step returns it (global arrays, each
process writing its own rows) and restored with ocp.args.StandardRestore into
its own structure. Saves this process's residual before and after.
"""

import sys

import jax

port, nproc, pid, out, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                           process_id=pid, local_device_ids=[0])

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

import jaxcomp  # noqa: E402
from cases import DATA_PARALLEL  # noqa: E402  (this directory is on sys.path)

_, worker_step, params, batch, steps = DATA_PARALLEL(nproc)
tx = jaxcomp.threelc(axis_name="d")  # error feedback: a residual per worker
step = jaxcomp.data_parallel(worker_step(tx, "d"), tx,
                             mesh=jax.make_mesh((nproc,), ("d",), axis_types=(jax.sharding.AxisType.Auto,)))
params, state = step.init(params)
for _ in range(steps):
  params, state = step(params, state, batch)
mine = lambda s: np.asarray(s.local.residual["w"].addressable_data(0))
mngr = ocp.CheckpointManager(ckpt)
mngr.save(steps, args=ocp.args.StandardSave(state))
mngr.wait_until_finished()
restored = mngr.restore(steps, args=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, state)))
saved, back = mine(state), mine(restored)
params, _ = step(params, restored, batch)  # resumes (the step donates its inputs)
np.savez(out, saved=saved, restored=back)
jax.distributed.shutdown()
