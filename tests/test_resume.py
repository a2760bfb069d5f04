"""Checkpoint and resume lose nothing: a killed-and-resumed run is bit-identical."""

import csv

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import terngrad_lenet
from experiments import train


def _config(compressor, kwargs):
  c = terngrad_lenet.get_config("runlocal,dataset=mnist5k")
  c.workers = 4
  c.num_train_steps = 16
  c.checkpoint_every = 5
  c.log_every = 4
  c.eval_every = 8
  c.eval_batch_size = 500
  c.progress = False
  c.compressor = compressor
  c.compressor_kwargs = kwargs
  return c


def _final_state(workdir):
  mngr = ocp.CheckpointManager(str(workdir / "checkpoints"))
  step = mngr.latest_step()
  restored = mngr.restore(step, args=ocp.args.StandardRestore())
  mngr.close()
  return step, restored


def _rows(workdir):
  drop = {"wall_time", "steps_per_sec", "train_time"}
  return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(open(workdir / "metrics.csv"))]


@pytest.mark.parametrize("compressor, kwargs", [("terngrad", {"error_feedback": True})])
def test_resume_bit_identical(tmp_path, compressor, kwargs):
  """Kill after step 12 (last checkpoint: 10), resume, finish: same bits as one uninterrupted run."""
  cfg = _config(compressor, kwargs)
  a = train.train_and_evaluate(cfg, str(tmp_path / "a"))
  stopped = train.train_and_evaluate(cfg, str(tmp_path / "b"), stop_after_steps=12)
  assert stopped == {"steps": 12, "stopped_early": True}
  b = train.train_and_evaluate(cfg, str(tmp_path / "b"))
  assert b["resumed_from_step"] == 10
  assert a["test_accuracy"] == b["test_accuracy"]

  step_a, sa = _final_state(tmp_path / "a")
  step_b, sb = _final_state(tmp_path / "b")
  assert step_a == step_b == 16
  leaves_a, tree_a = jax.tree.flatten(sa)
  leaves_b, tree_b = jax.tree.flatten(sb)
  assert tree_a == tree_b and len(leaves_a) > 10
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # The error-feedback residuals are in the checkpoint and are not trivially zero.
  residuals = [np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(sa)[0] if "residual" in str(p)]
  assert residuals and any(np.abs(r).max() > 0 for r in residuals)
  # The metrics file of the resumed run equals the uninterrupted one (timing columns aside).
  assert _rows(tmp_path / "a") == _rows(tmp_path / "b")
