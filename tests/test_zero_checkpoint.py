"""Checkpoints of a sharded optimizer state (``jaxcomp.shard_optimizer``) resume bit-identically.

Through ``jaxcomp.data_parallel``, with TernGrad (error feedback) and AdamW
sharded over 4 workers, the parameters whole or sharded too (ZeRO-3, gathered
in qwZ's int8 blocks): one worker per device (4 of the host devices) and 4
vmap-simulated workers. Two steps, an orbax checkpoint of ``(params,
opt_state)``, two more; the checkpoint restored into ``step.abstract(params)``
(shapes and shardings: no state in memory) and the same two steps again:
the parameters (or every worker's chunk of them), every worker's shard of
AdamW's moments, every residual and counter equal the uninterrupted run's
bit for bit, and on the devices the step does not compile again. Two processes
(jax.distributed, gloo), each writing its own shards: the same resume, every
run (float or compressed, either stage) equal to one process's shard_map over
two devices bit for bit, and a float run to its vmap up to float32 rounding.
"""

import functools
import tempfile
from typing import NamedTuple

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import jaxcomp
from jaxcomp import zero_params

from _processes import load_multiprocess_module, run_workers

N = 2  # workers: as many as the two-process test's processes, whose numbers are this process's runs'
cases = load_multiprocess_module("cases")
LAYOUTS = {"mesh": {"mesh": Mesh(np.array(jax.devices()[:N]), ("d",))}, "vmap": {"workers": N, "axis_name": "d"}}
# The bytes a worker's gather sends a step, the cut tensor w (640 values) a chunk of 320 a worker: the
# updates' in float32, or (parameters sharded) the weights' in int8 blocks of 40 values, a float32 scale each.
GATHER_BYTES = {"terngrad": 4 * 320, "qwz_terngrad": 320 + 4 * 320 // 40}


def _run(step, params, state, batch, n):
  for _ in range(n):
    params, state = step(params, state, batch)
  return params, state


def _step(run, layout):
  """``(data_parallel step, initial parameters, batch, steps before and after a checkpoint)`` of ``run``."""
  make_tx, worker_step, init_params, batch, steps = cases.ZERO(N)
  tx = make_tx(run, "d")
  return jaxcomp.data_parallel(worker_step(tx, "d"), tx, **LAYOUTS[layout]), init_params, batch, steps


def _leaves(tree):
  return {k: np.asarray(v) for k, v in cases.leaves_by_path(tree).items()}


class Resumed(NamedTuple):
  """A run of cases.ZERO in this process, uninterrupted and resumed from its checkpoint."""

  through: dict  # every leaf of (params, opt_state) after all the steps
  resumed: dict  # the same, the last steps run again from the checkpoint
  rows: list  # as restored, the shapes of each device's part of w's chunks: AdamW's moment (and w's own)
  compiles: int  # how many times the step compiled
  gather_bytes: int  # what a worker's gather sent in the last step


@functools.cache
def _resumed(run: str, layout: str) -> Resumed:
  """``run`` in ``layout``: two steps, an orbax checkpoint, two more; restored into ``step.abstract`` and
  the same two steps again (cached: the two-process test compares its processes with these runs)."""
  step, init_params, batch, (before, after) = _step(run, layout)
  params, state = _run(step, *step.init(init_params), batch, before)
  with tempfile.TemporaryDirectory() as directory:
    cases.save_checkpoint(directory, before, (params, state))
    through = _leaves(_run(step, params, state, batch, after))
    restored = cases.restore_checkpoint(directory, step.abstract(init_params))
  rows = [restored[1].local.residual[1][0].mu["w"]]
  if isinstance(restored[0], zero_params.ShardedParams):
    rows.append(restored[0].local.residual["w"])
  rows = [[s.data.shape for s in row.addressable_shards] for row in rows]
  resumed = _run(step, *restored, batch, after)
  return Resumed(through, _leaves(resumed), rows, step.compiles(), int(jaxcomp.metrics(resumed[1])["gather_bytes"]))


@pytest.mark.parametrize("run", sorted(GATHER_BYTES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sharded_state_resumes_bit_identical(layout, run):
  got = _resumed(run, layout)
  assert got.through.keys() == got.resumed.keys()
  for k, v in got.through.items():
    np.testing.assert_array_equal(got.resumed[k], v, err_msg=k)
  # Laid out as the step lays them: on the mesh each device holds its worker's row of 320 values.
  sharded_params = cases.ZERO_RUNS[run][1].get("shard_params", False)
  assert got.rows == [[(1, 320)] * N if layout == "mesh" else [(N, 320)]] * (2 if sharded_params else 1)
  # The restored state is laid out as the step returns it (on the mesh, or under vmap on the default
  # device, committed as init's arrays are): no move, no second compile.
  assert got.compiles == 1
  assert got.gather_bytes == GATHER_BYTES[run]


def _float_run(run, layout):
  """Every leaf after all the steps of a float ``run`` in ``layout``, uninterrupted."""
  step, init_params, batch, (before, after) = _step(run, layout)
  return _leaves(_run(step, *step.init(init_params), batch, before + after))


def _outputs(out, run):
  """A worker process's leaves of ``run``: ``(uninterrupted, resumed from its checkpoint)`` (zero_worker.py)."""
  mine = {k[len(run) + 1:]: v for k, v in out.items() if k.startswith(run + "/")}
  resumed = {k[len("resumed/"):]: v for k, v in mine.items() if k.startswith("resumed/")}
  return {k: v for k, v in mine.items() if k.startswith("[")}, resumed


@pytest.mark.slow
def test_two_processes_resume_and_match_one(tmp_path):
  """Each process writes its own shards and resumes bit-identically, the parameters whole or sharded; every
  run is this process's over as many devices bit for bit (compressed too: TernGrad's gradients, qwZ's
  weights), and a float run its vmap's to float32 rounding (another program: XLA fuses vmap's batched
  arithmetic otherwise, as it does for the replicated step)."""
  outs = run_workers("zero_worker.py", N, tmp_path, args=[str(tmp_path / "checkpoints")])
  for run, (compressor, _) in cases.ZERO_RUNS.items():
    compressed = compressor != "none"
    one = _resumed(run, "mesh").through if compressed else _float_run(run, "mesh")
    vmap = None if compressed else _float_run(run, "vmap")
    for pid, out in enumerate(outs):
      assert int(out[f"{run}/compiles"]) == 1, run
      got, resumed = _outputs(out, run)
      assert got.keys() == one.keys(), run
      assert resumed.keys() == (got.keys() if compressed else set()), run
      for k, v in resumed.items():
        np.testing.assert_array_equal(v, got[k], err_msg=f"{run} {k}")
      for k, want in one.items():  # a worker-local leaf: this process's row; the rest whole
        row = (lambda a: a) if got[k].shape == want.shape else (lambda a: a[pid:pid + 1])
        np.testing.assert_array_equal(got[k], row(want), err_msg=f"{run} {k}")
        if vmap is not None:
          np.testing.assert_allclose(got[k], row(vmap[k]), rtol=2e-6, atol=1e-7, err_msg=f"{run} {k}")
