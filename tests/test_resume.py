"""Checkpoint and resume lose nothing.

* A killed-and-resumed run is bit-identical to an uninterrupted one.
* SIGTERM (preemption) at any step: the run saves that step and exits with
  code 75; resumed, it ends bit-identical, ``metrics.csv`` included.
* A checkpoint that fails to read (truncated or missing data file, corrupt
  metadata) is reported, moved aside, and the next older one is restored;
  with none left the run stops with one clear error, or starts afresh.

One uninterrupted run and one run stopped after step 12 (checkpoints 5 and
10) of ``tests/resume_config.py`` are shared by the tests (copies of the
latter are damaged).
"""

import csv
import gc
import logging
import os
import shutil
import signal
import subprocess
import sys
import types

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiments import preemption
from experiments import state as state_lib
from experiments import train
from resume_config import get_config as _config


def _final_state(workdir):
  mngr = ocp.CheckpointManager(str(workdir / "checkpoints"))
  step = mngr.latest_step()
  restored = mngr.restore(step, args=ocp.args.StandardRestore())
  mngr.close()
  return step, restored


def _rows(workdir):
  drop = {"wall_time", "steps_per_sec", "train_time"}
  return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(open(workdir / "metrics.csv"))]


def _assert_same_run(a, b):
  """Two workdirs ended with the same final checkpoint, bit for bit, and the same metrics.csv."""
  step_a, sa = _final_state(a)
  step_b, sb = _final_state(b)
  assert step_a == step_b == 16
  leaves_a, tree_a = jax.tree.flatten(sa)
  leaves_b, tree_b = jax.tree.flatten(sb)
  assert tree_a == tree_b and len(leaves_a) > 10
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # The metrics file of the resumed run equals the uninterrupted one (timing columns aside).
  assert _rows(a) == _rows(b)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  return workdir, train.train_and_evaluate(_config(), str(workdir))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
  """A run stopped after step 12 as if killed: checkpoints 5 and 10, metrics up to 12."""
  workdir = tmp_path_factory.mktemp("stopped")
  assert train.train_and_evaluate(_config(), str(workdir), stop_after_steps=12) == {
      "steps": 12, "stopped_early": True}
  assert sorted(os.listdir(workdir / "checkpoints")) == ["10", "5"]
  return workdir


def test_resume_bit_identical(tmp_path, uninterrupted, stopped):
  """Killed after step 12 (last checkpoint: 10), resumed, finished: same bits as one uninterrupted run."""
  a, summary_a = uninterrupted
  b = tmp_path / "b"
  shutil.copytree(stopped, b)
  summary_b = train.train_and_evaluate(_config(), str(b))
  assert summary_b["resumed_from_step"] == 10
  assert summary_a["test_accuracy"] == summary_b["test_accuracy"]
  _assert_same_run(a, b)
  # The error-feedback residuals are in the checkpoint and are not trivially zero.
  _, sa = _final_state(a)
  residuals = [np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(sa)[0] if "residual" in str(p)]
  assert residuals and any(np.abs(r).max() > 0 for r in residuals)


def test_sigterm_saves_its_step_and_resumes_bit_identical(tmp_path, monkeypatch, uninterrupted):
  """SIGTERM during step 7 (mid log interval, no checkpoint due): checkpoint 7, exit 75, resume."""
  reached = preemption.Watcher.reached

  def sigterm_at_7(self, step):
    if step == 7:
      os.kill(os.getpid(), signal.SIGTERM)  # the real signal, to this process's own handler
    return reached(self, step)

  monkeypatch.setattr(preemption.Watcher, "reached", sigterm_at_7)
  handler = signal.getsignal(signal.SIGTERM)
  b = tmp_path / "b"
  with pytest.raises(preemption.Preempted) as stop:
    train.train_and_evaluate(_config(), str(b))
  assert stop.value.code == preemption.PREEMPTED_EXIT_CODE == 75
  assert stop.value.step == 7 and stop.value.checkpoint == str(b / "checkpoints" / "7")
  assert signal.getsignal(signal.SIGTERM) is handler  # put back
  assert sorted(os.listdir(b / "checkpoints")) == ["5", "7"]
  # Every row up to step 7 is written; steps 6 and 7 (the open interval) are kept beside them.
  assert [(r["step"], r["split"]) for r in _rows(b)] == [("4", "train"), ("5", "train")]
  assert (b / "metrics_interval.npz").exists()

  monkeypatch.setattr(preemption.Watcher, "reached", reached)
  assert train.train_and_evaluate(_config(), str(b))["resumed_from_step"] == 7
  _assert_same_run(uninterrupted[0], b)


def _largest_data_file(step_dir):
  files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs if os.sep + "d" + os.sep in
           os.path.join(d, f)]
  return max(files, key=os.path.getsize)


def _truncate(step_dir):
  path = _largest_data_file(step_dir)
  with open(path, "r+b") as f:
    f.truncate(100)
  return os.path.relpath(path, step_dir)


def _remove(step_dir):
  path = _largest_data_file(step_dir)
  os.remove(path)
  return None


def _corrupt_metadata(step_dir):
  (step_dir / "default" / "_METADATA").write_text('{"tree_metadata": ')
  return "default/_METADATA"


def flip_a_byte(path):
  """One byte of the file at ``path`` inverted, its size kept (orbax reads such a file without an error)."""
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


def _flip(step_dir):
  path = _largest_data_file(step_dir)
  flip_a_byte(path)
  return os.path.relpath(path, step_dir)


DAMAGE = {"truncated data file": _truncate, "missing data file": _remove,
          "corrupt metadata": _corrupt_metadata, "flipped byte in a data file": _flip}


# orbax's reads left pending by a failed restore must not surface later as "Exception ignored
# in: <coroutine ...>" or "Task exception was never retrieved" pages: the tests collect garbage
# at their end and fail on any.
quiet = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


def _assert_quiet(caplog):
  gc.collect()
  assert not [r.getMessage()[:200] for r in caplog.records if r.name == "asyncio"]


@quiet
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint_falls_back_to_the_older_one(tmp_path, stopped, caplog, damage):
  """Checkpoint 10 damaged: reported in one line, moved aside, checkpoint 5 restored."""
  b = tmp_path / "b"
  shutil.copytree(stopped, b)
  kept = DAMAGE[damage](b / "checkpoints" / "10")
  assert train.train_and_evaluate(_config(), str(b), stop_after_steps=1) == {
      "steps": 6, "stopped_early": True}
  lines = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"checkpoint of step 10 at {b / 'checkpoints' / '10'} cannot be read: ")
  assert f"moved it to {b / 'checkpoints.damaged' / '10'}; trying step 5" in lines[0]
  assert "\n" not in lines[0]
  assert sorted(os.listdir(b / "checkpoints")) == ["5"]
  assert sorted(os.listdir(b / "checkpoints.damaged")) == ["10"]  # moved, not deleted
  if kept is not None:
    assert (b / "checkpoints.damaged" / "10" / kept).exists()
  # metrics.csv is cut back to the step restored, as on any resume.
  assert [(r["step"], r["split"]) for r in _rows(b)] == [("4", "train"), ("5", "train")]
  _assert_quiet(caplog)


@quiet
def test_a_step_that_another_process_lacks_is_moved_aside(tmp_path, stopped, caplog, monkeypatch):
  """Another process lists step 5 as its newest (its view lacks 10): every process restores 5, and says so."""
  b = tmp_path / "b"
  shutil.copytree(stopped, b)
  monkeypatch.setattr(state_lib, "_gather_ints", lambda value: np.array([value, min(value, 5)]))
  caplog.set_level(logging.INFO)
  assert train.train_and_evaluate(_config(), str(b), stop_after_steps=0) == {"steps": 5, "stopped_early": True}
  messages = [r.getMessage() for r in caplog.records]
  assert any(m.startswith("checkpoint of step 10 is not on every process (process(es) 1 list none): "
                          f"moved it to {b / 'checkpoints.damaged' / '10'}") for m in messages), messages
  assert ("restoring the checkpoint of step 5: the newest that every process (1) has completely and reads "
          "(moved aside: step(s) 10)") in messages
  assert sorted(os.listdir(b / "checkpoints")) == ["5"]
  _assert_quiet(caplog)


def test_a_late_closed_loop_report_is_dropped_and_others_are_not(monkeypatch):
  """After a failed restore, a read finishing late on orbax's closed loop prints nothing.

  TensorStore can finish an abandoned read seconds after orbax closed its loop;
  the report it raises (``RuntimeError("Event loop is closed")``, ignored in
  ``None``) used to reach pytest after the restore's own wait had ended.
  """
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  state_lib._collect_orbax_leftovers(timeout=0.0)  # pylint: disable=protected-access
  state_lib._collect_orbax_leftovers(timeout=0.0)  # installs its hook once  # pylint: disable=protected-access

  def report(exc):
    return types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                                 err_msg=None, object=None)

  sys.unraisablehook(report(RuntimeError("Event loop is closed")))
  assert not seen
  other = report(RuntimeError("something else"))
  sys.unraisablehook(other)
  assert seen == [other]


def test_an_orbax_tasks_late_unretrieved_exception_is_dropped_and_others_are_not(caplog):
  """The task of a read orbax abandoned can be collected long after the restore: asyncio's
  "Task exception was never retrieved" for it is dropped whenever it comes, another task's is not."""
  state_lib._collect_orbax_leftovers(timeout=0.0)  # pylint: disable=protected-access
  state_lib._collect_orbax_leftovers(timeout=0.0)  # pylint: disable=protected-access
  asyncio_log = logging.getLogger("asyncio")
  assert asyncio_log.filters.count(state_lib._orbax_task_reports) == 1  # pylint: disable=protected-access
  orbax = os.path.join("site-packages", "orbax", "checkpoint", "serialization.py")
  with caplog.at_level(logging.ERROR, logger="asyncio"):
    asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished coro=<_read() done, "
                      "defined at %s:272> exception=Exception('read')>", orbax)
    asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished coro=<mine() done, "
                      "defined at %s:1> exception=Exception('mine')>", os.path.join("src", "mine.py"))
  assert [r.getMessage().split("coro=<")[1][:5] for r in caplog.records] == ["mine("]


@quiet
@pytest.mark.slow
def test_no_readable_checkpoint_stops_or_starts_afresh(tmp_path, stopped, caplog):
  """Both checkpoints damaged: one CheckpointError naming them and where they went, unless told."""
  b = tmp_path / "b"
  shutil.copytree(stopped, b)
  _truncate(b / "checkpoints" / "10")
  _corrupt_metadata(b / "checkpoints" / "5")
  with pytest.raises(state_lib.CheckpointError) as error:
    train.train_and_evaluate(_config(), str(b))
  assert str(error.value) == (
      f"no readable checkpoint in {b / 'checkpoints'}: step(s) 10, 5 failed to read and were moved "
      f"to {b / 'checkpoints.damaged'}. Set --config.start_afresh_if_unreadable=True to start again "
      "from step 0.")
  assert error.value.__cause__ is None and error.value.__context__ is None  # nothing of orbax's kept
  assert sorted(os.listdir(b / "checkpoints.damaged")) == ["10", "5"]

  c = _config()
  c.start_afresh_if_unreadable = True
  shutil.copytree(stopped / "checkpoints", b / "checkpoints", dirs_exist_ok=True)
  _corrupt_metadata(b / "checkpoints" / "10")
  _corrupt_metadata(b / "checkpoints" / "5")
  assert train.train_and_evaluate(c, str(b), stop_after_steps=1) == {"steps": 1, "stopped_early": True}
  assert sorted(os.listdir(b / "checkpoints.damaged")) == ["10", "10-2", "5", "5-2"]
  assert _rows(b) == []
  _assert_quiet(caplog)


def test_save_errors_name_the_step_and_path(tmp_path, monkeypatch):
  ckpt = state_lib.Checkpointer(str(tmp_path / "checkpoints"), _config())

  def fail(*args, **kwargs):
    try:
      raise OSError(28, "No space left on device")
    except OSError as e:
      raise ValueError("orbax: save failed\nsee above") from e

  monkeypatch.setattr(ckpt._mngr, "save", fail)  # pylint: disable=protected-access
  with pytest.raises(state_lib.CheckpointError) as error:
    ckpt.save(3, {"x": np.zeros(2)})
  assert str(error.value) == (f"could not save the checkpoint of step 3 at {tmp_path / 'checkpoints' / '3'}: "
                              "OSError: [Errno 28] No space left on device")
  assert error.value.__cause__ is None and error.value.__context__ is None


def test_cli_run_over_unreadable_checkpoints_ends_with_one_traceback(tmp_path, stopped):
  """``python -m experiments.train`` over damaged checkpoints: one line each, one exception, no noise.

  Without care, orbax's reads left pending kept printing "Event loop is closed" tracebacks as
  the interpreter exited.
  """
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  b = tmp_path / "b"
  shutil.copytree(stopped, b)
  _truncate(b / "checkpoints" / "10")
  _corrupt_metadata(b / "checkpoints" / "5")
  res = subprocess.run([sys.executable, "-m", "experiments.train", "--config", "tests/resume_config.py",
                        "--workdir", str(b)], cwd=root, env=dict(os.environ, PYTHONPATH=root),
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 1
  reports = [line for line in res.stderr.splitlines() if "cannot be read" in line]
  # Found by the seals (experiments.seals) before orbax reads a byte.
  assert len(reports) == 2 and "step 10" in reports[0] and "bytes, " in reports[0], res.stderr
  assert "step 5" in reports[1] and "default/_METADATA has 18 bytes" in reports[1], res.stderr
  assert res.stderr.count("Traceback") == 1, res.stderr
  assert f"CheckpointError: no readable checkpoint in {b / 'checkpoints'}: step(s) 10, 5" in res.stderr
  for noise in ("Event loop is closed", "Exception ignored", "never retrieved"):
    assert noise not in res.stderr, res.stderr
