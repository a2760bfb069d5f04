"""One process of the hierarchical multi-process test: 2 processes x 4 CPU devices, gloo.

Usage: python hierarchy_worker.py PORT NUM_PROCESSES PROCESS_ID OUT.npz
Runs three steps of each method of ``METHODS`` with ``within="local"`` over a
("hosts", "local") mesh whose "hosts" are the processes, on the gradients of
tests/test_hierarchy.py, and saves the averaged updates and this process's
devices' residuals (by global worker index).
"""

import os
import sys

import jax

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                           process_id=pid, local_device_ids=[0, 1, 2, 3])

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcomp  # noqa: E402
from jaxcomp import parallel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import test_hierarchy as th  # noqa: E402  (tests/ : the shapes and gradients)

METHODS = ("terngrad", "threelc", "int8")
STEPS = 3
assert jax.process_count() == nproc == th.H and jax.local_device_count() == th.L
devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
mesh = Mesh(np.array(devices).reshape(th.H, th.L), th.AXES)


def globalize(tree, spec_tree):
  return jax.tree.map(
      lambda a, sp: jax.make_array_from_callback(a.shape, NamedSharding(mesh, sp), lambda idx: a[idx]),
      tree, spec_tree)


outs = {}
for name in METHODS:
  tx = jaxcomp.get_transform(name, axis_name="hosts", within="local")
  state = parallel.replicate_workers(tx.init(th._params()), th.H * th.L)
  specs = parallel.worker_specs(state, th.AXES)

  def per_device(g, s, tx=tx):
    upd, s2 = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    return upd, parallel.expand_workers(s2)

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(th.AXES), specs), out_specs=(P(), specs)))
  state = globalize(state, specs)
  for t in range(STEPS):
    g = th._grads(t)
    upd, state = step(globalize(g, jax.tree.map(lambda _: P(th.AXES), g)), state)
    for k, v in upd.items():
      outs[f"{name}_{k}{t}"] = np.asarray(v.addressable_data(0))
  for k, v in th._residuals(state).items():
    if hasattr(v, "addressable_shards"):
      for shard in v.addressable_shards:
        outs[f"{name}_residual_{k}_{shard.index[0].start}"] = np.asarray(shard.data)[0]
np.savez(out, **outs)
jax.distributed.shutdown()
