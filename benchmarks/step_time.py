r"""Training-step time with simulated workers: float against each compressor, side by side.

Each group is one experiment's config; each method in it is that config with
another compressor (its sweep's overrides). Every run is built exactly as
``experiments.train`` builds it (``experiments.build.build``: model, optimizer chain with
the compressor, the jitted step vmapping the workers inside ``shard_map``),
fed real batches of the config's dataset (three in turn), and compiled and
warmed up before any timing. Then, ``--repeats`` times, every method of the
group runs ``steps`` whole training steps back to back (in a rotated order);
a method's time in a repeat is seconds per step, and its ratio in that repeat
is that time over the float step's time in the same repeat. The table gives
the medians of the times and the median of the per-repeat ratios, so a ratio
compares steps taken within seconds of each other on a shared machine (as
``benchmarks/compressors.py`` does for codecs).

Groups (``--only``, comma-separated):

* ``lenet8``, ``lenet64``: TG-F3 (``configs/terngrad_lenet.py``), LeNet, total
  batch 64 over N = 8 / 64 workers; float, TernGrad (TG-F3's, ``clip_sigma``
  2.5), 3LC and QSGD (registry defaults). Targets: compressed / float
  ≤ 1.15 at N = 8, ≤ 2.5 at N = 64.
* ``resnet``: 3LC-T1 (``configs/threelc_resnet110.py:runlocal``: ResNet-8,
  10 workers × 32), every design of its sweep. No target.
* ``mlp``: DR-T1 (``configs/dryden_mlp.py``: the 36.8M-parameter MLP, 4
  workers × 10), its four methods. Target: every design ≤ 2 × float.
  (``benchmarks/dryden_step_time.py`` times the same steps once each, for
  DR-T1's training-length rule; this benchmark compares them side by side.)

Usage::

  python -m benchmarks.step_time [--only lenet8,mlp] [--quick] [--repeats 5] [--json out.json]

Each row also gives the process's minor page faults per step. With simulated
workers a compressed step materialises every worker's gradients (the float
step's worker sum folds into the gradient's matrix products), and XLA:CPU
allocates those temporaries afresh every step: at N = 64 tens of thousands
of first touches of fresh 4 KiB pages per step. Run under
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc ≥ 2.35: large allocations
get transparent huge pages) to see the step without most of them; the JSON
records the setting.

``--quick`` runs fewer repeats and steps and, in ``resnet``, only float32,
3LC (s = 1.00) and MQE 1-bit. The figures depend on the machine and its
load; ``docs/benchmarks.md`` quotes runs on an idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import resource
import sys
import tempfile
import time
from typing import Any, Callable, Optional

# TG-F3 LeNet methods: name -> (compressor, kwargs).
LENET_METHODS = {
    "float": ("none", {}),
    "terngrad": ("terngrad", {"clip_sigma": 2.5}),
    "threelc": ("threelc", {}),
    "qsgd": ("qsgd", {}),
}
LENET_TARGETS = {8: 1.15, 64: 2.5}
MLP_TARGET = 2.0
QUICK_RESNET = ("float32", "3lc_s1.00", "mqe_1bit")


@dataclasses.dataclass
class Group:
  """One config and the methods compared on it (the first is the float baseline)."""

  name: str
  config: Callable[[], Any]  # () -> ml_collections.ConfigDict
  methods: dict[str, tuple[str, dict]]  # name -> (compressor, compressor_kwargs)
  steps: int  # timed steps per method per repeat
  targets: dict[str, float]  # method -> largest ratio to float allowed (absent: no target)


def _lenet(workers: int):
  def config():
    from configs import terngrad_lenet  # pylint: disable=g-import-not-at-top
    c = terngrad_lenet.get_config()
    c.workers = workers
    return c
  return config


def _resnet():
  from configs import threelc_resnet110  # pylint: disable=g-import-not-at-top
  return threelc_resnet110.get_config("runlocal")


def _mlp():
  from configs import dryden_mlp  # pylint: disable=g-import-not-at-top
  return dryden_mlp.get_config()


def groups(quick: bool = False) -> dict[str, Group]:
  """The groups this benchmark knows, in the order they run."""
  from configs import dryden_mlp, threelc_resnet110  # pylint: disable=g-import-not-at-top

  def overrides(table):
    return {name: (o["compressor"], dict(o["compressor_kwargs"])) for name, (_, o) in table.items()}

  resnet = overrides(threelc_resnet110.DESIGNS)
  if quick:
    resnet = {k: v for k, v in resnet.items() if k in QUICK_RESNET}
  lenet = {}
  for n in (8, 64):
    lenet[f"lenet{n}"] = Group(f"lenet{n}", _lenet(n), dict(LENET_METHODS), steps=4 if quick else 10,
                               targets={m: LENET_TARGETS[n] for m in LENET_METHODS if m != "float"})
  mlp = overrides(dryden_mlp.METHODS)
  return {
      **lenet,
      "resnet": Group("resnet", _resnet, resnet, steps=1 if quick else 2, targets={}),
      "mlp": Group("mlp", _mlp, mlp, steps=1 if quick else 2,
                   targets={m: MLP_TARGET for m in mlp if m != "normal"}),
  }


def _config(group: Group, method: str):
  import ml_collections  # pylint: disable=g-import-not-at-top
  c = group.config()
  compressor, kwargs = group.methods[method]
  c.compressor = compressor
  c.compressor_kwargs = ml_collections.ConfigDict(kwargs)
  c.checkpoint_every = 0
  c.eval_every = 0
  c.progress = False
  return c


class _Stepper:
  """One built run: its state and three real batches, stepped in turn."""

  def __init__(self, run, batches_from: Optional["_Stepper"] = None):
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jaxcomp import data as data_lib  # pylint: disable=g-import-not-at-top
    self.run = run
    if batches_from is not None:
      self.batches = batches_from.batches
    else:
      c = run.config
      it = data_lib.make_pipeline(c.dataset, "train", global_batch_size=c.batch_size, train=True,
                                  start_step=0, **run.pipeline_kwargs)
      self.batches = [run.shard_batch(next(it)) for _ in range(3)]
    self.keys = [np.asarray(jax.random.fold_in(run.step_root, i + 1)) for i in range(3)]
    self.state = run.init_state()
    self.i = 0

  def steps(self, n: int) -> float:
    """Runs ``n`` steps; returns seconds per step (the last step's outputs awaited).

    Also sets ``faults``: this process's minor page faults per step. XLA:CPU
    allocates a step's temporary buffers afresh every call; each first touch
    of a fresh page (4 KiB, or 2 MiB with transparent huge pages) faults, and
    at tens of thousands of faults per step that is a real part of the step.
    """
    import jax  # pylint: disable=g-import-not-at-top
    faults = _minor_faults()
    t0 = time.perf_counter()
    metrics = None
    for _ in range(n):
      images, labels = self.batches[self.i % 3]
      self.state, metrics = self.run.train_step(self.state, images, labels, self.keys[self.i % 3])
      self.i += 1
    jax.block_until_ready((self.state, metrics))
    seconds = (time.perf_counter() - t0) / n
    self.faults = (_minor_faults() - faults) / n
    return seconds


def _minor_faults() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def bench_group(group: Group, repeats: int, warmup: int = 2, log=print) -> list[dict]:
  """Builds every method of ``group``, then times them interleaved; one result row per method."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  from experiments import build  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  steppers: dict[str, _Stepper] = {}
  compile_s: dict[str, float] = {}
  with tempfile.TemporaryDirectory() as workdir:
    for method in group.methods:
      t0 = time.perf_counter()
      run = build.build(_config(group, method), workdir)
      first = next(iter(steppers.values()), None)
      steppers[method] = _Stepper(run, batches_from=first)
      steppers[method].steps(warmup)  # the first step compiles
      compile_s[method] = time.perf_counter() - t0
      log(f"  {group.name}/{method}: built, compiled and warmed up in {compile_s[method]:.1f} s")
  names = list(group.methods)
  base = names[0]
  times = {m: [] for m in names}
  ratios = {m: [] for m in names}
  faulted = {m: [] for m in names}
  for r in range(repeats):
    order = names[r % len(names):] + names[:r % len(names)]
    this = {m: steppers[m].steps(group.steps) for m in order}
    for m in names:
      times[m].append(this[m])
      faulted[m].append(steppers[m].faults)
      ratios[m].append(this[m] / this[base])
    log(f"  {group.name} repeat {r + 1}/{repeats}: "
        + ", ".join(f"{m} {this[m] * 1e3:.0f} ms" for m in names))
  rows = []
  for m in names:
    ratio = statistics.median(ratios[m])
    target = group.targets.get(m)
    rows.append({
        "group": group.name, "method": m, "compressor": group.methods[m][0],
        "compressor_kwargs": group.methods[m][1], "workers": steppers[m].run.config.workers,
        "step_s": statistics.median(times[m]), "steps_per_s": 1.0 / statistics.median(times[m]),
        "ratio_to_float": ratio, "ratios": ratios[m], "times_s": times[m],
        "compile_and_warmup_s": compile_s[m], "minor_faults_per_step": statistics.median(faulted[m]),
        "target": target,
        "meets_target": None if target is None else bool(ratio <= target),
    })
  return rows


def table(rows: list[dict]) -> str:
  lines = [f"{'group':8s} {'method':18s} {'N':>3s} {'step ms':>9s} {'steps/s':>8s} {'/float':>7s} "
           f"{'target':>10s} {'faults/step':>11s}"]
  for r in rows:
    tgt = "" if r["target"] is None else f"{'ok' if r['meets_target'] else 'MISS'} {r['target']:.2f}"
    lines.append(f"{r['group']:8s} {r['method']:18s} {r['workers']:3d} {r['step_s'] * 1e3:9.1f} "
                 f"{r['steps_per_s']:8.2f} {r['ratio_to_float']:7.2f} {tgt:>10s} {r['minor_faults_per_step']:11.0f}")
  return "\n".join(lines)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__.split("\n")[0])
  p.add_argument("--only", default="", help="comma-separated groups (default: all)")
  p.add_argument("--quick", action="store_true", help="fewer repeats and steps, fewer ResNet designs")
  p.add_argument("--repeats", type=int, default=None, help="default 5 (--quick: 3)")
  p.add_argument("--methods", default="", help="comma-separated methods to keep in every group "
                 "(the group's float baseline is always kept)")
  p.add_argument("--json", default="", help="write the JSON here instead of stdout")
  args = p.parse_args(argv)
  known = groups(args.quick)
  wanted = [g.strip() for g in args.only.split(",") if g.strip()] or list(known)
  unknown = [g for g in wanted if g not in known]
  if unknown:
    p.error(f"unknown groups {unknown}; known: {list(known)}")
  repeats = args.repeats or (3 if args.quick else 5)
  if repeats < 1:
    p.error("--repeats must be at least 1")
  keep = {m.strip() for m in args.methods.split(",") if m.strip()}

  import jax  # pylint: disable=g-import-not-at-top
  t_start = time.perf_counter()
  rows = []
  for name in wanted:
    g = known[name]
    if keep:
      g.methods = {m: v for i, (m, v) in enumerate(g.methods.items()) if i == 0 or m in keep}
    print(f"{name}: {len(g.methods)} methods, {repeats} repeats of {g.steps} steps", file=sys.stderr, flush=True)
    rows += bench_group(g, repeats, log=lambda s: print(s, file=sys.stderr, flush=True))
  print(table(rows))
  doc = {
      "benchmark": "step_time",
      "jax": jax.__version__, "backend": jax.default_backend(), "devices": jax.device_count(),
      "machine": platform.machine(), "repeats": repeats, "quick": args.quick,
      "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
      "wall_s": time.perf_counter() - t_start,
      "command": "python -m benchmarks.step_time " + " ".join(sys.argv[1:] if argv is None else argv),
      "results": rows,
  }
  from benchmarks.compressors import emit  # pylint: disable=g-import-not-at-top
  return emit(doc, args.json)


if __name__ == "__main__":
  main()
