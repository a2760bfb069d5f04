"""The training entry point, end to end at tiny scale on real offline data (MNIST-5k)."""

import csv
import glob
import json
import os

import jax
import numpy as np
import pytest

from configs import terngrad_lenet
from experiments import distributed
from experiments import state
from experiments import step
from experiments import train
from experiments import validation
from experiments import writers


def _config(**overrides):
  c = terngrad_lenet.get_config("runlocal,dataset=mnist5k")
  c.num_train_steps = 12
  c.log_every = 4
  c.eval_every = 6
  c.progress = False
  c.eval_batch_size = 500
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def test_train_and_evaluate_terngrad(tmp_path):
  s = train.train_and_evaluate(_config(workers=4), str(tmp_path))
  assert s["steps"] == 12 and s["workers"] == 4 and s["test_examples"] == 1000
  assert 0.0 <= s["test_accuracy"] <= 1.0
  # TernGrad on LeNet: 2-bit codes, within the foundation's 1/15 of float32.
  assert s["compressed_ratio"] >= 15.0
  rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
  assert [r["split"] for r in rows].count("train") == 3
  assert [r["split"] for r in rows].count("test") == 2
  assert set(writers.CSV_DOC) <= set(rows[0])
  assert json.load(open(tmp_path / "summary.json"))["test_accuracy"] == s["test_accuracy"]


def _event_scalars(workdir) -> dict[tuple[str, int], float]:
  """``(tag, step) -> value`` of every scalar in the TensorBoard events files of ``workdir``."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  out = {}
  for path in glob.glob(os.path.join(workdir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        out[(v.tag, event.step)] = float(tf.make_ndarray(v.tensor))
  return out


def test_tensorboard_events_hold_the_csv_rows_and_a_trace_is_taken(tmp_path):
  train.train_and_evaluate(_config(workers=2, num_train_steps=6, log_every=2, eval_every=3,
                                   trace_step=3), str(tmp_path))
  events = _event_scalars(tmp_path)
  rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
  assert [(r["split"], r["step"]) for r in rows] == [("train", "2"), ("test", "3"), ("train", "4"),
                                                    ("train", "6"), ("test", "6")]
  for r in rows:
    columns = ("loss", "accuracy") + (("bytes_on_wire", "learning_rate") if r["split"] == "train" else ())
    for column in columns:
      tagged = events[(f"{r['split']}/{column}", int(r["step"]))]
      np.testing.assert_allclose(tagged, float(r[column]), rtol=1e-5, err_msg=f"{r['split']}/{column}")
  assert len({v for (tag, _), v in events.items() if tag == "train/loss"}) == 3  # three different losses
  assert events[("uptime", 6)] > 0 and events[("steps_per_sec", 6)] > 0  # the progress report after the last step
  assert glob.glob(os.path.join(tmp_path, "plugins", "profile", "*", "*.xplane.pb"))  # the trace of step 3


def test_norms_of_every_step_are_logged(tmp_path):
  """config.log_norms: float with plain SGD at a constant LR moves the parameters by LR·‖mean
  gradient‖, which is at most the workers' mean ‖gradient‖; 1-bit SGD's residual shows."""
  lr = 0.05
  for name in ("none", "onebit"):
    train.train_and_evaluate(_config(workers=4, num_train_steps=3, log_every=1, eval_every=3, compressor=name,
                                     compressor_kwargs={}, optimizer="sgd", learning_rate=lr,
                                     lr_schedule="constant", log_norms=True), str(tmp_path / name))
    rows = [r for r in csv.DictReader(open(tmp_path / name / "metrics.csv")) if r["split"] == "train"]
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    norms = {k: np.array([float(r[k]) for r in rows]) for k in step.NORMS}
    assert np.all(norms["mean_grad_norm"] < norms["grad_norm"])  # 4 workers' different batches
    if name == "none":
      np.testing.assert_allclose(norms["update_norm"], lr * norms["mean_grad_norm"], rtol=1e-4)
      assert np.all(norms["residual_norm"] == 0)
    else:
      assert np.all(norms["residual_norm"] > 0) and np.all(norms["update_norm"] > 0)


def test_devices_and_vmap_layouts_give_the_same_run(tmp_path):
  """8 workers as 8 devices x 1 and as 1 device x 8 (vmap): identical training."""
  assert jax.local_device_count() == 8
  a = train.train_and_evaluate(_config(workers=8, max_devices=1), str(tmp_path / "a"))
  b = train.train_and_evaluate(_config(workers=8), str(tmp_path / "b"))
  assert a["devices"] == 1 and b["devices"] == 8
  assert a["test_accuracy"] == b["test_accuracy"]
  np.testing.assert_allclose(a["final_train_loss"], b["final_train_loss"], rtol=1e-5)


def test_hosts_average_inside_and_compress_between(tmp_path):
  """config.hosts=2: the 8 devices as 2 hosts of 4 (one worker a device); TernGrad between the hosts
  only, so each device sends a quarter of a worker's payload; float inside a host."""
  flat = train.train_and_evaluate(_config(workers=8, num_train_steps=4, log_every=4, eval_every=4),
                                  str(tmp_path / "flat"))
  hosts = train.train_and_evaluate(_config(workers=8, hosts=2, num_train_steps=4, log_every=4, eval_every=4),
                                   str(tmp_path / "hosts"))
  assert hosts["devices"] == flat["devices"] == 8 and hosts["hosts"] == 2
  assert 3.8 < flat["bytes_on_wire"] / hosts["bytes_on_wire"] <= 4.0
  assert np.isfinite(hosts["final_train_loss"]) and hosts["test_accuracy"] > 0.2
  with pytest.raises(ValueError, match="config.hosts=3 must divide the 8 devices"):
    train.train_and_evaluate(_config(workers=8, hosts=3), str(tmp_path / "bad"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(batch_size=60, workers=8), "multiple of workers"),
        (dict(compressor="nope"), "unknown compressor"),
        (dict(model="vgg"), "unknown model"),
        (dict(dataset="svhn"), "unknown dataset"),
        (dict(optimizer="lion"), "unknown optimizer"),
        (dict(eval_with_ema=True, ema_decay=0.0), "eval_with_ema"),
        (dict(trace_step=1), "trace_step"),  # no step before the first to start a trace after
        (dict(trace_step=13), "trace_step"),  # after the last step (12)
    ],
)
def test_bad_configs_fail_before_compiling(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    validation.validate_config(_config(**overrides))


def test_config_arguments():
  assert terngrad_lenet.get_config("optimizer=sgd").learning_rate == 0.1
  with pytest.raises(ValueError, match="Unknown config argument"):
    terngrad_lenet.get_config("bogus=1")


_DIST_ENV = ("JAX_COORDINATOR_ADDRESS", "JAXCOMP_NUM_PROCESSES", "JAXCOMP_PROCESS_ID", "JAXCOMP_HEARTBEAT_TIMEOUT",
             "SLURM_JOB_ID",
             "SLURM_STEP_NODELIST", "SLURM_NTASKS", "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
  for name in _DIST_ENV:
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def test_single_process_unless_told(clean_env):
  c = _config()
  assert distributed.distributed_settings(c) is None
  clean_env.setenv("SLURM_JOB_ID", "7")
  clean_env.setenv("SLURM_STEP_NODELIST", "node1")
  clean_env.setenv("SLURM_NTASKS", "1")
  assert distributed.distributed_settings(c) is None  # a one-task job stays single-process
  assert not distributed.initialize_distributed(c)


def test_distributed_settings_from_env_and_config(clean_env):
  c = _config()
  clean_env.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  clean_env.setenv("JAXCOMP_NUM_PROCESSES", "4")
  clean_env.setenv("JAXCOMP_PROCESS_ID", "3")
  s = distributed.distributed_settings(c)
  assert (s["coordinator_address"], s["num_processes"], s["process_id"]) == ("10.0.0.1:1234", 4, 3)
  assert s["heartbeat_timeout_seconds"] == 100  # JAX's default
  clean_env.setenv("JAXCOMP_HEARTBEAT_TIMEOUT", "7")  # the launcher's --heartbeat-timeout
  assert distributed.distributed_settings(c)["heartbeat_timeout_seconds"] == 7
  c.distributed.process_id = 1  # the config overrides the environment
  c.distributed.heartbeat_timeout_seconds = 10
  s = distributed.distributed_settings(c)
  assert (s["process_id"], s["heartbeat_timeout_seconds"]) == (1, 10)
  c.distributed.num_processes = 1
  assert distributed.distributed_settings(c) is None


def test_distributed_settings_leave_clusters_to_jax(clean_env):
  clean_env.setenv("OMPI_MCA_orte_hnp_uri", "123.0;tcp://10.0.0.1:5000")
  clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
  s = distributed.distributed_settings(_config())
  assert s["num_processes"] is None and s["coordinator_address"] is None  # JAX detects them


@pytest.mark.parametrize("env, message", [
    ({"JAX_COORDINATOR_ADDRESS": "h:1"}, "number of processes"),
    ({"JAXCOMP_NUM_PROCESSES": "2", "JAXCOMP_PROCESS_ID": "2"}, "process_id"),
    ({"JAXCOMP_NUM_PROCESSES": "two"}, "not an integer"),
])
def test_bad_distributed_settings_fail_clearly(clean_env, env, message):
  for k, v in env.items():
    clean_env.setenv(k, v)
  with pytest.raises(ValueError, match=message):
    distributed.distributed_settings(_config())


def test_mesh_lays_workers_over_devices():
  """The largest divisor of the workers the (8) devices allow, at most max_devices."""
  assert [state.make_mesh(n).size for n in (8, 10, 7, 16, 1)] == [8, 5, 7, 8, 1]
  assert state.make_mesh(8, max_devices=3).size == 2
  assert list(state.make_mesh(4).devices) == jax.devices()[:4]
