"""Multi-process JAX: two processes (jax.distributed on localhost, gloo) give vmap's numbers."""

import jax
import numpy as np

import jaxcomp
from jaxcomp import parallel

from _processes import run_workers

N = 2


def test_two_processes_match_vmap(tmp_path):
  outs = run_workers("worker.py", N, tmp_path)
  for k in outs[0]:  # every process holds the same average
    if "residual" not in k:  # residuals are each worker's own
      np.testing.assert_array_equal(outs[0][k], outs[1][k])
  # Buckets across processes: the per-tensor exchange's numbers, bit for bit.
  for out in outs:
    per_tensor = sorted(k for k in out if k.startswith("int8_per_tensor_"))
    assert len(per_tensor) == 6
    for k in per_tensor:
      np.testing.assert_array_equal(out[k], out[k.replace("per_tensor", "bucketed")], err_msg=k)

  # The same exchange with N simulated workers under vmap, in this process.
  tx = jaxcomp.terngrad(axis_name="w")
  state = parallel.replicate_workers(tx.init({"w": np.zeros((37, 11), np.float32), "b": np.zeros(11, np.float32)}), N)
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w"))
  for t in range(2):
    k = jax.random.PRNGKey(100 + t)
    g = {"w": jax.random.normal(k, (N, 37, 11)), "b": jax.random.normal(k, (N, 11)) * 0.1}
    upd, state = step(g, state)
    for name in ("w", "b"):
      np.testing.assert_allclose(outs[0][f"{name}{t}"], np.asarray(upd[name]), atol=1e-6, rtol=0)
