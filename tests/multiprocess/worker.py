"""One process of the multi-process test: jax.distributed on localhost, gloo collectives.

Usage: python worker.py PORT NUM_PROCESSES PROCESS_ID OUT.npz [CASE]
Runs exchange steps with jax.shard_map over a mesh of one CPU device per
process, and saves the averaged updates (and the final residuals). CASE (a key
of cases.CASES) picks the transform and the steps: "terngrad" (default), two
steps of the compressor alone, and int8 with and without buckets
(cases.ALSO); "wrappers", five steps of a chain inside jaxcomp.multi_steps
and jaxcomp.apply_if_finite, with a NaN on worker 1 at step 2.
"""

import sys

import jax

port, nproc, pid, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
case = sys.argv[5] if len(sys.argv) > 5 else "terngrad"
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                           process_id=pid, local_device_ids=[0])

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxcomp import parallel  # noqa: E402

assert jax.process_count() == nproc and len(jax.devices()) == nproc


from cases import ALSO, CASES  # noqa: E402  (this directory is on sys.path)

make_tx, grads, steps = CASES[case](nproc)
mesh = jax.make_mesh((nproc,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
params = {"w": jnp.zeros((37, 11)), "b": jnp.zeros((11,))}


def globalize(tree, spec_tree):
  return jax.tree.map(
      lambda a, sp: jax.make_array_from_callback(a.shape, NamedSharding(mesh, sp), lambda idx: a[idx]),
      tree, spec_tree)


def run(tx, prefix):
  """``steps`` exchange steps: the updates as ``prefix + name + step``, the final residuals."""
  state = parallel.replicate_workers(tx.init(params), nproc)
  specs = parallel.worker_specs(state, "d")

  def per_device(g, s):
    upd, s2 = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    return upd, parallel.expand_workers(s2)

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs)))
  state = globalize(state, specs)
  got = {}
  for t in range(steps):
    g = globalize(grads(t), jax.tree.map(lambda _: P("d"), grads(t)))
    upd, state = step(g, state)
    for k, v in upd.items():
      got[f"{prefix}{k}{t}"] = np.asarray(v.addressable_data(0))
  residual = getattr(getattr(state, "local", None), "residual", None)
  for k, v in (residual.items() if isinstance(residual, dict) else ()):
    if hasattr(v, "addressable_data"):  # none where the compressor keeps no residual
      got[f"{prefix}residual_{k}"] = np.asarray(v.addressable_data(0))
  return got


outs = run(make_tx("d"), "")
for prefix, make in ALSO.get(case, {}).items():
  outs.update(run(make("d"), prefix))
np.savez(out, **outs)
jax.distributed.shutdown()
