r"""Runs an experiment's grid of configurations, resumably.

Usage::

  python -m experiments.sweep --config configs/terngrad_lenet.py --root runs
  python -m experiments.sweep --config configs/terngrad_lenet.py:dataset=mnist5k --root runs \
      --only workers=8 --dry_run

The config module defines the grid with ``get_sweep(arg) -> [(name, overrides), ...]``:
every entry becomes one run of ``python -m experiments.train`` in its own
process, with the config file and argument given here and ``--config.KEY=VALUE``
for each override, in ``ROOT/<experiment>/<dataset>/<name>``. An entry may be
``(name, overrides, entry_arg)`` to run with the config argument ``entry_arg``
instead, for settings a flag cannot express (e.g. a ``None`` inside
``compressor_kwargs``: TernGrad without clipping), and
``(name, overrides, entry_arg, launch)`` to run it in several processes:
``launch`` is ``{"processes": P, "link": RATE}`` (link optional) and the run
goes through ``python -m experiments.launch --processes P [--link RATE] --``
(``--link`` needs root). The command is
saved as ``command.txt`` beside the run's metrics, so any cell can be re-run by
hand.

Resumable: a run with a ``summary.json`` is finished and is not run again; an
interrupted run resumes from its last checkpoint (sweep runs checkpoint every
``--checkpoint_every`` steps). Stop a sweep at any time (Ctrl-C) and start the
same command again to continue.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from absl import app
from absl import flags
from absl import logging

from experiments import preemption
from experiments import procenv

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command-line flags; defined when run as a script, so :func:`plan` imports cleanly
  beside other modules with flags (``experiments.report`` also has ``--root``)."""
  flags.DEFINE_string("config", None, "Experiment config file, optionally with ':ARG'.")
  flags.DEFINE_string("root", "runs", "Root directory of all runs.")
  flags.DEFINE_multi_string("only", [], "Run only entries whose overrides match KEY=VALUE (repeatable).")
  flags.DEFINE_multi_string("set", [], "Extra --config.KEY=VALUE for every run (e.g. num_train_steps=100).")
  flags.DEFINE_integer("checkpoint_every", 1000, "Checkpoint period of sweep runs (0: none).")
  flags.DEFINE_integer("max_runs", 0, "Stop after starting this many runs (0: all).")
  flags.DEFINE_bool("dry_run", False, "Print the runs and their state; run nothing.")
  flags.mark_flag_as_required("config")


def load_config_module(path: str):
  spec = importlib.util.spec_from_file_location("sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def format_value(v: Any) -> str:
  """``v`` as a ``--config.KEY=`` value; ml_collections reads containers with ``ast.literal_eval``."""
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, (dict, list, tuple)):
    text = json.dumps(v)
    try:
      if ast.literal_eval(text) == v:
        return text
    except (ValueError, SyntaxError):
      pass
    return repr(v)  # JSON's true/false/null are no Python literals: the Python spelling
  return str(v)


def plan(config_arg: str, root: str) -> list[dict[str, Any]]:
  """The runs of a sweep: name, workdir, overrides, command, state."""
  path, _, arg = config_arg.partition(":")
  module = load_config_module(path)
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{path} defines no get_sweep(arg); it has no grid to run.")
  base = module.get_config(arg or None)
  runs = []
  for name, overrides, *rest in module.get_sweep(arg or None):
    entry_arg, launch = (list(rest) + [None, None])[:2]
    workdir = os.path.join(root, base.experiment, base.dataset, name)
    run_arg = f"{path}:{entry_arg}" if entry_arg else config_arg
    cmd = [sys.executable] + launcher(launch) + ["-m", "experiments.train", "--config", run_arg,
                                                 "--workdir", workdir]
    cmd += [f"--config.{k}={format_value(v)}" for k, v in overrides.items()]
    state = ("done" if os.path.exists(os.path.join(workdir, "summary.json"))
             else "partial" if os.path.exists(os.path.join(workdir, "metrics.csv")) else "todo")
    runs.append(dict(name=name, workdir=workdir, overrides=overrides, cmd=cmd, state=state))
  return runs


def launcher(launch: dict[str, Any] | None) -> list[str]:
  """The ``-m experiments.launch ... --`` prefix of a run in several processes (none for one)."""
  if not launch:
    return []
  unknown = set(launch) - {"processes", "link"}
  if unknown or "processes" not in launch:
    raise ValueError(f"a sweep entry's launch is {{'processes': P, 'link': RATE}}; got {launch!r}")
  link = ["--link", str(launch["link"])] if launch.get("link") else []
  return ["-m", "experiments.launch", "--processes", str(launch["processes"])] + link + ["--"]


def _matches(overrides: dict[str, Any], only: list[str]) -> bool:
  for cond in only:
    k, _, v = cond.partition("=")
    if format_value(overrides.get(k)) != v:
      return False
  return True


def _run_forwarding_sigterm(cmd: list[str], log) -> int:
  """Runs one training command; a SIGTERM to the sweep goes to it (it saves and exits 75). Its exit status."""
  # CPU: about 2x faster steps with huge pages (experiments/procenv.py; JAXCOMP_HUGE_PAGES=0: off).
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=procenv.with_huge_pages(os.environ))
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
  try:
    return proc.wait()
  finally:
    signal.signal(signal.SIGTERM, previous)


def main(argv):
  del argv
  runs = [r for r in plan(FLAGS.config, FLAGS.root) if _matches(r["overrides"], FLAGS.only)]
  extra = [f"--config.{kv}" for kv in FLAGS.set]
  if FLAGS.checkpoint_every:
    extra.append(f"--config.checkpoint_every={FLAGS.checkpoint_every}")
  extra.append("--config.progress=False")
  counts = {s: sum(r["state"] == s for r in runs) for s in ("done", "partial", "todo")}
  print(f"{len(runs)} runs: {counts['done']} done, {counts['partial']} partial, {counts['todo']} to do")
  if FLAGS.dry_run:
    for r in runs:
      print(f"  [{r['state']:7s}] {r['name']}")
    return
  started = 0
  for i, r in enumerate(runs):
    if r["state"] == "done":
      continue
    if FLAGS.max_runs and started >= FLAGS.max_runs:
      break
    started += 1
    os.makedirs(r["workdir"], exist_ok=True)
    cmd = r["cmd"] + extra
    with open(os.path.join(r["workdir"], "command.txt"), "w") as f:
      f.write(shlex.join(["python"] + cmd[1:]) + "\n")
    print(f"[{i + 1}/{len(runs)}] {r['name']} ({r['state']}) ...", flush=True)
    t0 = time.time()
    with open(os.path.join(r["workdir"], "log.txt"), "a") as log:
      returncode = _run_forwarding_sigterm(cmd, log)
    dt = time.time() - t0
    if returncode == preemption.PREEMPTED_EXIT_CODE:
      print(f"    preempted after {dt:.0f} s, its checkpoint saved: run the sweep again to resume", flush=True)
      raise SystemExit(preemption.PREEMPTED_EXIT_CODE)
    if returncode != 0:
      print(f"    FAILED (exit {returncode}) after {dt:.0f} s; see {r['workdir']}/log.txt", flush=True)
      continue
    with open(os.path.join(r["workdir"], "summary.json")) as f:
      s = json.load(f)
    print(f"    test accuracy {100 * s['test_accuracy']:.2f}%  bytes/step {s['bytes_on_wire']:,.0f}  "
          f"{dt:.0f} s", flush=True)


if __name__ == "__main__":
  define_flags()
  logging.set_verbosity(logging.WARNING)
  app.run(main)
