"""``python -m experiments.train``'s command line: it lists the configs and their fields, and rejects typos in one line."""

import importlib.util
import logging
import os
import pathlib
import re
import subprocess
import sys

import ml_collections
import pytest

from experiments import cli
from jaxcomp.data import registry
from jaxcomp.data.offline import DatasetNotAvailableError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _train(*args):
  return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)


def test_help_lists_every_config():
  out = _train("--help")
  assert out.returncode == 0, out.stderr
  assert "usage: python -m experiments.train --config" in out.stdout
  assert "list [CONFIG" in out.stdout
  for name in ("configs/terngrad_lenet.py", "configs/gpt_text.py", "configs/zoo.py"):
    assert name in out.stdout
  assert "configs/common.py" not in out.stdout  # no get_config: not a config


def test_the_entry_point_and_its_tensorboard_writer_import_no_tensorflow(tmp_path):
  """Only tf.data pipelines need TensorFlow (seconds of every run's start): not the entry point, nor its events."""
  code = ("import sys; from experiments import train, writers; w = writers.ScalarWriter(sys.argv[1]); "
          "w.write_scalars(1, {'train/loss': 0.5}); w.close(); print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_list_shows_a_configs_fields_with_their_values():
  text = cli.preflight(["train", "list", "configs/terngrad_lenet.py:runlocal"])
  lines = {l.split("=")[0].strip(): l for l in text.splitlines()[1:]}
  assert "= 64" in lines["batch_size"] and "TOTAL batch" in lines["batch_size"]  # the value and its comment
  assert "compressor_kwargs.clip_sigma" in lines  # nested fields by their dotted names
  assert "'terngrad'" in lines["compressor"]


def test_a_misspelt_field_is_one_line_with_the_closest_exit_code_2():
  out = _train("--config", "configs/terngrad_lenet.py:runlocal", "--workdir", "/nonexistent",
               "--config.num_trian_steps=20")
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "error: --config.num_trian_steps: configs/terngrad_lenet.py has no field 'num_trian_steps'; the "
      "closest is 'num_train_steps' (python -m experiments.train list configs/terngrad_lenet.py:runlocal)"]
  assert "Traceback" not in out.stdout + out.stderr


def test_a_misspelt_compressor_is_one_line_with_the_closest_exit_code_2():
  out = _train("--config", "configs/terngrad_lenet.py:runlocal", "--workdir", "/nonexistent",
               "--config.compressor=terngard")
  assert out.returncode == 2
  [line] = out.stderr.strip().splitlines()
  assert line.startswith("error: --config.compressor=terngard: unknown compressor 'terngard'; "
                         "the closest is 'terngrad'; known: adaptive, "), line
  assert "Traceback" not in out.stdout + out.stderr


def test_a_dataset_not_here_is_one_line_with_the_flags_that_fix_it_and_leaves_no_run(tmp_path):
  empty, workdir = tmp_path / "tfds", tmp_path / "run"
  empty.mkdir()
  out = _train("--config", "configs/terngrad_lenet.py:runlocal", "--workdir", str(workdir),
               "--config.dataset=cifar10", f"--config.data_dir={empty}")
  assert out.returncode == 2, out.stderr
  assert [line for line in out.stderr.splitlines() if line.startswith("error:")] == [out.stderr.splitlines()[-1]] == [
      f"error: --config.dataset=cifar10 is not on this machine: tfds 'cifar10' is not prepared in {empty}; "
      "pass --config.data_dir=DIR of a copy prepared with `tfds build cifar10 --data_dir DIR` or "
      f"--config.dataset= one that is here: {', '.join(registry.offline_here('image'))}"]
  assert "Traceback" not in out.stdout + out.stderr
  assert not workdir.exists()  # no config.json of a run that never started


def test_an_offline_dataset_not_here_says_why_and_names_those_that_are():
  config = ml_collections.ConfigDict({"dataset": "fashion_mnist_debian"})
  line = cli.missing_dataset(config, DatasetNotAvailableError("Fashion-MNIST IDX files not found in /x."))
  assert line == ("--config.dataset=fashion_mnist_debian is not on this machine: Fashion-MNIST IDX files not "
                  "found in /x.; pass --config.dataset= one that is here: mnist5k, digits")


BAR = "lenet/none/N=2:"  # the progress bar's description
LOG_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\] ")  # absl's header of a log line


def _py_files(*packages):
  """The file names of every module of ``packages``."""
  names = set()
  for package in packages:
    for location in importlib.util.find_spec(package).submodule_search_locations:
      names |= {f for _, _, files in os.walk(location) for f in files if f.endswith(".py")}
  return names


def test_log_lines_never_land_in_the_progress_bar_and_orbax_says_nothing(tmp_path):
  """A run that saves a checkpoint every step: every log line starts a line of its own, none is orbax's INFO."""
  workdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "-m", "experiments.train", "--config", "configs/terngrad_lenet.py:runlocal",
                        "--workdir", str(workdir), "--config.dataset=mnist5k", "--config.workers=2",
                        "--config.batch_size=8", "--config.compressor=none", "--config.num_train_steps=2", "--config.checkpoint_every=1", "--config.log_every=1",
                        "--config.eval_every=0", "--config.progress=True"], cwd=ROOT, capture_output=True, timeout=300)
  stderr = out.stderr.decode()  # bytes: the bar's carriage returns kept
  assert out.returncode == 0, stderr
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2"]
  segments = re.split(r"[\r\n]", stderr)  # what a terminal starts at the left margin
  assert any(s.startswith(BAR) for s in segments)
  assert not [s for s in segments if BAR in s and LOG_LINE.search(s)]  # a log line inside the bar's line
  orbax_only = _py_files("orbax") - _py_files("clu", "jax", "flax", "absl", "experiments", "jaxcomp")
  info = {m[1] for s in segments for m in [LOG_LINE.match(s)] if m and s.startswith("I")}
  assert info and not info & orbax_only, info & orbax_only


def test_the_run_drops_orbax_info_records_alone():
  """Under the run's logging, orbax's INFO records are dropped; its warnings and every other record pass."""
  from experiments import writers  # pylint: disable=g-import-not-at-top  (tensorboard's protocol buffers)

  seen = []
  handler, quiet = logging.Handler(), logging.Handler(logging.ERROR)  # quiet's level holds: it gets nothing
  handler.emit = quiet.emit = seen.append
  root = logging.getLogger()
  root.addHandler(handler)
  root.addHandler(quiet)
  orbax = os.path.join(importlib.util.find_spec("orbax").submodule_search_locations[0], "checkpoint", "x.py")

  def record(level, path):
    return logging.LogRecord("absl", level, path, 1, "m", None, None)

  try:
    with writers.logs_above_the_bar():
      assert handler not in root.handlers  # stood in for
      for r in (record(logging.INFO, orbax), record(logging.WARNING, orbax), record(logging.INFO, __file__)):
        root.handle(r)
    assert handler in root.handlers and quiet in root.handlers  # back after the run
  finally:
    root.removeHandler(handler)
    root.removeHandler(quiet)
  assert [(r.levelno, r.pathname) for r in seen] == [(logging.WARNING, orbax), (logging.INFO, __file__)]


TYPO = "terngrad_lent.py"  # a config file that does not exist


@pytest.mark.parametrize("argv, message", [
    (["--config", f"configs/{TYPO}"], f"no file 'configs/{TYPO}'; the closest is 'configs/terngrad_lenet.py'"),
    (["--config=configs/terngrad_lenet.py:runlocl"], "Unknown config argument(s) ['runlocl']"),
    (["--config", "configs/terngrad_lenet.py", "--config.compressor_kwargs.clip_sigmma=2"],
     "no field 'compressor_kwargs.clip_sigmma'; the closest is 'compressor_kwargs.clip_sigma'"),
    (["--config", "configs/terngrad_lenet.py", "--config.compressor", "qsdg"],  # the value as the next argument
     "--config.compressor=qsdg: unknown compressor 'qsdg'; the closest is 'qsgd'"),
    (["--config", "configs/terngrad_lenet.py", "--config.dataset=fashion_mnist_debain"],
     "unknown dataset 'fashion_mnist_debain'; the closest is 'fashion_mnist_debian'"),
    (["--config", "configs/terngrad_lenet.py", "--config.model=lenett"], "unknown model 'lenett'; the closest is 'lenet'"),
    (["--config", "configs/terngrad_lenet.py", "--config.optimizer=adamm"], "the closest is 'adam'"),
])
def test_other_unknown_names_are_usage_errors(argv, message):
  with pytest.raises(cli.UsageError) as e:
    cli.preflight(["train", *argv])
  assert message in str(e.value)


def test_known_fields_pass():
  argv = ["train", "--config", "configs/terngrad_lenet.py:runlocal", "--workdir", "/tmp/w",
          "--config.num_train_steps=3", "--config.compressor_kwargs.clip_sigma=2.0", "--config.model_kwargs={}",
          "--config.compressor=qsgd", "--config.dataset", "digits"]
  assert cli.preflight(argv) is None
