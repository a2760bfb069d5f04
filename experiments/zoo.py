r"""All compressors on the same run: ``docs/zoo.md``, ``docs/zoo.png``, ``docs/zoo_gpt.png``.

Every compressor :func:`jaxcomp.names` returns at run time, in one table per
zoo config (:data:`CONFIGS`: LeNet with each paper's settings,
``configs/zoo.py:SETTINGS``; then a small GPT on text with AdamW and DiLoCo,
``configs/zoo_gpt.py``, ranked by bits per byte, without a throughput step),
in four steps, each resumable (the paths below are the LeNet zoo's; the GPT
zoo's are under ``ROOT/zoo_gpt/``):

1. ``accuracy``: the sweep ``configs/zoo.py`` (compressor x seed, LeNet, 8
   simulated workers) through ``experiments.sweep``; finished runs are skipped.
   Writes ``ROOT/zoo/<dataset>/<compressor>/seed<S>/``.
2. ``throughput``: encode + decode throughput of each compressor on a 4M-value
   float32 matrix beside a float32 copy, as ``benchmarks.compressors`` measures
   it (its ``bench_one``), with the zoo's settings. Writes ``ROOT/zoo/throughput.json``.
3. ``link``: whole LeNet training steps at 2 processes over an emulated
   100 Mbit/s link, through ``benchmarks.train_step_link`` (needs root and
   iproute2). Writes ``ROOT/zoo/link_steps.json``.
4. ``report``: ``docs/zoo.md`` and ``docs/zoo.png`` from the committed files
   alone. A cell whose measurement is missing says "not measured".

This module runs the steps; the report is :mod:`experiments.zoo_report` (its
table and plot :mod:`experiments.zoo_table`, the studies' sections
:mod:`experiments.zoo_studies`), and :mod:`experiments.zoo_spec` reads a zoo
config for both.

The throughput and link steps measure only the compressors their JSON lacks
and add them to it; ``--force`` measures all again. Timings want an idle
machine.

Usage::

  python -m experiments.zoo                          # every step; reruns only what is missing
  python -m experiments.zoo --report                 # regenerate docs/zoo.md and docs/zoo.png only
  python -m experiments.zoo --steps accuracy,report  # some steps
  sudo .venv/bin/python -m experiments.zoo --steps link,report
  python -m experiments.zoo --config configs/zoo_gpt.py --steps accuracy  # one zoo
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Optional

from experiments.zoo_report import report
from experiments.zoo_spec import NOT_MEASURED, Zoo, load

STEPS = ("accuracy", "throughput", "link", "report")
# The zoos of docs/zoo.md, in its order: LeNet on images, then a small GPT on text.
CONFIGS = ("configs/zoo.py", "configs/zoo_gpt.py")


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m experiments.zoo", description=__doc__.split("\n")[0])
  p.add_argument("--config", action="append", default=None,
                 help="a zoo config, optionally with ':ARG' (repeatable; default: "
                      f"{' and '.join(CONFIGS)}, one page)")
  p.add_argument("--root", default="runs", help="root of the runs (the zoo's files go under ROOT/zoo)")
  p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {list(STEPS)}")
  p.add_argument("--report", action="store_true", help="only the report (same as --steps report)")
  p.add_argument("--out", default="docs/zoo.md")
  p.add_argument("--plot", default="docs/zoo.png")
  p.add_argument("--size", default=None, help="throughput tensor size (default: the config's, 4M)")
  p.add_argument("--repeats", type=int, default=7, help="throughput repeats (benchmarks.compressors)")
  p.add_argument("--link_steps", type=int, default=None,
                 help="timed training steps per compressor (link; default: the config's LINK_TIMED_STEPS)")
  p.add_argument("--force", action="store_true", help="measure throughput/link rows even if present")
  args = p.parse_args(argv)
  args.config = args.config or list(CONFIGS)
  args.steps = ["report"] if args.report else [s.strip() for s in args.steps.split(",") if s.strip()]
  bad = [s for s in args.steps if s not in STEPS]
  if bad:
    p.error(f"unknown step(s) {bad}; known: {list(STEPS)}")
  return args


# ----------------------------------------------------------------------------
# Step 1: accuracy (experiments.sweep).


def run_accuracy(zoo: Zoo) -> None:
  """Runs the sweep, then its tuning sweeps and diagnoses (:meth:`Zoo.studies`), in subprocesses.

  Each prints progress and skips finished runs.
  """
  for z in [zoo, *zoo.studies().values()]:
    _sweep(z)


def _sweep(zoo: Zoo) -> None:
  cmd = [sys.executable, "-m", "experiments.sweep", "--config", zoo.config_arg, "--root", zoo.root,
         "--checkpoint_every", "0"]
  print(f"[zoo] accuracy: {' '.join(cmd[1:])}", flush=True)
  t0 = time.time()
  proc = subprocess.run(cmd)
  if proc.returncode != 0:
    raise SystemExit(f"[zoo] the accuracy sweep failed (exit {proc.returncode})")
  print(f"[zoo] accuracy sweep: {time.time() - t0:.0f} s", flush=True)


# ----------------------------------------------------------------------------
# Step 2: throughput (benchmarks.compressors).


def _write(path: str, doc: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(json.dumps(doc, indent=1, default=float) + "\n")


def throughput_shape(n: int) -> tuple[int, int]:
  """The tensor timed: ``n`` values as a matrix of 1024 columns, as a layer's weights are.

  A matrix rather than ``benchmarks.compressors``' flat vector, so that PowerSGD
  (which sends vectors uncompressed) compresses it as it does a layer.
  """
  if n % 1024:
    raise ValueError(f"the throughput size must be a multiple of 1024, got {n}")
  return (n // 1024, 1024)


def run_throughput(zoo: Zoo, size: str, repeats: int, force: bool) -> None:
  """Times encode + decode of a ``size``-value float32 matrix for each compressor beside a float32 copy.

  ``none`` (nothing to encode) and optimizer wrappers (``local_steps``: no
  compressor of their own that ``benchmarks.compressors`` can build) have no row.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jaxcomp  # pylint: disable=g-import-not-at-top
  from experiments import throughput  # pylint: disable=g-import-not-at-top

  n = throughput.parse_size(size)
  doc = None if force else load(zoo.throughput_json)
  if doc is not None and doc.get("size") != n:
    raise SystemExit(f"[zoo] {zoo.throughput_json} holds size {doc.get('size')}, not {n}: "
                     "use --force to measure again")
  doc = doc or {"benchmark": "compressors (experiments.zoo)", "data": "synthetic float32 Gaussian "
                "(throughput only)", "size": n, "repeats": repeats, "jax": jax.__version__,
                "backend": jax.default_backend(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                "results": []}
  done = {r["compressor"] for r in doc["results"]}
  todo = [nm for nm in zoo.names() if zoo.compressor(nm) in jaxcomp.REGISTRY and nm != "none" and nm not in done]
  print(f"[zoo] throughput at n={n:,}: {len(todo)} to measure, {len(done)} in {zoo.throughput_json}",
        flush=True)
  if not todo:
    return
  x = jax.random.normal(jax.random.PRNGKey(0), throughput_shape(n), jnp.float32)
  key = jax.random.PRNGKey(1)
  copy = jax.jit(lambda v: v * jnp.float32(2.0))
  for name in todo:
    kwargs = zoo.timing_kwargs(name)
    r = throughput.bench_one(throughput.compressor_of(zoo.compressor(name), **kwargs), x, key, copy, repeats)
    r.update(compressor=name, kwargs=kwargs, size=n, shape=list(x.shape), melem_per_s=n / r["total_s"] / 1e6,
             copy_melem_per_s=n / r["copy_s"] / 1e6, measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    doc["results"].append(r)
    _write(zoo.throughput_json, doc)  # after each row, so an interrupted step keeps what it measured
    print(f"  {name}: {r['melem_per_s']:.0f} M el/s, {r['vs_copy']:.1%} of a float32 copy", flush=True)


# ----------------------------------------------------------------------------
# Step 3: link step time (benchmarks.train_step_link).


def link_available() -> Optional[str]:
  """Why the link step cannot run here, or ``None`` if it can."""
  if os.geteuid() != 0:
    return "the emulated link needs root (network namespaces): run it with sudo"
  missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
  if missing:
    return f"the emulated link needs iproute2 ({', '.join(missing)} not found)"
  return None


def run_link(zoo: Zoo, timed_steps: int, force: bool) -> None:
  """Median training-step time of each compressor at ``LINK_PROCESSES`` over ``LINK_RATE``."""
  why = link_available()
  if why:
    raise SystemExit(f"[zoo] link step not run: {why}. The report marks these cells '{NOT_MEASURED}'.")
  processes, rate = zoo.module.LINK_PROCESSES, zoo.module.LINK_RATE
  doc = None if force else load(zoo.link_json)
  if doc is not None and (doc.get("processes"), doc.get("link")) != (processes, rate):
    raise SystemExit(f"[zoo] {zoo.link_json} was measured at {doc.get('processes')} processes over "
                     f"{doc.get('link')}, not {processes} over {rate}: use --force to measure again")
  done = {r.get("compressor") for r in (doc or {}).get("results", [])}
  todo = [n for n in zoo.names() if n not in done]
  print(f"[zoo] link: {len(todo)} to time at {processes} processes over {rate}, {len(done)} in "
        f"{zoo.link_json}", flush=True)
  if not todo:
    return
  groups: dict[tuple, list[str]] = {}  # one train_step_link run per set of config overrides
  for name in todo:
    groups.setdefault(zoo.link_overrides(name), []).append(name)
  for overrides, names in groups.items():
    new = _time_link_steps(zoo, names, overrides, timed_steps)
    if doc is None:
      doc = {k: v for k, v in new.items() if k not in ("results", "overrides")}
      doc.update(processes=processes, link=rate, results=[])
    doc["results"] += new["results"]
    _write(zoo.link_json, doc)  # after each group, so an interrupted step keeps what it measured


def _time_link_steps(zoo: Zoo, names: list[str], overrides: tuple[str, ...], timed_steps: int) -> dict:
  """``benchmarks.train_step_link``'s document for ``names``, each result tagged with its compressor."""
  part = zoo.link_json + ".part"
  os.makedirs(zoo.dir, exist_ok=True)
  cmd = [sys.executable, "-m", "benchmarks.train_step_link", "--processes", str(zoo.module.LINK_PROCESSES),
         "--link", zoo.module.LINK_RATE, "--configs", zoo.module.LINK_CONFIG, "--methods", ",".join(zoo.method(n) for n in names),
         "--steps", str(timed_steps), "--json", part] + [f"--set={kv}" for kv in overrides]
  print(f"[zoo] {' '.join(cmd[1:])}", flush=True)
  proc = subprocess.run(cmd)
  if proc.returncode != 0 or not os.path.exists(part):
    raise SystemExit(f"[zoo] benchmarks.train_step_link failed (exit {proc.returncode})")
  new = load(part)
  os.remove(part)
  for name, r in zip(names, new["results"]):
    r.update(compressor=name, overrides=list(overrides))
  return new


# ----------------------------------------------------------------------------
# Step 4: the report (experiments.zoo_report), and the command line.


def main(argv=None) -> int:
  args = _parse(sys.argv[1:] if argv is None else list(argv))
  zoos = [Zoo(config, args.root) for config in args.config]
  for zoo in zoos:
    print(f"[zoo] {zoo.config_arg}: {len(zoo.names())} rows: {', '.join(zoo.names())}", flush=True)
    if "accuracy" in args.steps:
      run_accuracy(zoo)
    if "throughput" in args.steps and zoo.module.THROUGHPUT_SIZE:  # None: this zoo has no such column
      run_throughput(zoo, args.size or zoo.module.THROUGHPUT_SIZE, args.repeats, args.force)
    if "link" in args.steps:
      run_link(zoo, args.link_steps or zoo.module.LINK_TIMED_STEPS, args.force)
  if "report" in args.steps:
    report(zoos, args.out, args.plot)
    print(f"[zoo] wrote {args.out} and its plots", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
