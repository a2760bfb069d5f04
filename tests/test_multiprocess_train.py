"""experiments.train over several processes (jax.distributed on loopback, gloo collectives).

* 2 processes x 4 devices train like 1 process x 8 (this process,
  ``conftest.py``): same config and seed, for TernGrad (hierarchical: 2 hosts)
  and 1-bit SGD (error feedback); the final checkpoints
  (parameters, optimizer state with the residuals, EMA) agree to 1e-6.
* A process SIGKILLed after a checkpoint stops the run (its peer fails fast,
  within the heartbeat timeout) and leaves that checkpoint.
* SIGTERM to ``experiments.launch`` (preemption): both processes stop after
  the same step (JAX's preemption sync point), save it, exit with 75, and so
  does the launcher; restarted, the run ends bit-identical.
* ``experiments.launch --max-restarts`` after SIGKILLs, resuming bit-identical:
  ``tests/test_chaos.py``.
* Processes that disagree: process 1's part of the newest checkpoint lost,
  cut short or corrupted; both restore the older step and say so.
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiments import train

from _processes import compilation_cache_env, free_port, load_multiprocess_module, worker_xla_flags

# Worker processes: a minute or more on two cores. The module's training fixture counts
# against its first test's time limit (90 s with other jobs on the machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NPROC = 2


train_config = load_multiprocess_module("train_config")


def worker_env(cache):
  """The workers' environment: 4 CPU devices each, XLA:CPU's emitters as this process's, and
  ``cache`` for their compiled programs.

  The module's launches train the same tiny configs, so each compiles what
  the first one did: with one compilation cache for them all, the later
  ones load it instead.
  """
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=worker_xla_flags(4), **compilation_cache_env(cache))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp("xla_cache")


def launch(out_dir, names, *options, cache):
  """Starts NPROC worker processes (4 CPU devices each) training ``names``; returns them."""
  port = free_port()
  procs = []
  for i in range(NPROC):
    env = dict(worker_env(cache), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
               JAXCOMP_NUM_PROCESSES=str(NPROC), JAXCOMP_PROCESS_ID=str(i))
    cmd = [sys.executable, os.path.join(HERE, "multiprocess", "train_worker.py"), str(out_dir),
           ",".join(names), *options]
    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  return procs


def wait(procs, timeout=600, check=True):
  """Waits for ``procs``; returns their outputs and exit times (all killed after ``timeout``)."""
  done = [None] * len(procs)

  def collect(i):
    out = procs[i].communicate()[0]
    done[i] = (out, time.monotonic())

  threads = [threading.Thread(target=collect, args=(i,)) for i in range(len(procs))]
  for t in threads:
    t.start()
  deadline = time.monotonic() + timeout
  for t in threads:
    t.join(max(deadline - time.monotonic(), 0))
  if any(t.is_alive() for t in threads):
    for p in procs:
      p.kill()
    for t in threads:
      t.join()
    raise AssertionError(f"the processes did not end within {timeout} s")
  logs, times = [d[0] for d in done], [d[1] for d in done]
  for p, log in zip(procs, logs):
    assert p.returncode == 0 or not check, log[-4000:]
  return logs, times


def summaries(log):
  """The summaries a worker printed, by compressor."""
  out = {}
  for line in log.splitlines():
    if line.startswith('{"compressor"'):
      record = json.loads(line)
      out[record["compressor"]] = record["summary"]
  return out


def metric_rows(workdir):
  drop = {"wall_time", "steps_per_sec", "train_time"}
  return [{k: v for k, v in r.items() if k not in drop}
          for r in csv.DictReader(open(os.path.join(str(workdir), "metrics.csv")))]


def final_checkpoint(workdir):
  """``(step, state)`` of the latest checkpoint in ``workdir``, on this process's first device.

  The checkpoint may come from a run on other devices (2 processes): its
  arrays are restored onto one device here.
  """
  mngr = ocp.CheckpointManager(os.path.join(str(workdir), "checkpoints"))
  step = mngr.latest_step()
  mngr.close()
  path = os.path.join(str(workdir), "checkpoints", str(step), "default")
  ckptr = ocp.StandardCheckpointer()
  meta = ckptr.metadata(path).item_metadata
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta)
  return step, ckptr.restore(path, abstract)


def assert_states_close(a, b, atol):
  leaves_a, tree_a = jax.tree_util.tree_flatten_with_path(a)
  leaves_b, tree_b = jax.tree_util.tree_flatten_with_path(b)
  assert [p for p, _ in leaves_a] == [p for p, _ in leaves_b]
  for (path, x), (_, y) in zip(leaves_a, leaves_b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol,
                               err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache):
  """Every compressor trained by 2 worker processes (sealed checkpoints of steps 2 and 4) and,
  meanwhile, by this process."""
  root = tmp_path_factory.mktemp("train")
  names = list(train_config.COMPRESSORS)
  procs = launch(root / "mp", names, "--checkpoint_every=2", cache=cache)
  single = {n: train.train_and_evaluate(train_config.config(n), str(root / "sp" / n)) for n in names}
  multi = summaries(wait(procs)[0][0])
  return root, single, multi


@pytest.mark.parametrize("name", list(train_config.COMPRESSORS))
def test_two_processes_train_like_one(runs, name):
  root, single, multi = runs
  assert single[name]["processes"] == 1 and multi[name]["processes"] == NPROC
  assert single[name]["devices"] == multi[name]["devices"] == 8
  assert single[name]["hosts"] == multi[name]["hosts"] == train_config.HOSTS.get(name, 0)
  for k in ("steps", "bytes_on_wire", "float32_bytes", "test_examples"):
    assert single[name][k] == multi[name][k], k
  step_s, state_s = final_checkpoint(root / "sp" / name)
  step_m, state_m = final_checkpoint(root / "mp" / name)
  assert step_s == step_m == train_config.STEPS
  assert_states_close(state_s, state_m, atol=1e-6)
  # The parameters moved away from their average, and 1-bit SGD's residuals are not zero.
  assert np.abs(np.asarray(state_m["params"]["fc1"]["kernel"]) -
                np.asarray(state_m["ema_params"]["fc1"]["kernel"])).max() > 0
  if name == "onebit":
    residuals = [np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(state_m)[0]
                 if "residual" in jax.tree_util.keystr(p)]
    assert residuals and max(np.abs(r).max() for r in residuals) > 0
  # Process 0 alone wrote the files: one row per logged interval and evaluation.
  assert [(r["step"], r["split"]) for r in metric_rows(root / "mp" / name)] == [
      ("2", "train"), ("4", "train"), ("4", "test")]
  assert json.load(open(root / "mp" / name / "summary.json"))["processes"] == NPROC


def test_killed_process_stops_its_peer_fast(tmp_path, cache):
  """Process 1 dies by SIGKILL after the checkpoint of step 2: its peer fails fast, step 2 is kept.

  That the launcher then restarts the processes, which resume from the newest checkpoint every
  process has and end bit-identical to the run left alone (error-feedback residuals included):
  ``tests/test_chaos.py``.
  """
  options = ["--steps=4", "--checkpoint_every=2", "--heartbeat=5"]
  procs = launch(tmp_path, ["onebit"], *options, "--die_after_checkpoint=2", cache=cache)
  logs, exit_times = wait(procs, timeout=300, check=False)
  assert procs[1].returncode == -signal.SIGKILL, logs[1][-3000:]
  # The survivor stops (its collective fails, then the 5 s heartbeat ends it) instead of
  # waiting out JAX's default 100 s heartbeat; the margin is for a loaded machine.
  assert procs[0].returncode != 0, logs[0][-3000:]
  assert exit_times[0] - exit_times[1] < 60
  assert final_checkpoint(tmp_path / "onebit")[0] == 2


def launch_with_launcher(out_dir, names, *options, cache):
  """Runs ``experiments.launch --processes NPROC`` of the worker; returns (exit code, output)."""
  cmd = [sys.executable, "-m", "experiments.launch", "--processes", str(NPROC), "--grace", "120", "--",
         os.path.join(HERE, "multiprocess", "train_worker.py"), str(out_dir), ",".join(names), *options]
  proc = subprocess.run(cmd, cwd=ROOT, env=dict(worker_env(cache), PYTHONPATH=ROOT),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
  return proc.returncode, proc.stdout


def test_sigterm_to_the_launcher_saves_and_resumes_bit_identical(runs, tmp_path, cache):
  """The launcher gets SIGTERM after step 1; both processes save the same step, exit 75; rerun."""
  root, _, _ = runs
  options = ["--steps=4", "--checkpoint_every=4"]
  code, out = launch_with_launcher(tmp_path, ["onebit"], *options, "--sigterm_parent_at=1",
                                   cache=cache)
  assert code == 75, out[-4000:]
  stops = {line.split("]")[0]: line for line in out.splitlines() if "preempted after step" in line}
  assert set(stops) == {"[rank0", "[rank1"}, out[-4000:]
  saved = final_checkpoint(tmp_path / "onebit")[0]
  assert 1 <= saved < 4  # after the signal, before the end: the step both processes agreed on
  assert all(f"preempted after step {saved} (saved " in line for line in stops.values()), stops
  assert "rank(s) 0, 1 were preempted" in out and "exiting with code 75" in out
  assert [r["step"] for r in metric_rows(tmp_path / "onebit")] == (["2"] if saved >= 2 else [])

  code, out = launch_with_launcher(tmp_path, ["onebit"], *options, cache=cache)
  assert code == 0, out[-4000:]
  assert summaries("\n".join(line.split(": ", 1)[-1] for line in out.splitlines()
                             if line.startswith("[rank0]: ")))["onebit"]["resumed_from_step"] == saved
  step_a, state_a = final_checkpoint(root / "mp" / "onebit")
  step_b, state_b = final_checkpoint(tmp_path / "onebit")
  assert step_a == step_b == 4
  assert_states_close(state_a, state_b, atol=0)
  assert metric_rows(tmp_path / "onebit") == metric_rows(root / "mp" / "onebit")


def _rank1_data(step_dir):
  """The largest data file of process 1's part (its shards of the residuals)."""
  files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir / "default" / "ocdbt.process_1") for f in fs]
  return max(files, key=os.path.getsize)


def _lose_rank1_part(step_dir):
  for path in ("default/ocdbt.process_1", "default/array_metadatas/process_1"):
    path = step_dir / path
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def _cut_rank1_file(step_dir):
  path = _rank1_data(step_dir)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _flip_rank1_byte(step_dir):
  path = _rank1_data(step_dir)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


# How process 1 can hold less of step 4 than process 0, and what process 1 then says.
DISAGREEMENTS = {
    "missing": (_lose_rank1_part, " is missing"),
    "partial": (_cut_rank1_file, " bytes, "),
    "corrupted": (_flip_rank1_byte, "its SHA-256 differs"),
}


def test_processes_that_disagree_restore_the_same_step(runs, tmp_path, cache):
  """Process 1's part of step 4 lost, cut short or corrupted (orbax would read the last silently):
  both processes restore step 2, the newest both have completely, and say so; step 4 is moved aside."""
  checkpointed = runs[0] / "mp" / "onebit"  # sealed checkpoints of steps 2 and 4 (copied, not changed)
  assert sorted(os.listdir(checkpointed / "checkpoints")) == ["2", "4"]
  for case, (damage, _) in DISAGREEMENTS.items():
    shutil.copytree(checkpointed, tmp_path / f"onebit@{case}")
    damage(tmp_path / f"onebit@{case}" / "checkpoints" / "4")
  names = [f"onebit@{case}" for case in DISAGREEMENTS]
  logs, _ = wait(launch(tmp_path, names, "--steps=4", "--checkpoint_every=2", "--stop_after_steps=0",
                        cache=cache))
  said = ("restoring the checkpoint of step 2: the newest that every process (2) has completely and "
          "reads (moved aside: step(s) 4)")
  for log in logs:
    assert all(s == {"steps": 2, "stopped_early": True} for s in summaries(log).values()), log[-3000:]
    assert len(summaries(log)) == len(DISAGREEMENTS) and log.count(said) == len(DISAGREEMENTS), log[-3000:]
  for case, (_, cause) in DISAGREEMENTS.items():
    reports = [[line for line in log.splitlines() if f"onebit@{case}" in line and "cannot be read" in line]
               for log in logs]
    assert len(reports[1]) == 1 and f"process 1: " in reports[1][0] and cause in reports[1][0], reports[1]
    assert len(reports[0]) == 1 and "process 1: failed (see its log)" in reports[0][0], reports[0]
    workdir = tmp_path / f"onebit@{case}"
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]
    assert sorted(os.listdir(workdir / "checkpoints.damaged")) == ["4"]
