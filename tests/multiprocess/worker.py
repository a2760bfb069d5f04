"""One process of the multi-process test: jax.distributed on localhost, gloo collectives.

Usage: python worker.py PORT NUM_PROCESSES PROCESS_ID OUT.npz
Runs two TernGrad exchange steps with jax.shard_map over a mesh of one CPU
device per process, and two int8 steps with and without buckets (with error
feedback, so the residuals are compared too), and saves the averaged updates.
"""

import sys

import jax

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                           process_id=pid, local_device_ids=[0])

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcomp  # noqa: E402
from jaxcomp import parallel  # noqa: E402

assert jax.process_count() == nproc and len(jax.devices()) == nproc


def grads(step):
  """Every worker's gradients, identical in every process (each picks its own row)."""
  k = jax.random.PRNGKey(100 + step)
  return {"w": jax.random.normal(k, (nproc, 37, 11)), "b": jax.random.normal(k, (nproc, 11)) * 0.1}


mesh = jax.make_mesh((nproc,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
params = {"w": jnp.zeros((37, 11)), "b": jnp.zeros((11,))}


def globalize(tree, spec_tree):
  return jax.tree.map(
      lambda a, sp: jax.make_array_from_callback(a.shape, NamedSharding(mesh, sp), lambda idx: a[idx]),
      tree, spec_tree)


def run(tx, prefix):
  """Two exchange steps; the averaged updates under ``prefix + name + step``, and the final residuals."""
  state = parallel.replicate_workers(tx.init(params), nproc)
  specs = parallel.worker_specs(state, "d")

  def per_device(g, s):
    upd, s2 = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    return upd, parallel.expand_workers(s2)

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs)))
  state = globalize(state, specs)
  got = {}
  for t in range(2):
    g = globalize(grads(t), jax.tree.map(lambda _: P("d"), grads(t)))
    upd, state = step(g, state)
    for k, v in upd.items():
      got[f"{prefix}{k}{t}"] = np.asarray(v.addressable_data(0))
  for k, v in state.local.residual.items():
    if hasattr(v, "addressable_data"):  # TernGrad keeps none
      got[f"{prefix}residual_{k}"] = np.asarray(v.addressable_data(0))
  return got


# The default (one bucket: both tensors' rounds fused) and the per-tensor exchange.
outs = {**run(jaxcomp.terngrad(axis_name="d"), ""),
        **run(jaxcomp.int8(axis_name="d", bucket_bytes=0), "int8_per_tensor_"),
        **run(jaxcomp.int8(axis_name="d"), "int8_bucketed_")}
np.savez(out, **outs)
jax.distributed.shutdown()
