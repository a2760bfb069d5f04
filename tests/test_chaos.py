"""Chaos: two processes training 3LC (error-feedback residuals on every worker), SIGKILLed at random.

``benchmarks.chaos`` runs ``experiments.launch --max-restarts`` of
``experiments.train`` and SIGKILLs a random rank at random moments (a fixed
seed here); the run restarts, resumes from the newest checkpoint every process
has completely, and ends with the final checkpoint (parameters, optimizer
state with every worker's residuals, EMA) and every row of ``metrics.csv``
bit-identical to the same run left alone, no step lost or counted twice. Each of
the launcher's restart lines says why and from which step, in which directory.
The long version and one run's figures: docs/multiprocess.md.
"""

import json
import os
import re

import pytest

from benchmarks import chaos

from _processes import compilation_cache_env, worker_xla_flags

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, EVERY = 12, 3


def test_random_sigkills_end_bit_identical(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=worker_xla_flags(4), PYTHONPATH=chaos.ROOT,
             **compilation_cache_env(tmp_path / "xla_cache"))
  figures = {}
  for name, kills in (("reference", 0), ("chaos", 2)):
    workdir = str(tmp_path / name)
    figures[name] = chaos.run(workdir, chaos.train_args(workdir, "threelc", STEPS, EVERY), processes=2,
                              kills=kills, seed=3, window=(8.0, 25.0), env=env, timeout=600)
    assert figures[name]["exit_code"] == 0, figures[name]["output"][-4000:]
  got = figures["chaos"]
  assert got["faults"] >= 1 and got["restarts"] >= got["faults"], got["output"][-4000:]
  assert all(f["resumed_from"] is not None for f in got["kills"]), got["kills"]
  assert_restart_lines(got["output"], str(tmp_path / "chaos" / "checkpoints"), faults=got["faults"])
  assert chaos.identical(str(tmp_path / "reference"), str(tmp_path / "chaos")) == []
  rows = [int(r["step"]) for r in chaos.metric_rows(str(tmp_path / "chaos")) if r["split"] == "train"]
  assert rows == list(range(1, STEPS + 1))  # every step once: none lost, none counted twice
  print(json.dumps({name: {k: v for k, v in f.items() if k != "output"} for name, f in figures.items()}))


def assert_restart_lines(output, checkpoints, faults):
  """One line a restart: the failure (a SIGKILL at least once), then the step every process resumes from."""
  lines = [line for line in output.splitlines() if line.startswith("[launch]") and "; restart " in line]
  assert len(lines) >= faults, output[-4000:]
  assert any(re.match(r"\[launch\] rank [01] was killed by signal SIGKILL \(9\)", line) for line in lines), lines
  where = (r"(resuming from step \d+ \(the newest checkpoint in {0} that every process has completely\)"
           r"|starting from step 0 \(no checkpoint in {0} that every process has completely\))").format(
               re.escape(checkpoints))
  for i, line in enumerate(lines, 1):
    assert re.search(f"; restart {i} of \\d+: {where}$", line), line
