"""Checkpoints of a sharded optimizer state (``jaxcomp.shard_optimizer``) resume bit-identically.

Through ``jaxcomp.data_parallel``, with TernGrad (error feedback) and AdamW
sharded over 4 workers: one worker per device (4 of the host devices) and 4
vmap-simulated workers. Two steps, an orbax checkpoint of ``(params,
opt_state)``, two more; the checkpoint restored into ``step.abstract(params)``
(shapes and shardings: no state in memory) and the same two steps again:
the parameters, every worker's shard of AdamW's moments, every residual
and counter equal the uninterrupted run's bit for bit, and the step does not
compile again. Two processes (jax.distributed, gloo), each writing its own
shards: the same resume, and the float sharded step equal to one process's
shard_map over two devices bit for bit (and to its vmap up to float32 rounding).
"""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import jaxcomp

from _processes import load_multiprocess_module, run_workers

N = 4
cases = load_multiprocess_module("cases")


def _run(step, params, state, batch, n):
  for _ in range(n):
    params, state = step(params, state, batch)
  return params, state


def _assert_same_leaves(a, b):
  a, b = cases.leaves_by_path(a), cases.leaves_by_path(b)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


@pytest.mark.parametrize("layout", ["mesh", "vmap"])
def test_sharded_state_resumes_bit_identical(tmp_path, layout):
  make_tx, worker_step, init_params, batch, (before, after) = cases.ZERO(N)
  tx = make_tx("terngrad", "workers")
  where = {"mesh": Mesh(np.array(jax.devices()[:N]), ("workers",))} if layout == "mesh" else {"workers": N}
  step = jaxcomp.data_parallel(worker_step(tx, "workers"), tx, **where)
  params, state = _run(step, *step.init(init_params), batch, before)
  cases.save_checkpoint(tmp_path, before, (params, state))
  through = _run(step, params, state, batch, after)

  target = step.abstract(init_params)
  restored = cases.restore_checkpoint(tmp_path, target)
  mu = restored[1].local.residual[1][0].mu["w"]
  assert mu.shape == (N, 160)  # a shard of w's 640 values a worker
  if layout == "mesh":  # laid out as the step lays it: each device holds its worker's row
    assert [s.data.shape for s in mu.addressable_shards] == [(1, 160)] * N
  resumed = _run(step, *restored, batch, after)
  _assert_same_leaves(through, resumed)
  # On the mesh the restored state is laid out as the step returns it: no move, no compile. Under
  # vmap orbax's arrays are committed to their device and init's are not: jit compiles once more.
  assert step.compiles() == (1 if layout == "mesh" else 2)
  assert int(jaxcomp.metrics(resumed[1])["gather_bytes"]) == 4 * 160


@pytest.mark.slow
def test_two_processes_resume_and_match_one(tmp_path):
  """Each process writes its own shards and resumes bit-identically; the float sharded step is one
  process's over as many devices bit for bit, and its vmap's to float32 rounding (another program:
  XLA fuses vmap's batched arithmetic otherwise, as it does for the replicated step)."""
  nproc = 2
  outs = run_workers("zero_worker.py", nproc, tmp_path, args=[str(tmp_path / "checkpoints")])
  make_tx, worker_step, init_params, batch, (before, after) = cases.ZERO(nproc)
  tx = make_tx("none", "d")
  mesh = Mesh(np.array(jax.devices()[:nproc]), ("d",))
  ones = {}
  for name, where in (("devices", {"mesh": mesh}), ("vmap", {"workers": nproc, "axis_name": "d"})):
    step = jaxcomp.data_parallel(worker_step(tx, "d"), tx, **where)
    ones[name] = {k: np.asarray(v) for k, v in
                  cases.leaves_by_path(_run(step, *step.init(init_params), batch, before + after)).items()}
  for pid, out in enumerate(outs):
    assert int(out["compiles"]) == 1
    resumed = {k[len("resumed_"):]: v for k, v in out.items() if k.startswith("resumed_")}
    assert len(resumed) > 10
    for k, v in resumed.items():
      np.testing.assert_array_equal(v, out["through_" + k], err_msg=k)
    for k, want in ones["devices"].items():  # a worker-local leaf: this process's row; the rest whole
      row = (lambda a: a) if out["float_" + k].shape == want.shape else (lambda a: a[pid:pid + 1])
      np.testing.assert_array_equal(out["float_" + k], row(want), err_msg=k)
      np.testing.assert_allclose(out["float_" + k], row(ones["vmap"][k]), rtol=2e-6, atol=1e-7, err_msg=k)
