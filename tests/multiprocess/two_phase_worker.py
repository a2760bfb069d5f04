"""One process of the two-phase multi-process test: jax.distributed on localhost, gloo collectives.

Usage: python two_phase_worker.py PORT NUM_PROCESSES PROCESS_ID OUT.npz
Runs jaxcomp.exchange.two_phase.two_phase_exchange under jax.shard_map over a mesh of
one CPU device per process and saves this process's mean, own decode and
shard residual.
"""

import os
import sys

import jax

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                           process_id=pid, local_device_ids=[0])

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import two_phase_case as case  # noqa: E402

assert jax.process_count() == nproc and len(jax.devices()) == nproc
mesh = jax.make_mesh((nproc,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))


def globalize(a):
  return jax.make_array_from_callback(a.shape, NamedSharding(mesh, P("d")), lambda idx: a[idx])


xs, keys, r = (globalize(np.asarray(a)) for a in case.inputs(nproc))
outs = {}
for name, comp in case.COMPRESSORS.items():
  f = case.worker(comp, "d")

  def per_device(x, k, res, f=f):
    mean, own, shard_res = f(x[0], k[0], res[0])
    return mean, own[None], shard_res[None]

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("d"), out_specs=(P(), P("d"), P("d"))))
  mean, own, res = step(xs, keys, r)
  outs[f"{name}_mean"] = np.asarray(mean.addressable_data(0))
  outs[f"{name}_own"] = np.asarray(own.addressable_data(0))[0]
  outs[f"{name}_res"] = np.asarray(res.addressable_data(0))[0]

# The transform: jaxcomp.threelc(exchange="two_phase") for two steps, as tests/multiprocess/worker.py runs TernGrad.
from jaxcomp import parallel  # noqa: E402

tx = case.transform("d")
state = parallel.replicate_workers(tx.init(jax.tree.map(lambda a: a[0], case.transform_grads(nproc, 0))), nproc)
specs = parallel.worker_specs(state, "d")


def per_device_update(g, s):
  upd, s2 = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
  return upd, parallel.expand_workers(s2)


update = jax.jit(jax.shard_map(per_device_update, mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs)))
state = jax.tree.map(lambda a, sp: jax.make_array_from_callback(a.shape, NamedSharding(mesh, sp), lambda i: a[i]),
                     state, specs)
for t in range(case.TRANSFORM_STEPS):
  upd, state = update(jax.tree.map(lambda a: globalize(np.asarray(a)), case.transform_grads(nproc, t)), state)
  outs[f"tx_update{t}"] = np.asarray(upd["w"].addressable_data(0))
outs["tx_shard_residual"] = np.asarray(state.shard.residual["w"].addressable_data(0))[0]
np.savez(out, **outs)
jax.distributed.shutdown()
