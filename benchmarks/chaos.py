r"""Chaos: a multi-process training run SIGKILLed at random moments ends bit-identical to one left alone.

The driver starts ``experiments.launch --max-restarts K`` of ``experiments.train``
and, ``--kills`` times, SIGKILLs a random rank at a random moment: mostly while
it trains (within 2 s of a step's row in ``metrics.csv``: during a step or a
checkpoint write), else at any time in ``--window`` seconds after the run
(re)started (while it starts, compiles or restores). The launcher restarts every process and the
run resumes from the newest checkpoint every process has completely. The same
run without kills is the reference. Printed (JSON): the faults injected, the
restarts, the steps recomputed (per fault: the last step in ``metrics.csv``
when it struck, minus the step the restart resumed from), the time lost
(wall clock against the reference) and whether the final checkpoint (parameters,
optimizer state with every worker's residuals, EMA) and every row of
``metrics.csv`` (timing columns aside) are bit-identical to the reference's.

Usage::

  .venv/bin/python -m benchmarks.chaos --compressor threelc --steps 300 --checkpoint_every 25 \
      --kills 6 --seed 0 --root /tmp/chaos
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("wall_time", "steps_per_sec", "train_time")
_RESUME_RE = re.compile(r"restart \d+ of \d+: (?:resuming from step (\d+)|starting from step 0)")


def train_args(workdir: str, compressor: str, steps: int, checkpoint_every: int) -> list[str]:
  """``experiments.train`` of the zoo's LeNet (5,000 MNIST digits, 8 workers), a metrics.csv row a step."""
  return ["-m", "experiments.train", "--config", "configs/zoo.py:runlocal",
          "--workdir", workdir, f"--config.compressor={compressor}", "--config.workers=8",
          "--config.batch_size=32", f"--config.num_train_steps={steps}", "--config.log_every=1",
          "--config.eval_every=0", "--config.eval_batch_size=500", "--config.progress=False",
          f"--config.checkpoint_every={checkpoint_every}", "--config.checkpoint_keep=2"]


class _Launch:
  """``experiments.launch`` in the background, its lines collected as they come."""

  def __init__(self, program: list[str], processes: int, max_restarts: int, env: dict):
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.launch", "--processes", str(processes), "--max-restarts",
         str(max_restarts), "--heartbeat-timeout", "10", "--", *program], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    self.lines: list[str] = []
    self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
    self._reader.start()

  def restarts(self) -> list[str]:
    return [line for line in list(self.lines) if line.startswith("[launch]") and "restart" in line]

  def rank_pid(self, rank: int) -> Optional[int]:
    """The pid of ``rank``'s process now (a child of the launcher), if it runs."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
      try:
        with open(f"/proc/{pid}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        if ppid != self.proc.pid:
          continue
        with open(f"/proc/{pid}/environ", "rb") as f:
          if f"JAXCOMP_PROCESS_ID={rank}".encode() in f.read().split(b"\0"):
            return int(pid)
      except (OSError, IndexError, ValueError):
        continue
    return None

  def finish(self, timeout: float) -> str:
    self.proc.wait(timeout=timeout)
    self._reader.join(5)
    return "".join(self.lines)


def last_row_step(workdir: str) -> int:
  """The step of the last row of ``metrics.csv`` (0 if none)."""
  path = os.path.join(workdir, "metrics.csv")
  if not os.path.exists(path):
    return 0
  with open(path, newline="") as f:
    steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("step", "").isdigit()]
  return max(steps, default=0)


def run(workdir: str, program: list[str], *, processes: int, kills: int, seed: int,
        window: tuple[float, float], env: dict, timeout: float = 1800, spare: int = 3) -> dict:
  """Runs ``program`` under the launcher with ``kills`` random SIGKILLs (and ``spare`` more
  restarts); returns the figures."""
  rng = random.Random(seed)
  t0 = time.monotonic()
  # Restarts to spare: on a loaded machine a process can reach the first collective more than
  # gloo's 30 s after the other, a failure the launcher restarts too.
  launch = _Launch(program, processes, max_restarts=kills + spare, env=env)
  faults = []
  for _ in range(kills):
    if rng.random() < 0.6:  # while it trains: once a new step is done, within 2 s
      base = last_row_step(workdir)
      while last_row_step(workdir) <= base and launch.proc.poll() is None:
        time.sleep(0.02)
      delay = rng.uniform(0.0, 2.0)
    else:  # any moment since the (re)start: starting, compiling, restoring, training
      delay = rng.uniform(*window)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and launch.proc.poll() is None:
      time.sleep(0.02)
    pid = launch.rank_pid(rank := rng.randrange(processes))
    if launch.proc.poll() is not None or pid is None:
      break
    seen = len(launch.restarts())
    fault = {"after_s": round(time.monotonic() - t0, 1), "rank": rank, "last_step": last_row_step(workdir)}
    os.kill(pid, signal.SIGKILL)
    while len(launch.restarts()) == seen and launch.proc.poll() is None:  # the launcher's restart line
      time.sleep(0.02)
    m = _RESUME_RE.search(launch.restarts()[seen]) if len(launch.restarts()) > seen else None
    faults.append(dict(fault, resumed_from=int(m.group(1) or 0) if m else None))
  out = launch.finish(timeout)
  return {"exit_code": launch.proc.returncode, "faults": len(faults), "restarts": len(launch.restarts()),
          "steps_recomputed": sum(f["last_step"] - (f["resumed_from"] or 0) for f in faults),
          "wall_s": round(time.monotonic() - t0, 1), "kills": faults, "output": out}


def metric_rows(workdir: str) -> list[dict]:
  """``metrics.csv``'s rows without the timing columns."""
  with open(os.path.join(workdir, "metrics.csv"), newline="") as f:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(f)]


def final_arrays(workdir: str) -> tuple[int, dict]:
  """The newest checkpoint's step and its arrays, by path, as numpy arrays on this host."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  directory = os.path.join(workdir, "checkpoints")
  step = max(int(n) for n in os.listdir(directory) if n.isdigit())
  path = os.path.join(directory, str(step), "default")
  with ocp.StandardCheckpointer() as ckptr:
    meta = ckptr.metadata(path).item_metadata
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state = ckptr.restore(path, jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta))
  return step, {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


def identical(a: str, b: str) -> list[str]:
  """What differs between the runs in workdirs ``a`` and ``b`` (empty: bit-identical)."""
  (step_a, arrays_a), (step_b, arrays_b) = final_arrays(a), final_arrays(b)
  diffs = [] if step_a == step_b else [f"final step {step_a} != {step_b}"]
  diffs += [k for k in sorted(set(arrays_a) | set(arrays_b))
            if k not in arrays_a or k not in arrays_b or arrays_a[k].tobytes() != arrays_b[k].tobytes()]
  if metric_rows(a) != metric_rows(b):
    diffs.append("metrics.csv")
  return diffs


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.split("\n")[0])
  p.add_argument("--compressor", default="threelc")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--checkpoint_every", type=int, default=25)
  p.add_argument("--kills", type=int, default=6)
  p.add_argument("--window", default="5,40", help="seconds after a (re)start a kill may fall: LOW,HIGH")
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--root", required=True, help="a new directory for the two runs")
  args = p.parse_args(argv)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
             PYTHONPATH=ROOT, JAX_COMPILATION_CACHE_DIR=os.path.join(args.root, "xla_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # a restart loads what the first run compiled
  window = tuple(float(x) for x in args.window.split(","))
  figures = {}
  for name, kills in (("reference", 0), ("chaos", args.kills)):
    workdir = os.path.join(args.root, name)
    program = train_args(workdir, args.compressor, args.steps, args.checkpoint_every)
    figures[name] = run(workdir, program, processes=args.processes, kills=kills, seed=args.seed,
                        window=window, env=env)
    output = figures[name].pop("output")
    if figures[name]["exit_code"] != 0:
      print(output[-4000:], file=sys.stderr)
  figures["time_lost_s"] = round(figures["chaos"]["wall_s"] - figures["reference"]["wall_s"], 1)
  figures["differences"] = identical(os.path.join(args.root, "reference"), os.path.join(args.root, "chaos"))
  print(json.dumps({"compressor": args.compressor, "steps": args.steps,
                    "checkpoint_every": args.checkpoint_every, **figures}, indent=1))
  return 0 if not figures["differences"] and figures["chaos"]["exit_code"] == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
