"""benchmarks/accelerator.py at its tiny scale on the host CPU, and its report of failed tests.

The command is written for a GPU machine that is at hand only at times; this
runs every part of it here, so that it works whenever one is.
"""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import accelerator

REPO = accelerator.REPO


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """``python -m benchmarks.accelerator --tiny`` over 2 host devices: its exit status, JSON and table."""
  out = tmp_path_factory.mktemp("accelerator")
  flags = os.environ.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")
  env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "benchmarks.accelerator", "--tiny", "--out", str(out)], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / "accelerator.json") as f:
    doc = json.load(f)
  return doc, (out / "accelerator.md").read_text()


@pytest.mark.slow
def test_tiny_run_collects_the_marked_tests_without_the_absent_packages(tiny_run):
  doc, _ = tiny_run
  tests = doc["tests"]
  assert tests["files"] == accelerator.marked_test_files()
  assert {"tests/test_codecs_twobit.py", "tests/test_quantizers.py", "tests/test_transforms.py"} <= set(tests["files"])
  assert "tests/test_data_tfds.py" not in tests["files"]
  # Collected with tensorflow, ml_collections, ... absent: every marked file imports without them.
  assert tests["returncode"] == 0 and tests["collected"] > 200, tests["summary"]
  assert doc["absent_imported"] == []
  assert doc["environment"]["backend"] == "cpu" and doc["environment"]["devices"] == 2


def test_tiny_run_measures_every_part_side_by_side(tiny_run):
  doc, table = tiny_run
  (comp,) = doc["compressors"]
  assert comp["compressor"] == "terngrad" and comp["vs_copy"] > 0 and comp["copy_gb_per_s"] > 0
  steps = {(r["model"], r["method"]): r for r in doc["steps"]}
  assert set(steps) == {(m, k) for m in ("lenet", "gpt") for k in ("float", "terngrad")}
  for (model, method), r in steps.items():
    assert r["step_s"] > 0 and len(r["times_s"]) == accelerator.TINY.repeats
    assert r["compiles"] == 1, (model, method)  # its state laid out as the step returns it
    assert (r["ratio_to_float"] == 1.0) == (method == "float"), (model, method)
  update = {r["method"]: r for r in doc["exchange"]}
  assert update["none"]["devices"] == 2 and update["none"]["tensors"] == 8  # LeNet's
  assert update["terngrad"]["bytes_on_wire"] * 10 < update["none"]["bytes_on_wire"]
  for heading in ("### Tests", "### Compressors", "### Training steps", "### Whole update"):
    assert heading in table
  assert f"| JAX / jaxlib | {doc['environment']['jax']} /" in table
  assert "`python -m benchmarks.accelerator --tiny --out " in table and "`python -m pytest -m accelerator " in table


def test_failed_tests_are_reported_by_name(tmp_path):
  mark = f"pytest.mark.{accelerator.MARKER}"
  (tmp_path / "test_fake.py").write_text(
      "import pytest\n\n"
      f"@{mark}\ndef test_passes():\n  assert 1 + 1 == 2\n\n"
      f"@{mark}\ndef test_fails():\n  assert 1 + 1 == 3, 'arithmetic'\n\n"
      f"@{mark}\ndef test_imports_tensorflow():\n  import tensorflow  # noqa: F401\n\n"
      "def test_unmarked_is_not_run():\n  assert False\n")
  result = accelerator.run_tests([str(tmp_path / "test_fake.py")], str(tmp_path), collect_only=False, workers=1,
                                 timeout_s=120)
  assert result["returncode"] == 1 and not result["timed_out"]
  assert result["counts"] == {"tests": 3, "failures": 2, "errors": 0, "skipped": 0, "passed": 1}
  failed = {f["test"].rsplit("::", 1)[1]: f["message"] for f in result["failed"]}
  assert set(failed) == {"test_fails", "test_imports_tensorflow"}
  assert "arithmetic" in failed["test_fails"] and "tensorflow" in failed["test_imports_tensorflow"]
  assert result["summary"].startswith("2 failed, 1 passed, 1 deselected")
  assert "test_fails" in accelerator.markdown({"command": "c", "scale": "s", "data": "d", "tests": result})


def test_a_run_past_its_time_is_stopped_and_reports_what_ran(tmp_path):
  mark = f"pytest.mark.{accelerator.MARKER}"
  (tmp_path / "test_slow.py").write_text(
      "import time\nimport pytest\n\n"
      f"@{mark}\ndef test_quick():\n  pass\n\n"
      f"@{mark}\ndef test_hangs():\n  time.sleep(600)\n")
  result = accelerator.run_tests([str(tmp_path / "test_slow.py")], str(tmp_path), collect_only=False, workers=1,
                                 timeout_s=6)
  assert result["timed_out"] and result["returncode"] is None and result["seconds"] < 60
  assert result["counts"]["passed"] == 1  # pytest, interrupted, still wrote its JUnit XML
  assert "timed out" in accelerator.markdown({"command": "c", "scale": "s", "data": "d", "tests": result})


def test_importing_the_command_keeps_this_processs_packages():
  """Only the command's own process and its pytest run lose the packages; the suite that imports it keeps them."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from benchmarks import _absent  # pylint: disable=g-import-not-at-top
  assert accelerator._absent is _absent
  for name in ("ml_collections", "tensorflow"):
    assert sys.modules.get(name, "not imported") is not None, name
    assert importlib.util.find_spec(name) is not None, name
