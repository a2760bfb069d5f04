"""examples/pmap_train.py (the Flax examples' shape: TrainState, pmap, BatchNorm, orbax) trains,
evaluates and resumes with every worker's residual as it was, by pmap and by jaxcomp.data_parallel;
docs/pmap.md shows its diff from the float program."""

import pathlib
import re

import jax
import numpy as np
import pytest

import jaxcomp
from examples import pmap_train
from tests._layouts import require_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _worker_local(state):
  return jax.tree.leaves(jaxcomp.core.worker_locals(state.opt_state))


@pytest.mark.parametrize("route", ["pmap", "data_parallel"])
def test_resumes_with_every_workers_residual(tmp_path, route):
  require_devices(8)
  config = pmap_train.get_config()
  config.update(compressor="threelc", features=(4,), batch_size=64, num_steps=2, checkpoint_every=2, eval_every=0,
                route=route)
  first = pmap_train.train_and_evaluate(config, str(tmp_path))
  (step, accuracy), = first["accuracy"]  # the eval step, on the state as the train step returns it
  assert step == 2 and 0.1 < accuracy <= 1
  residual = np.asarray(first["state"].opt_state[0].local.residual["Dense_0"]["kernel"])
  assert residual.shape[0] == 8 and not np.allclose(residual, residual[:1])  # each worker its own

  again = pmap_train.train_and_evaluate(config, str(tmp_path))  # restores step 2; nothing left to train
  assert again["start"] == 2
  for saved, restored in zip(_worker_local(first["state"]), _worker_local(again["state"])):
    np.testing.assert_array_equal(np.asarray(restored), np.asarray(saved))
  for part in ("params", "batch_stats", "step"):
    jax.tree.map(np.testing.assert_array_equal, getattr(again["state"], part), getattr(first["state"], part))


def test_docs_diff_from_float_is_the_example_and_at_most_ten_lines():
  page = (ROOT / "docs" / "pmap.md").read_text()
  example = (ROOT / "examples" / "pmap_train.py").read_text().splitlines()
  diffs = re.findall(r"^```diff\n(.*?)^```", page, flags=re.S | re.M)
  assert diffs
  for diff in diffs:
    for line in diff.splitlines():
      if line.startswith("+"):
        assert line[1:] in example, line  # what the page shows is the program the test runs
      elif line.startswith("-"):
        assert line[1:] not in example, line
      elif line.strip() and not line.startswith("@@"):
        assert line[1:] in example, line  # context
  added = [l for l in diffs[0].splitlines() if l.startswith("+")]
  removed = [l for l in diffs[0].splitlines() if l.startswith("-")]
  assert 0 < len(added) <= 10 and len(removed) <= 10, (added, removed)
