"""Multi-process JAX: two processes (jax.distributed on localhost, gloo) give vmap's numbers."""

import jax
import numpy as np
import pytest

import jaxcomp
from jaxcomp import parallel

from _processes import load_multiprocess_module, run_workers

N = 2


def _cases_module():
  return load_multiprocess_module("cases")


def _cases():
  return _cases_module().CASES


# The steps whose update is not zero. "wrappers": jaxcomp.multi_steps(k=2) inside
# jaxcomp.apply_if_finite around a compressed chain, step 2 not finite on worker 1 (skipped).
@pytest.mark.parametrize("case, moving", [("terngrad", {0, 1}), ("wrappers", {1, 4}), ("diloco", {1, 3}),
                                          ("streaming_diloco", {1, 2, 3})])
@pytest.mark.slow
def test_two_processes_match_vmap(tmp_path, case, moving):
  outs = run_workers("worker.py", N, tmp_path, args=[case])
  for k in outs[0]:  # every process holds the same average
    if "residual" not in k:  # residuals are each worker's own
      np.testing.assert_array_equal(outs[0][k], outs[1][k])
  # Buckets across processes: the per-tensor exchange's numbers, bit for bit (cases.ALSO).
  for out in outs:
    per_tensor = sorted(k for k in out if "_per_tensor_" in k)
    assert len(per_tensor) == (10 if case == "terngrad" else 0)
    for k in per_tensor:
      np.testing.assert_array_equal(out[k], out[k.replace("per_tensor", "bucketed")], err_msg=k)

  # The same steps with N simulated workers under vmap, in this process.
  make_tx, grads, steps = _cases()[case](N)
  tx = make_tx("w")
  state = parallel.replicate_workers(tx.init({"w": np.zeros((37, 11), np.float32), "b": np.zeros(11, np.float32)}), N)
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w"))
  moved = set()
  for t in range(steps):
    upd, state = step(grads(t), state)
    for name in ("w", "b"):
      np.testing.assert_allclose(outs[0][f"{name}{t}"], np.asarray(upd[name]), atol=1e-6, rtol=0)
      if np.any(upd[name]):
        moved.add(t)
  assert moved == moving


def test_data_parallel_over_two_processes_matches_vmap(tmp_path):
  """``jaxcomp.data_parallel`` on a mesh of two processes: its init, placement and step give vmap's numbers."""
  outs = run_workers("data_parallel_worker.py", N, tmp_path)
  make_tx, worker_step, params, batch, steps = _cases_module().DATA_PARALLEL(N)
  tx = make_tx("w")
  step = jaxcomp.data_parallel(worker_step(tx, "w"), tx, workers=N, axis_name="w")
  params, state = step.init(params)
  for _ in range(steps):
    params, state = step(params, state, batch)
  for i, out in enumerate(outs):
    assert int(out["compiles"]) == 1
    for k in ("w", "b"):
      np.testing.assert_allclose(out[f"param_{k}"], np.asarray(params[k]), atol=1e-6, rtol=0)
    np.testing.assert_allclose(out["residual_w"][0], np.asarray(state[0].local.residual["w"][i]), atol=1e-6, rtol=0)
