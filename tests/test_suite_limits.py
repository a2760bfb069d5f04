"""The suite fails fast and never hangs: time limits and dead workers end the run, naming the test.

Each test runs pytest in a subprocess, with ``make test``'s options and this
repository's configuration (pyproject.toml and tests/conftest.py), on a small
generated test file: a test that sleeps far past its limit, or one whose
worker process aborts. Each asserts that the run fails well before the sleep
would end, names the test and shows a stack.
"""

import os
import re
import shlex
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLEEP = 1000  # seconds, what a hung test would take

GENERATED = {
    "test_stuck.py": f"""
import os
import time


def test_fine():
  pass


def test_hangs():
  time.sleep({SLEEP})


def test_aborts():
  os.abort()
""",
    "test_other.py": """
def test_other():
  pass
""",
    # This repository's hooks, for tests outside its tests/ directory.
    "conftest.py": f"""
import importlib.util

_spec = importlib.util.spec_from_file_location("suite_conftest", {os.path.join(ROOT, "tests", "conftest.py")!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
globals().update({{name: getattr(_module, name) for name in dir(_module) if name.startswith("pytest_")}})
""",
}


def make_test_options():
  """The pytest options of the Makefile's ``test`` target (what CI runs), less ``--durations``."""
  makefile = open(os.path.join(ROOT, "Makefile")).read()
  recipe = re.search(r"^test:.*\n\t\$\(PY\) -m pytest (.*) tests$", makefile, re.MULTILINE)
  assert recipe, "the Makefile's test target runs `$(PY) -m pytest OPTIONS tests`"
  return [o for o in shlex.split(recipe.group(1)) if not o.startswith("--durations")]


def run(tmp_path, *args, deadline=None, limit=120):
  """Runs pytest on the generated files with this repository's configuration; returns (output, status, seconds).

  ``deadline`` (seconds): run it under .ci/deadline.py with that limit.
  """
  for name, text in GENERATED.items():
    (tmp_path / name).write_text(text)
  cmd = [sys.executable, "-m", "pytest", "-c", os.path.join(ROOT, "pyproject.toml"), "--rootdir",
         str(tmp_path), "-p", "no:cacheprovider", *make_test_options(), *args]
  if deadline is not None:
    cmd = [sys.executable, os.path.join(ROOT, ".ci", "deadline.py"), "--grace", "2", str(deadline), *cmd]
  start = time.monotonic()
  # A wide terminal, as CI's: pytest's summary lines are then not cut short.
  env = dict(os.environ, COLUMNS="250")
  proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=limit)
  return proc.stdout + proc.stderr, proc.returncode, time.monotonic() - start


def assert_stack_of(test, output):
  """The output has a Python stack with a frame of function ``test`` of test_stuck.py."""
  assert re.search(rf'File "[^"]*test_stuck\.py", line \d+ in {test}\b', output), output[-4000:]


def assert_crashed_once(test, output):
  """The run reports ``test``'s worker crash once: the test was not run again on another worker."""
  reports = re.findall(rf"^worker 'gw\d+' crashed while running 'test_stuck\.py::{test}'$", output, re.MULTILINE)
  assert len(reports) == 1, output[-4000:]


def test_a_hung_test_fails_the_run_at_its_time_limit(tmp_path):
  """A test past its limit: its name and stack are printed and the run fails, without rerunning it."""
  output, status, seconds = run(tmp_path, "-o", "timeout=3", "-k", "not aborts",
                                str(tmp_path / "test_stuck.py"), str(tmp_path / "test_other.py"))
  assert status != 0, output[-4000:]
  assert seconds < 60, (seconds, output[-4000:])  # the test alone would take SLEEP
  assert "test_stuck.py::test_hangs ran longer than its 3 s limit" in output, output[-4000:]
  assert_stack_of("test_hangs", output)
  assert_crashed_once("test_hangs", output)


def test_an_aborted_worker_fails_the_run(tmp_path):
  """A worker killed by SIGABRT: the run fails at once, naming the test, with its stack."""
  output, status, seconds = run(tmp_path, "-k", "not hangs", str(tmp_path / "test_stuck.py"),
                                str(tmp_path / "test_other.py"))
  assert status != 0, output[-4000:]
  assert seconds < 60, (seconds, output[-4000:])
  assert "Fatal Python error: Aborted" in output, output[-4000:]
  assert_stack_of("test_aborts", output)
  assert_crashed_once("test_aborts", output)


@pytest.mark.slow
def test_the_suite_limit_shows_the_running_tests_and_ends_the_run(tmp_path):
  """With no per-test limit, .ci/deadline.py's limit names the running test, shows stacks, ends all."""
  output, status, seconds = run(tmp_path, "-o", "timeout=0", "-k", "hangs",
                                str(tmp_path / "test_stuck.py"), deadline=20)  # starting takes ~5 s
  assert status == 124, output[-4000:]
  assert seconds < 60, (seconds, output[-4000:])
  assert re.search(r"test_stuck\.py::test_hangs \(running for \d+ s\)", output), output[-4000:]
  assert_stack_of("test_hangs", output)
  assert "SIGTERM to the session's processes" in output, output[-4000:]


@pytest.mark.parametrize("status", [0, 3])
def test_the_suite_limit_keeps_the_status_of_a_command_within_it(status):
  """Under its limit .ci/deadline.py changes nothing: the command's exit status is its own."""
  proc = subprocess.run([sys.executable, os.path.join(ROOT, ".ci", "deadline.py"), "60", sys.executable,
                         "-c", f"raise SystemExit({status})"], capture_output=True, text=True, timeout=60)
  assert proc.returncode == status, proc.stdout + proc.stderr
  assert "deadline.py" not in proc.stdout + proc.stderr
