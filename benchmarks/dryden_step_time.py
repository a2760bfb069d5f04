r"""DR-T1's step times and the training fraction they allow (configs/dryden_mlp.py).

The rule, fixed in ``configs/dryden_mlp.py`` before anything was measured:
each of the four methods trains 10 steps (compilation and warm-up), then 5
more are timed; then

  fraction = (budget − margin − 4 × per-run overhead) / (Σ step times) / full steps,

rounded down to 0.01, with budget 7,200 s, margin 600 s, overhead 180 s (compile
and test passes) and full steps the paper's 20 epochs at total batch 40
(30,000 on Fashion-MNIST's 60,000 training images).

The timed steps are real training steps of the real config (36.8M parameters,
4 simulated workers, the real dataset), stopped before any evaluation. Run::

  python -m benchmarks.dryden_step_time --json runs/DR-T1/fashion_mnist_debian/step_times.json

The JSON, committed beside the runs, is what ``experiments.report`` quotes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import tempfile
import time

BUDGET_SEC = 7200.0
MARGIN_SEC = 600.0
OVERHEAD_SEC = 180.0  # per method: compilation and the test passes
WARMUP_STEPS = 10
TIMED_STEPS = 5


def fraction_for(step_times: dict[str, float], full_steps: int) -> float:
  """The rule of configs/dryden_mlp.py: the largest fraction (in 0.01) that fits the budget."""
  if not step_times or any(not (t > 0) for t in step_times.values()):
    raise ValueError(f"step times must be positive; got {step_times}.")
  usable = BUDGET_SEC - MARGIN_SEC - len(step_times) * OVERHEAD_SEC
  raw = usable / sum(step_times.values()) / full_steps
  return math.floor(raw * 100 + 1e-9) / 100


def time_method(dataset: str, overrides: dict, workdir: str) -> float:
  """Seconds per step over ``TIMED_STEPS`` steps after ``WARMUP_STEPS``, one method."""
  from configs import dryden_mlp  # pylint: disable=g-import-not-at-top
  from experiments import train  # pylint: disable=g-import-not-at-top

  config = dryden_mlp.get_config(f"dataset={dataset},fraction=1")
  for k, v in overrides.items():
    config[k] = v
  config.log_every = TIMED_STEPS
  config.eval_every = 0
  config.checkpoint_every = 0
  assert WARMUP_STEPS % TIMED_STEPS == 0
  train.train_and_evaluate(config, workdir, stop_after_steps=WARMUP_STEPS + TIMED_STEPS)
  with open(os.path.join(workdir, "metrics.csv"), newline="") as f:
    rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
  last = [r for r in rows if int(r["step"]) == WARMUP_STEPS + TIMED_STEPS]
  if not last:
    raise RuntimeError(f"no train row at step {WARMUP_STEPS + TIMED_STEPS} in {workdir}/metrics.csv")
  return 1.0 / float(last[0]["steps_per_sec"])


def main(argv=None) -> int:
  from configs import common, dryden_mlp  # pylint: disable=g-import-not-at-top
  from jaxcomp import data  # pylint: disable=g-import-not-at-top

  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--dataset", default=None, help="a jaxcomp.data dataset (default: the offline one)")
  p.add_argument("--json", default=None, help="write the step times and the fraction here")
  args = p.parse_args(argv)
  dataset = args.dataset or common.offline_dataset()
  full_steps = dryden_mlp.steps_for(1.0, data.get_spec(dataset).num_examples("train"))
  times = {}
  for name, (label, overrides) in dryden_mlp.METHODS.items():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
      times[name] = time_method(dataset, overrides, tmp)
    print(f"{label:28s} {times[name]:.3f} s/step  (measured in {time.time() - t0:.0f} s)", flush=True)
  fraction = fraction_for(times, full_steps)
  total = sum(times.values())
  print(f"sum of step times {total:.3f} s; full length {full_steps} steps; "
        f"fraction = ({BUDGET_SEC:.0f} - {MARGIN_SEC:.0f} - {len(times)}x{OVERHEAD_SEC:.0f}) / "
        f"{total:.3f} / {full_steps} -> {fraction:.2f} "
        f"({dryden_mlp.steps_for(fraction, data.get_spec(dataset).num_examples('train'))} steps per method)")
  if args.json:
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"dataset": dataset, "step_time_sec": times, "warmup_steps": WARMUP_STEPS,
                 "timed_steps": TIMED_STEPS, "budget_sec": BUDGET_SEC, "margin_sec": MARGIN_SEC,
                 "overhead_sec": OVERHEAD_SEC, "full_steps": full_steps, "fraction": fraction,
                 "command": "python -m benchmarks.dryden_step_time " + " ".join(argv or sys.argv[1:])},
                f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
