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
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, NamedTuple, Optional

STEPS = ("accuracy", "throughput", "link", "report")
NOT_MEASURED = "not measured"
# The zoos of docs/zoo.md, in its order: LeNet on images, then a small GPT on text.
CONFIGS = ("configs/zoo.py", "configs/zoo_gpt.py")


class Metric(NamedTuple):
  """What a zoo's table ranks by: a ``summary.json`` key, shown as ``column`` (times ``scale``)."""
  key: str
  name: str
  column: str
  scale: float
  digits: int
  higher_is_better: bool
  zoom: float  # the plot's second panel: rows within this much of the best mean
  unit: str  # of ``zoom``, in words


METRICS = {
    "test_accuracy": Metric("test_accuracy", "Accuracy", "test accuracy (%)", 100.0, 2, True, 5.0, "points"),
    "test_bits_per_byte": Metric("test_bits_per_byte", "Bits per byte", "held-out bits per byte", 1.0, 3, False, 0.25,
                                 "bits per byte"),
}


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
# What the config says.


class Zoo:
  """The config module and argument, and where the zoo's files live."""

  def __init__(self, config_arg: str, root: str):
    from experiments import sweep  # pylint: disable=g-import-not-at-top
    self.config_arg = config_arg
    path, _, self.arg = config_arg.partition(":")
    self.module = sweep.load_config_module(path)
    self.base = self.module.get_config(self.arg or None)
    self.root = root
    self.dir = os.path.join(root, self.base.experiment)
    self.runs_dir = os.path.join(self.dir, self.base.dataset)
    self.throughput_json = os.path.join(self.dir, "throughput.json")
    self.link_json = os.path.join(self.dir, "link_steps.json")
    self.metric = METRICS[getattr(self.module, "METRIC", "test_accuracy")]

  def studies(self) -> dict[str, "Zoo"]:
    """The tuning sweeps and the diagnoses of this zoo (``:tune``, ``:diagnose``, where its config
    takes them); none for ``runlocal``."""
    if "runlocal" in self.arg.split(","):
      return {}
    path = self.config_arg.partition(":")[0]
    return {study: Zoo(f"{path}:{','.join(filter(None, [self.arg, study]))}", self.root)
            for study in ("tune", "diagnose", "diloco") if study in self.module.ARGS}

  def names(self) -> list[str]:
    """Registered compressors that this sweep runs, in ``SETTINGS`` order."""
    seen = []
    for name, _ in self.module.get_sweep(self.arg or None):
      comp = name.split("/")[0]
      if comp not in seen:
        seen.append(comp)
    return seen

  def seeds_per_name(self) -> dict[str, int]:
    """How many runs (seeds) the sweep has per compressor."""
    out: dict[str, int] = {}
    for name, _ in self.module.get_sweep(self.arg or None):
      out[name.split("/")[0]] = out.get(name.split("/")[0], 0) + 1
    return out

  def row(self, name: str) -> dict:
    return self.module.SETTINGS[name]

  def compressor(self, name: str) -> str:
    """The registered compressor a row runs (a labelled row's, or the row's name)."""
    return self.row(name).get("compressor", name) if name in self.module.SETTINGS else name

  def link_overrides(self, name: str) -> tuple[str, ...]:
    """The row's config overrides that the link timing keeps: all but ``min_size``, which goes in
    the method (the optimizer and its learning rate; 1-bit Adam, the optimizer itself, needs plain
    SGD after it to build at all, and no clipping after it).
    """
    config = self.row(name).get("config", {})
    return tuple(f"{k}={v}" for k, v in config.items() if k != "min_size")

  def timing_kwargs(self, name: str) -> dict:
    """The row's kwargs, with its ``timing`` ones: warm-ups end before the timed calls."""
    row = self.row(name)
    return {**row["kwargs"], **row.get("timing", {})}

  def method(self, name: str) -> str:
    """``name:key=value:...`` for ``benchmarks.train_step_link``: :meth:`timing_kwargs` and ``min_size``."""
    row = self.row(name)
    kwargs = self.timing_kwargs(name)
    if "min_size" in row.get("config", {}):
      kwargs["min_size"] = row["config"]["min_size"]
    for k, v in kwargs.items():
      if ":" in repr(v) or "," in repr(v):
        raise ValueError(f"{name}: argument {k}={v!r} cannot be written as a link method")
    return ":".join([self.compressor(name)] + [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in kwargs.items()])


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


def _load(path: str) -> Optional[dict]:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


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
  doc = None if force else _load(zoo.throughput_json)
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
  doc = None if force else _load(zoo.link_json)
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
  new = _load(part)
  os.remove(part)
  for name, r in zip(names, new["results"]):
    r.update(compressor=name, overrides=list(overrides))
  return new


# ----------------------------------------------------------------------------
# Step 4: the report (committed files only).


def _summaries(zoo: Zoo) -> dict[str, list[dict]]:
  """compressor -> the summaries of its finished seeds."""
  out: dict[str, list[dict]] = {}
  if not os.path.isdir(zoo.runs_dir):
    return out
  for name in sorted(os.listdir(zoo.runs_dir)):
    d = os.path.join(zoo.runs_dir, name)
    for seed in sorted(os.listdir(d)) if os.path.isdir(d) else []:
      s = _load(os.path.join(d, seed, "summary.json"))
      if s is not None:
        out.setdefault(name, []).append(s)
  return out


def accuracy_cells(summaries: list[dict], metric: Metric = METRICS["test_accuracy"]) -> dict[str, Any]:
  """Mean, sample standard deviation and range of the seeds' ``metric`` (test accuracy in %, by
  default), bytes per step."""
  accs = [metric.scale * s[metric.key] for s in summaries]
  wire = statistics.mean(s["mean_bytes_on_wire"] for s in summaries)
  peaks = [s.get("peak_bytes_on_wire") for s in summaries]  # runs from before the column have none
  floats = statistics.mean(s["float32_bytes"] for s in summaries)
  return {"seeds": len(accs), "mean": statistics.mean(accs),
          "sd": statistics.stdev(accs) if len(accs) > 1 else None, "min": min(accs), "max": max(accs),
          "bytes": wire, "ratio": floats / wire if wire else math.inf,
          "peak": max(peaks) if None not in peaks else None,
          "steps": summaries[0]["steps"], "train_s": statistics.mean(s["train_time_sec"] for s in summaries),
          "wall_s": statistics.mean(s["wall_time_sec"] for s in summaries)}


def settings_text(row: dict) -> str:
  """``key=value`` of the compressor's kwargs and other config overrides, as the sweep passes them."""
  parts = [f"{k}={v!r}" if isinstance(v, (str, float)) else f"{k}={v}"
           for k, v in {**row["kwargs"], **row.get("config", {})}.items()]
  return ", ".join(f"`{p}`" for p in parts) or "defaults"


def rows(zoo: Zoo) -> list[dict]:
  """One dict per compressor (registered, or with finished runs): its cells, None where not measured."""
  summaries = _summaries(zoo)
  thr = {r["compressor"]: r for r in (_load(zoo.throughput_json) or {}).get("results", [])}
  link_doc = _load(zoo.link_json) or {}
  link = {r["compressor"]: r for r in link_doc.get("results", [])}
  names = zoo.names() + [n for n in summaries if n not in zoo.names()]
  out = []
  for name in names:
    row = zoo.module.SETTINGS.get(name, {"kwargs": {}, "paper": "(no SETTINGS row)"})
    out.append({"name": name, "settings": settings_text(row), "paper": row["paper"],
                "acc": accuracy_cells(summaries[name], zoo.metric) if name in summaries else None,
                "throughput": thr.get(name), "link_s": link_seconds(zoo, link[name]) if name in link else None})
  base = next((r["link_s"] for r in out if r["name"] == "none"), None)
  for r in out:
    r["link_speedup"] = base / r["link_s"] if base and r["link_s"] else None
  return out


def link_seconds(zoo: Zoo, result: dict) -> float:
  """A row's step over the link: the median or the mean of its timed steps (``LINK_STATISTIC``)."""
  if zoo.module.LINK_STATISTIC == "mean":
    return statistics.mean(result["times_s"])
  return result["step_time_sec"]  # benchmarks.train_step_link's median


def _size_label(n: int) -> str:
  from experiments import throughput  # pylint: disable=g-import-not-at-top
  return throughput.size_label(n) if n >= 2**20 else f"{n:,}-value"


def _fmt_bytes(b: float) -> str:
  return f"{b / 1e6:.3f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB"


def _acc_text(a: Optional[dict], digits: int = 2) -> tuple[str, str]:
  if a is None:
    return NOT_MEASURED, "—"
  spread = (f"± {a['sd']:.{digits}f} ({a['min']:.{digits}f}–{a['max']:.{digits}f})" if a["sd"] is not None
            else "one seed")
  return f"{a['mean']:.{digits}f}", spread


def _throughput_text(name: str, r: Optional[dict]) -> str:
  if name == "none":
    return "— (no encoding)"
  if r is None:
    return NOT_MEASURED if name not in _wrappers() else "— (optimizer wrapper)"
  return f"{r['melem_per_s']:.0f} M el/s ({r['vs_copy']:.0%})"


def _wrappers() -> set[str]:
  from jaxcomp import compressors  # pylint: disable=g-import-not-at-top
  return set(compressors.WRAPPERS)


def table(zoo: Zoo, rs: list[dict]) -> list[str]:
  """The zoo's table; the encode+decode column where the zoo times throughput."""
  thr = bool(zoo.module.THROUGHPUT_SIZE)
  lines = [f"| compressor | settings | {zoo.metric.column} | spread over seeds | bytes / worker / step | "
           "largest step / worker | ratio to float | " + ("encode+decode (vs float32 copy) | " if thr else "")
           + "step over link (s) | speedup | settings from |",
           "|---|---|---:|---|---:|---:|---:|" + ("---:|" if thr else "") + "---:|---:|---|"]
  for r in rs:
    acc, spread = _acc_text(r["acc"], zoo.metric.digits)
    wire = _fmt_bytes(r["acc"]["bytes"]) if r["acc"] else NOT_MEASURED
    peak = _fmt_bytes(r["acc"]["peak"]) if r["acc"] and r["acc"]["peak"] is not None else NOT_MEASURED
    ratio = f"{r['acc']['ratio']:.1f}×" if r["acc"] else NOT_MEASURED
    link = f"{r['link_s']:.3f}" if r["link_s"] is not None else NOT_MEASURED
    speed = f"{r['link_speedup']:.2f}×" if r["link_speedup"] else "—"
    encode = f"{_throughput_text(zoo.compressor(r['name']), r['throughput'])} | " if thr else ""
    lines.append(f"| `{r['name']}` | {r['settings']} | {acc} | {spread} | {wire} | {peak} | {ratio} | "
                 f"{encode}{link} | {speed} | {r['paper']} |")
  return lines


def plot(rs: list[dict], path: str, title: str, metric: Metric = METRICS["test_accuracy"],
         baseline: Optional[tuple[float, str]] = None) -> Optional[str]:
  """``metric`` (mean, bars: min–max over seeds) against bytes per worker per step, log x.

  Two panels: every compressor, and a zoom on those within ``metric.zoom`` of the best mean
  (they crowd near the best in the first panel). ``baseline``: a ``(value, label)`` drawn as a
  dashed line in the first panel (a language model's unigram entropy).
  """
  pts = [r for r in rs if r["acc"]]
  if not pts:
    return None
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  sign = 1 if metric.higher_is_better else -1
  best = sign * max(sign * r["acc"]["mean"] for r in pts)
  top = [r for r in pts if sign * (best - r["acc"]["mean"]) <= metric.zoom]
  color = {r["name"]: f"C{k % 10}" for k, r in enumerate(pts)}  # the same in both panels
  fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
  for ax, group in zip(axes, (pts, top)):
    for r in group:
      a = r["acc"]
      ax.errorbar([a["bytes"]], [a["mean"]], yerr=[[a["mean"] - a["min"]], [a["max"] - a["mean"]]],
                  fmt="o", capsize=3, markersize=5, color=color[r["name"]])
      ax.annotate(r["name"], (a["bytes"], a["mean"]), textcoords="offset points", xytext=(5, 4),
                  fontsize=8, color=color[r["name"]])
    ax.set_xscale("log")
    ax.set_xlabel("bytes on the wire per worker per step (log)")
    ax.grid(alpha=0.3, which="both")
  if baseline is not None:
    axes[0].axhline(baseline[0], ls="--", lw=1, color="grey")
    axes[0].annotate(baseline[1], (0.01, baseline[0]), xycoords=("axes fraction", "data"),
                     textcoords="offset points", xytext=(0, 3), fontsize=8, color="grey")
  axes[0].set_ylabel(f"{metric.column}, mean over seeds; bars: min–max")
  axes[0].set_title(title, fontsize=10)
  axes[1].set_title(f"zoom: within {metric.zoom:g} {metric.unit} of the best mean ({best:.{metric.digits}f})",
                    fontsize=10)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def plot_path(plot: str, zoo: Zoo, first: bool) -> str:
  """The first zoo's plot is ``plot``; a further zoo's is ``<plot stem>_<its model>.png``."""
  return plot if first else plot.replace(".png", f"_{zoo.base.model}.png")


def report(zoos: list[Zoo], out: str, plot: str) -> str:
  """Writes ``out`` (Markdown) and the zoos' plots (PNG, :func:`plot_path`) from their files alone:
  a section per zoo, by what its table ranks (image accuracy, or a language model's bits per byte)."""
  lines = ["# The compressor zoo: every compressor on the same run", "",
           "Generated by `python -m experiments.zoo --report` from the files under "
           + " and ".join(f"`{z.dir}/`" for z in zoos)
           + "; do not edit by hand. `python -m experiments.zoo` reruns only what is missing.", ""]
  for k, zoo in enumerate(zoos):
    section = _vision_section if zoo.metric.key == "test_accuracy" else _language_section
    lines += section(zoo, out, plot_path(plot, zoo, k == 0))
  text = "\n".join(lines).rstrip() + "\n"
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    f.write(text)
  return text


def _plot_line(drawn: Optional[str], out: str, alt: str) -> list[str]:
  if not drawn:
    return []
  return [f"![{alt}]({os.path.relpath(os.path.abspath(drawn), os.path.dirname(os.path.abspath(out)))})", ""]


def _section_facts(zoo: Zoo) -> tuple[list[dict], list[dict], list[int], list[int]]:
  """A zoo's rows, those measured, their step counts and the sweep's seeds."""
  rs = rows(zoo)
  measured = [r for r in rs if r["acc"]]
  steps = sorted({r["acc"]["steps"] for r in measured})
  return rs, measured, steps, sorted({o["seed"] for _, o in zoo.module.get_sweep(zoo.arg or None)})


def _vision_section(zoo: Zoo, out: str, plot_path: str) -> list[str]:
  """The LeNet zoo: its run, the table and plot, and the findings behind its labelled rows."""
  m, c = zoo.module, zoo.base
  rs, measured, steps, seeds = _section_facts(zoo)
  thr_doc, link_doc = _load(zoo.throughput_json), _load(zoo.link_json)
  thr_size = _size_label(thr_doc["size"]) if thr_doc else m.THROUGHPUT_SIZE
  drawn = plot(rs, plot_path, f"LeNet, {c.dataset}, {c.workers} workers, {'/'.join(map(str, steps))} steps")
  lines = [
      f"**The run.** TG-F3's LeNet (`configs/terngrad_lenet.py`) on `{c.dataset}` (real images), "
      f"total batch {c.batch_size} over {c.workers} simulated workers, momentum SGD "
      f"({c.momentum}, base LR {c.learning_rate}, polynomial decay with power {c.lr_power}), weight "
      f"decay {c.weight_decay}, evaluated with the parameter EMA TernGrad uses; the same "
      f"{'/'.join(map(str, steps)) or c.num_train_steps} steps and seeds "
      f"{', '.join(map(str, seeds))} for every compressor "
      "(`configs/zoo.py`).",
      "",
      f"**Reduced scale.** {c.num_train_steps} steps instead of TG-F3's 10,000 (LeNet reaches about "
      "80% on Fashion-MNIST by then), so that the whole zoo fits in about an hour of a 2-core CPU "
      "machine; each run is its own process (`experiments.sweep`): " + _timing_text(measured)
      + " The accuracies compare compressors after a short run, not converged accuracies; "
      "compressors that start slowly (warm-ups, error feedback that has not caught up) are at a "
      "disadvantage here that a full run would not show.",
      "",
      "**One rule for every row.** Every LeNet tensor goes through the compressor (TG-F3 compresses "
      "all of LeNet's layers; no exception for the last layer or biases), except where the "
      "compressor's paper keeps small tensors in float (`min_size`). The optimizer is TG-F3's unless "
      "the row's settings name another: sign updates move every weight by ± the learning rate, so "
      "they take plain SGD with their own rate; DGC's momentum correction replaces the optimizer's "
      "momentum; 1-bit Adam is the optimizer itself; random-k with memory runs Stich et al.'s plain SGD "
      "and Dryden et al.'s threshold and adaptive quantization their AdaGrad (LR 0.005), because momentum "
      "on top of their error feedback diverged (below).",
      "",
      "**Columns.** Test accuracy: mean over the seeds; spread: sample standard deviation and "
      "min–max. Bytes: what one worker sends per step (`mean_bytes_on_wire` of the run, averaged "
      "over its steps, so `local_steps` counts its silent steps); largest step: the most one worker sent "
      "in one step of the run (`peak_bytes_on_wire`, the largest of the transport's per-step counts; the "
      "max over seeds); ratio: float32 bytes over the mean. "
      f"Encode+decode: million values per second on one {thr_size} float32 matrix (1024 columns) and, in "
      "brackets, that as a fraction of a float32 copy's speed measured side by side "
      "(`benchmarks.compressors`, with the zoo's settings, warm-ups ended). Step over link: median time of a whole "
      f"LeNet training step at {m.LINK_PROCESSES} processes, one worker each (the same total batch "
      f"{c.batch_size}), over an emulated {m.LINK_RATE} link (`benchmarks.train_step_link`, with "
      "the row's settings and optimizer, warm-ups (DGC, 1-bit Adam) ended before the timed steps; "
      "for `local_steps` with k = 2 the median of an even number of steps is the mean of a silent "
      "and an exchanging step); speedup: float's step time over the row's. A cell that says "
      "*not measured* has no measurement in the committed files.",
      "",
  ]
  lines += _plot_line(drawn, out, "accuracy against bytes")
  lines += table(zoo, rs) + [""]
  lines += _weak_runs(zoo)
  lines += _findings(zoo, plot_path, out)
  lines += _provenance(zoo, rs, thr_doc, link_doc)
  return lines


def _language_section(zoo: Zoo, out: str, plot_path: str) -> list[str]:
  """The language-model zoo (``configs/zoo_gpt.py``): its run, corpus, table and plot."""
  m, c = zoo.module, zoo.base
  rs, measured, steps, seeds = _section_facts(zoo)
  one = next(iter(_summaries(zoo).values()), [{}])[0]  # the corpus and model, as a run recorded them
  link_doc = _load(zoo.link_json)
  mk = c.model_kwargs
  drawn = plot(rs, plot_path, f"GPT ({one.get('parameters', 0):,} parameters), {c.dataset}, {c.workers} workers, "
               f"{'/'.join(map(str, steps))} steps", zoo.metric,
               (one["unigram_held_out_bits_per_byte"], "unigram entropy of the held-out bytes")
               if "corpus" in one else None)
  corpus = (f"{one['corpus']} ({one['corpus_license']}; {one['train_bytes']:,} bytes to train on, "
            f"{one['test_bytes']:,} held out)" if "corpus" in one else f"`{c.dataset}`")
  unigram = (f" The baseline to beat: the unigram entropy of the held-out bytes, "
             f"{one['unigram_held_out_bits_per_byte']:.3f} bits per byte." if "corpus" in one else "")
  lines = [
      "## A language model: every compressor and DiLoCo on a small GPT", "",
      f"**The run.** A decoder-only GPT (`jaxcomp/models/gpt.py`: pre-LayerNorm, causal attention, tied "
      f"embeddings) of {one.get('parameters', 0):,} parameters (context {mk.context}, width {mk.width}, "
      f"{mk.depth} blocks of {mk.heads} heads) on {corpus}. {c.workers} simulated workers, total batch "
      f"{c.batch_size} windows of {c.seq_len} bytes, AdamW (LR {c.learning_rate:g}, β2 {c.adam_b2}, "
      f"decoupled weight decay {c.weight_decay} on the matrices), {c.lr_warmup_steps} warm-up steps then "
      f"cosine decay to {c.lr_end:g}, gradients clipped to global norm {c.grad_clip_norm:g}; the same "
      f"{'/'.join(map(str, steps)) or c.num_train_steps} steps and seeds {', '.join(map(str, seeds))} for "
      f"every row (`configs/zoo_gpt.py`, the recipe of `configs/gpt_text.py:runlocal`). Bits per byte: "
      f"the loss on {c.eval_windows:,} held-out windows, in bits per byte.{unigram}", "",
      "**Reduced scale.** A smaller model and a shorter run than `configs/gpt_text.py:runlocal`'s "
      "(see `configs/zoo_gpt.py`), so that the whole table fits in about an hour and a half of a 2-core "
      "CPU machine; each run is its own process (`experiments.sweep`): "
      + _timing_text(measured) + " The values rank the methods after a short run; they are not "
      "converged, and methods that start slowly (warm-ups, long local periods) are at a disadvantage "
      "here that a full run would not show.", "",
      "**One rule for every row.** Every tensor goes through the compressor, with the vision table's "
      "settings (its papers'; `min_size` where a paper keeps small tensors in float), and AdamW after "
      "the exchange, for every row: the vision table's per-row optimizers were chosen for momentum SGD on "
      "LeNet. The exception is 1-bit Adam, which is the optimizer: Adam's own ε (1e-8) and the recipe's "
      "β2, plain SGD after it applying the schedule, no clipping after it. DiLoCo's rows run AdamW as the "
      "inner optimizer for H steps without communication, then exchange the pseudo-gradient (float32, "
      "or 8-bit with error feedback) and apply it with Nesterov SGD (LR 0.7, momentum 0.9). A labelled row "
      "(`<row>.<label>`) changes one setting of a weak row: the change that learned best in its diagnosis "
      "runs (below).", "",
      "**Columns.** Bits per byte: mean over the seeds (lower is better); spread: sample standard "
      "deviation and min–max. Bytes: what one worker sends per step, averaged over the run's steps, so "
      "`local_steps` and DiLoCo count their silent steps; largest step: the most one worker sent in one "
      "step of the run (`peak_bytes_on_wire`; Streaming DiLoCo's fragments lower it, not the mean); ratio: "
      "float32 bytes over the mean. Step over link: "
      f"the mean of {m.LINK_TIMED_STEPS} whole training steps at {m.LINK_PROCESSES} processes, one worker "
      f"each (the same total batch), over an emulated {m.LINK_RATE} link (`benchmarks.train_step_link`, "
      "warm-ups ended before the timed steps): a mean rather than a median, over whole DiLoCo periods, "
      "so that one exchanging step in H counts as it does in a run; speedup: float's time over the row's.",
      "",
  ]
  lines += _plot_line(drawn, out, "bits per byte against bytes")
  lines += table(zoo, rs) + [""]
  lines += _weak_runs(zoo)
  studies = zoo.studies()
  float_bpb = next((r["acc"]["mean"] for r in rs if r["name"] == "none" and r["acc"]), None)
  if "diagnose" in studies:
    lines += _language_findings(zoo, studies["diagnose"], plot_path, out, float_bpb)
  if "diloco" in studies:
    lines += _diloco_study(zoo, studies["diloco"], plot_path, out, float_bpb,
                           one.get("unigram_held_out_bits_per_byte"))
  lines += _claims(zoo, rs)
  lines += _provenance(zoo, rs, None, link_doc, heading="###")
  return lines


def claim_text(text: str, rs: list[dict]) -> str:
  """A claim's text with the table's figures filled in: ``{bpb:<row>}`` (mean over the seeds),
  ``{bytes:<row>}`` and ``{peak:<row>}`` (a worker's mean and largest step) and ``{ratio:<row>}``
  (float32 bytes over the mean)."""
  cells = {r["name"]: r["acc"] for r in rs if r["acc"]}
  return fill_figures(text, cells, {"bpb": lambda a: f"{a['mean']:.3f}", "bytes": lambda a: _fmt_bytes(a["bytes"]),
                                    "peak": lambda a: _fmt_bytes(a["peak"]) if a["peak"] is not None else NOT_MEASURED,
                                    "ratio": lambda a: f"{a['ratio']:.0f}×"})


def _claims(zoo: Zoo, rs: list[dict]) -> list[str]:
  """The rows set against their papers' claims (the config's ``CLAIMS``), figures from the table."""
  claims = getattr(zoo.module, "CLAIMS", {})
  if not claims:
    return []
  return (["### Against the papers' claims", ""]
          + [f"* **{title}** {claim_text(text, rs)}" for title, text in claims.items()] + [""])


def _mean_of(train: list[dict], key: str, last: int = 0) -> float:
  """The mean of ``key`` over the train rows (the last ``last`` of them, if set)."""
  rows = train[-last:] if last else train
  return statistics.mean(t[key] for t in rows)


def fill_figures(text: str, runs: dict[str, dict], figures: dict[str, Any]) -> str:
  """``text`` with each ``{<figure>:<run>}`` replaced by ``figures[<figure>](runs[<run>])``, a string;
  "not measured" where the run is missing."""
  import re  # pylint: disable=g-import-not-at-top
  pattern = r"\{(" + "|".join(map(re.escape, figures)) + r"):([^}]+)\}"
  return re.sub(pattern, lambda m: figures[m.group(1)](runs[m.group(2)]) if m.group(2) in runs else NOT_MEASURED,
                text)


def _bits(run: dict) -> str:
  return f"{run['summary']['test_bits_per_byte']:.3f}"


def finding_text(text: str, runs: dict[str, dict]) -> str:
  """A finding's text with its figures filled in from the committed runs: ``{bpb:<row>/<label>}``
  (held-out bits per byte), ``{upd:<row>/<label>}`` (mean ‖update‖ over the run) and
  ``{res:<row>/<label>}`` (‖residual‖ at the end)."""
  return fill_figures(text, runs, {"bpb": _bits, "upd": lambda r: f"{_mean_of(r['train'], 'update_norm'):.3g}",
                                   "res": lambda r: f"{r['train'][-1]['residual_norm']:.3g}"})


def _language_findings(zoo: Zoo, diag: Zoo, plot_path: str, out: str, float_bpb: Optional[float]) -> list[str]:
  """The weak rows' causes, measured (``configs/zoo_gpt.py:diagnose``): each finding, the diagnosis
  runs' table and their norms against float, and whether each labelled row uses the best change."""
  runs = _study_runs(diag)
  found = {n: r["finding"] for n, r in zoo.module.SETTINGS.items() if "finding" in r}
  lines = ["### Weak rows: the cause, measured", "",
           "Each weak row ran again with every step's norms logged (`config.log_norms`; "
           f"`configs/zoo_gpt.py:diagnose`, seed 0, files under `{diag.runs_dir}/`): as the table runs it "
           "(`paper`) and with one piece changed (the compressor's setting, or the peak and end learning "
           "rate of the AdamW after the exchange), beside float (`none/paper`). A labelled row "
           "(`<row>.<label>`, 3 seeds, in the table above) takes the change that learned best.", ""]
  lines += [f"* `{n}`: {finding_text(text, runs)}" for n, text in found.items()] + ([""] if found else [])
  if not runs:
    return lines + ["(No diagnosis run has finished yet.)", ""]
  drawn = _diagnosis_plot(runs, plot_path.replace(".png", "_diagnosis.png"))
  if drawn:
    rel = os.path.relpath(os.path.abspath(drawn), os.path.dirname(os.path.abspath(out)))
    lines += [f"![norms of the diagnosis runs]({rel})", ""]
  ref = runs.get("none/paper")
  ref_upd = _mean_of(ref["train"], "update_norm") if ref else None
  lines += ["| run | change | held-out bits per byte | final training loss | mean ‖update‖ (× float's) | "
            "‖residual‖ at the end |", "|---|---|---:|---:|---:|---:|"]
  for name, r in runs.items():
    s, train = r["summary"], r["train"]
    upd = _mean_of(train, "update_norm")
    ratio = f" ({upd / ref_upd:.2f}×)" if ref_upd else ""
    change = name.split("/")[1]
    lines.append(f"| `{name}` | {change if change != 'paper' else 'as the table runs it'} | "
                 f"{s['test_bits_per_byte']:.3f} | {s['final_train_loss']:.3f} | {upd:.3g}{ratio} | "
                 f"{train[-1]['residual_norm']:.3g} |")
  lines += ["", "‖update‖: what the optimizer applied to the parameters, per step (mean over the run); "
            "‖residual‖: a worker's error-feedback residual (with Signum and DGC it holds their momentum too)."
            + (f" Float's bits per byte over 3 seeds: {float_bpb:.3f}." if float_bpb else ""), ""]
  seeds = _summaries(zoo)
  for name, row in zoo.module.SETTINGS.items():
    if "diagnosis" not in row:
      continue
    owner, label = row["diagnosis"].split("/")
    done = {n: r["summary"]["test_bits_per_byte"] for n, r in runs.items() if n.split("/")[0] == owner}
    if not done:
      continue
    best = min(done, key=done.get)
    agree = ("the diagnosis run it takes is the row's best" if best == row["diagnosis"] else
             f"**the row's best diagnosis run is `{best}`, not `{row['diagnosis']}`: update the row**")
    lines.append(f"* `{name}` takes `{row['diagnosis']}`: {agree}." + _learns(seeds.get(name, []), float_bpb))
  return lines + [""]


def _learns(summaries: list[dict], float_bpb: Optional[float], within: float = 0.3) -> str:
  """Whether a labelled row learns on every seed (below the unigram entropy) and how far from float."""
  if not summaries:
    return " Its seeds have not run yet."
  bits = [s["test_bits_per_byte"] for s in summaries]
  below = sum(b < s["unigram_held_out_bits_per_byte"] for b, s in zip(bits, summaries))
  mean = statistics.mean(bits)
  gap = "" if float_bpb is None else (f", {mean - float_bpb:.3f} above float's"
                                       + (f" (within {within:g})" if mean - float_bpb <= within else
                                          f" (not within {within:g})"))
  return (f" Over its {len(bits)} seeds: {mean:.3f} bits per byte, {below} of {len(bits)} below the unigram "
          f"entropy{gap}.")


def _diloco_study(zoo: Zoo, study: Zoo, plot_path: str, out: str, float_bpb: Optional[float],
                  unigram: Optional[float]) -> list[str]:
  """DiLoCo's H x outer learning rate (``configs/zoo_gpt.py:diloco``): a table, bits per byte against
  bytes, and the outer steps' norms."""
  m = zoo.module
  runs = _study_runs(study)
  diag = zoo.studies().get("diagnose")
  float_run = _study_runs(diag).get("none/paper") if diag else None
  lines = ["### DiLoCo: H and the outer learning rate", "",
           f"One seed (0), float32 pseudo-gradients, outer Nesterov momentum 0.9, the zoo's GPT and "
           f"recipe (`configs/zoo_gpt.py:diloco`, every step logged, files under `{study.runs_dir}/`); "
           "*average*: outer SGD at LR 1 without momentum, the plain average of the workers' parameters. "
           "Held-out bits per byte (the best of each H in bold) and, in parentheses, the shared parameters' path: "
           "Σ ‖outer update‖ over the run"
           + (f" (float AdamW's, Σ ‖update‖: {path_length(float_run):.0f}, `none/paper` of the diagnosis)"
              if float_run else "") + ":", ""]
  lrs = list(m.DILOCO_OUTER_LR)
  lines += ["| H | bytes / worker / step | " + " | ".join(f"outer LR {lr:g}" for lr in lrs)
            + " | average |", "|---:|---:|" + "---:|" * (len(lrs) + 1)]
  for h in m.DILOCO_H:
    names = [f"h{h}/outer_lr={lr}" for lr in lrs] + [f"h{h}/average"]
    done = {n: runs[n]["summary"] for n in names if n in runs}
    if not done:
      continue
    best = min(done, key=lambda n: done[n]["test_bits_per_byte"])
    cells = [("**{:.3f}**" if n == best else "{:.3f}").format(done[n]["test_bits_per_byte"])
             + f" ({path_length(runs[n]):.0f})" if n in done
             else ("—" if n.endswith("average") and h not in m.DILOCO_AVERAGE_H else NOT_MEASURED) for n in names]
    wire = _fmt_bytes(statistics.mean(s["mean_bytes_on_wire"] for s in done.values()))
    lines.append(f"| {h} | {wire} | " + " | ".join(cells) + " |")
  lines.append("")
  found = m.DILOCO_FINDING if hasattr(m, "DILOCO_FINDING") else ""
  if found:
    lines += [diloco_finding_text(found, {**({"none/paper": float_run} if float_run else {}), **runs}), ""]
  if runs:
    drawn = _diloco_plot(runs, plot_path.replace(".png", "_diloco.png"), float_bpb, unigram)
    rel = os.path.relpath(os.path.abspath(drawn), os.path.dirname(os.path.abspath(out)))
    lines += [f"![DiLoCo: bits per byte against bytes, and the outer steps' norms]({rel})", ""]
  return lines


def outer_norms(train: list[dict]) -> list[dict]:
  """The train rows of a DiLoCo run's outer steps (those with a pseudo-gradient: ``jaxcomp.diloco``'s
  norms are 0 on the silent steps)."""
  return [t for t in train if t.get("diloco_outer_grad_norm", 0.0) > 0]


def path_length(run: dict) -> float:
  """How far a run moved its (shared) parameters: Σ ‖update‖ over its steps (DiLoCo: over its outer
  steps, Σ ‖outer update‖; a run that logged no norms: 0)."""
  outer = outer_norms(run["train"])
  if outer:
    return sum(t["diloco_outer_update_norm"] for t in outer)
  return sum(t.get("update_norm", 0.0) for t in run["train"])


def diloco_finding_text(text: str, runs: dict[str, dict]) -> str:
  """``text`` with ``{bpb:<run>}`` (bits per byte), ``{path:<run>}`` (:func:`path_length`),
  ``{grad:<run>}`` (mean ‖mean Δ‖ over the outer steps), ``{mom:<run>}`` (mean ‖outer momentum‖ over
  them) and ``{amp:<run>}`` (mean ‖outer update‖ over mean ‖mean Δ‖) of the committed runs."""

  def mean(run, key):
    return statistics.mean(t[key] for t in outer_norms(run["train"]))

  return fill_figures(text, runs, {
      "bpb": _bits, "path": lambda r: f"{path_length(r):.0f}",
      "grad": lambda r: f"{mean(r, 'diloco_outer_grad_norm'):.3g}",
      "mom": lambda r: f"{mean(r, 'diloco_outer_state_norm'):.3g}",
      "amp": lambda r: f"{mean(r, 'diloco_outer_update_norm') / mean(r, 'diloco_outer_grad_norm'):.2g}"})


def _diloco_plot(runs: dict[str, dict], path: str, float_bpb: Optional[float], unigram: Optional[float]) -> str:
  """Left: bits per byte against bytes per worker per step, a line per outer LR through H.
  Right: ‖mean Δ‖ and ‖outer momentum‖ at every outer step of H = 10 and 50 (LR 0.7, and the
  best LR of H = 10)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5))
  series: dict[str, list[tuple[float, float, str]]] = {}
  for name, r in runs.items():
    h, setting = name.split("/")
    s = r["summary"]
    series.setdefault(setting, []).append((s["mean_bytes_on_wire"], s["test_bits_per_byte"], h[1:]))
  for k, (setting, pts) in enumerate(sorted(series.items())):
    pts.sort()
    style = dict(ls="--", marker="s") if setting == "average" else dict(marker="o")
    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=f"C{k}", label=setting.replace("_", " "), **style)
    for x, y, h in pts:
      ax.annotate(f"H={h}", (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7, color=f"C{k}")
  for value, label in ((float_bpb, "float (3 seeds)"), (unigram, "unigram entropy")):
    if value:
      ax.axhline(value, ls=":", lw=1, color="grey")
      ax.annotate(label, (0.01, value), xycoords=("axes fraction", "data"), textcoords="offset points",
                  xytext=(0, 3), fontsize=8, color="grey")
  ax.set_xscale("log")
  ax.set_xlabel("bytes on the wire per worker per step (log)")
  ax.set_ylabel("held-out bits per byte (seed 0)")
  ax.set_title("DiLoCo: H x outer learning rate (Nesterov 0.9)", fontsize=10)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)
  h10 = {n: runs[n]["summary"]["test_bits_per_byte"] for n in runs if n.startswith("h10/outer_lr=")}
  shown = ["h10/outer_lr=0.7", "h50/outer_lr=0.7"] + ([min(h10, key=h10.get)] if h10 else [])
  for color, name in zip(("black", "tab:brown", "tab:cyan"), dict.fromkeys(n for n in shown if n in runs)):
    outer = outer_norms(runs[name]["train"])  # colours of their own: the left panel's are outer LRs
    steps = [t["step"] for t in outer]
    bx.plot(steps, [t["diloco_outer_grad_norm"] for t in outer], color=color, marker=".",
            label=f"{name}: ‖mean Δ‖")
    bx.plot(steps, [t["diloco_outer_state_norm"] for t in outer], color=color, ls="--",
            label=f"{name}: ‖outer momentum‖")
  bx.set_yscale("log")
  bx.set_xlabel("step (outer steps only)")
  bx.set_title("per outer step: the averaged pseudo-gradient and the outer momentum", fontsize=10)
  bx.grid(alpha=0.3, which="both")
  bx.legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _study_runs(study: Zoo) -> dict[str, dict]:
  """``<row>/<label>`` -> its summary and train rows (``metrics.csv``), for the finished runs of a study."""
  from experiments import plots  # pylint: disable=g-import-not-at-top  (matplotlib: only for reports)
  out = {}
  for name, _ in study.module.get_sweep(study.arg or None):
    d = os.path.join(study.runs_dir, name)
    summary = _load(os.path.join(d, "summary.json"))
    if summary is not None:
      out[name] = {"summary": summary, "train": plots.read_metrics(d)["train"]}
  return out


def _findings(zoo: Zoo, plot_path: str, out: str) -> list[str]:
  """The rows changed by a measured finding: the finding, its diagnosis runs (table, plot) and sweeps."""
  found = {n: r["finding"] for n, r in zoo.module.SETTINGS.items() if "finding" in r}
  studies = zoo.studies()
  if not found or not studies:
    return []
  diag, tune = studies["diagnose"], studies["tune"]
  runs = _study_runs(diag)
  lines = ["## Rows that did not learn at first: the cause, measured", "",
           "Each finding comes from runs that log every step's norms (`config.log_norms`; "
           f"`configs/zoo.py:diagnose`, seed 0, files under `{diag.runs_dir}/`): the row with the "
           "settings it first had and with the change, beside float.", ""]
  lines += [f"* `{n}`: {text}" for n, text in found.items()] + [""]
  if runs:
    drawn = _diagnosis_plot(runs, plot_path.replace(".png", "_diagnosis.png"))
    if drawn:
      rel = os.path.relpath(os.path.abspath(drawn), os.path.dirname(os.path.abspath(out)))
      lines += [f"![norms of the diagnosis runs]({rel})", ""]
    lines += ["| run | optimizer | test accuracy (%) | final training loss | largest ‖update‖ (step) | "
              "‖residual‖ at the end |", "|---|---|---:|---:|---:|---:|"]
    for name, r in runs.items():
      s, train = r["summary"], r["train"]
      top = max(train, key=lambda t: t["update_norm"])
      lines.append(f"| `{name}` | {s['optimizer']}, LR {s['learning_rate']:g} | {100 * s['test_accuracy']:.2f} | "
                   f"{s['final_train_loss']:.3g} | {top['update_norm']:.3g} ({top['step']:.0f}) | "
                   f"{train[-1]['residual_norm']:.3g} |")
    lines.append("")
  lines += _tuning(tune)
  return lines


def _tuning(tune: Zoo, within: float = 5.0) -> list[str]:
  """Each labelled row's sweep: accuracy per value, and the value the rule picks (the smallest
  within ``within`` points of the best) against the one ``configs/zoo.py`` uses."""
  runs = _study_runs(tune)
  lines = []
  for row, (key, values) in tune.module.TUNING.items():
    done = [(v, runs[f"{row}/{key}={v}"]["summary"]) for v in values if f"{row}/{key}={v}" in runs]
    if not done:
      continue
    best = max(100 * s["test_accuracy"] for _, s in done)
    pick = min(v for v, s in done if 100 * s["test_accuracy"] >= best - within)
    used = tune.module.SETTINGS[row]["kwargs"][key]
    cells = ", ".join(f"{key} = {v:g}: {100 * s['test_accuracy']:.2f}%" for v, s in done)
    agree = (f"`configs/zoo.py` uses {key} = {used:g}, as the rule picks" if used == pick else
             f"**`configs/zoo.py` uses {key} = {used:g}; the committed sweep picks {pick:g}: update the row**")
    lines += [f"**The sweep behind `{row}`** (seed 0, `configs/zoo.py:tune`, files under `{tune.runs_dir}/`): "
              f"{cells}. The rule: the smallest {key} within {within:g} points of the best; {agree}"
              + ("" if len(done) == len(values) else f" ({len(values) - len(done)} of the sweep's runs missing)")
              + ".", ""]
  return lines


def _diagnosis_plot(runs: dict[str, dict], path: str) -> Optional[str]:
  """‖update‖ (top) and ‖residual‖ (bottom) against the step, one column per diagnosed row, float dashed."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = sorted({n.split("/")[0] for n in runs} - {"none"})
  if not rows:
    return None
  fig, axes = plt.subplots(2, len(rows), figsize=(4.5 * len(rows), 6.5), squeeze=False, sharex=True)
  for col, row in enumerate(rows):
    for name, r in runs.items():
      owner, label = name.split("/")
      if owner not in (row, "none"):
        continue
      steps = [t["step"] for t in r["train"]]
      style = dict(ls="--", lw=1, color="grey" if label == "momentum" else "black") if owner == "none" else {}
      axes[0, col].plot(steps, [t["update_norm"] for t in r["train"]], label=f"{owner}, {label}", **style)
      if owner != "none":
        axes[1, col].plot(steps, [t["residual_norm"] for t in r["train"]], label=f"{owner}, {label}")
    axes[0, col].set_title(row, fontsize=10)
    for ax, what in zip(axes[:, col], ("‖update‖", "‖error-feedback residual‖")):
      ax.set_yscale("log")
      ax.set_ylabel(what)
      ax.grid(alpha=0.3, which="both")
      ax.legend(fontsize=7)
    axes[1, col].set_xlabel("step")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _weak_runs(zoo: Zoo, below: float = 0.5) -> list[str]:
  """A line per run that ended below ``below`` test accuracy (a language model: at or above the
  held-out bytes' unigram entropy, so learning no more than byte frequencies), with its final
  losses, so the table's weak cells and wide spreads are read for what they are."""
  text = zoo.metric.key == "test_bits_per_byte"
  out = []
  for name, summaries in _summaries(zoo).items():
    for s in summaries:
      if text and not s[zoo.metric.key] < s["unigram_held_out_bits_per_byte"]:
        out.append(f"`{name}` seed {s['seed']}: {s[zoo.metric.key]:.3f} bits per byte (unigram "
                   f"{s['unigram_held_out_bits_per_byte']:.3f}), final training loss {s['final_train_loss']:.3f}")
      elif not text and s["test_accuracy"] < below:
        out.append(f"`{name}` seed {s['seed']}: {100 * s['test_accuracy']:.2f}% (chance is 10%), final "
                   f"training loss {s['final_train_loss']:.3f}, test loss {s['test_loss']:.3f}")
  if not out:
    return []
  if text:
    return ["**Runs that ended no better than the unigram entropy** (part of the means above, not left "
            "out): " + "; ".join(out) + ". At these settings and this short run they learn no more than "
            "the bytes' frequencies; the settings are their papers', not tuned for this model.", ""]
  return [f"**Runs that ended below {below:.0%} test accuracy** (part of the means above, not left "
          "out): " + "; ".join(out) + ". At these settings and this short run they learn slowly "
          "or not at all; the settings are their papers', not tuned for LeNet here.", ""]


def _timing_text(measured: list[dict]) -> str:
  """The runs' measured in-process and training times (from their summaries)."""
  if not measured:
    return "no run has finished yet."
  n = sum(r["acc"]["seeds"] for r in measured)
  wall = sum(r["acc"]["wall_s"] * r["acc"]["seeds"] for r in measured)
  train = sum(r["acc"]["train_s"] * r["acc"]["seeds"] for r in measured)
  return (f"the {n} runs here spent {wall / n:.0f} s each on average in their training loop "
          f"(`wall_time_sec`: steps with compilation, and the evaluation; {train / n:.0f} s of it in "
          f"training steps), {wall / 60:.0f} min in all, plus each process's start-up (imports, "
          "loading the data), on a machine shared with other jobs.")


def _provenance(zoo: Zoo, rs: list[dict], thr_doc, link_doc, heading: str = "##") -> list[str]:
  out = [f"{heading} Where the numbers come from", ""]
  missing = [r["name"] for r in rs if not r["acc"]]
  configured = zoo.seeds_per_name()
  partial = [f"{r['name']} ({r['acc']['seeds']} of {configured.get(r['name'], 0)})" for r in rs
             if r["acc"] and r["acc"]["seeds"] < configured.get(r["name"], 0)]
  out.append(f"* {zoo.metric.name} and bytes: `{zoo.runs_dir}/<compressor>/seed<S>/summary.json` (each run's "
             "`command.txt` reruns it). " + (f"Not run yet: {', '.join(missing)}. " if missing else "")
             + (f"Fewer seeds than configured: {', '.join(partial)}." if partial else ""))
  if not zoo.module.THROUGHPUT_SIZE:
    pass  # this zoo times no throughput
  elif thr_doc:
    out.append(f"* Throughput: `{zoo.throughput_json}` ({thr_doc['machine']}, JAX {thr_doc['jax']}, "
               f"median of {thr_doc['repeats']} repeats).")
  else:
    out.append(f"* Throughput: not measured yet (`python -m experiments.zoo --steps throughput,report` on an "
               "idle machine).")
  if link_doc:
    out.append(f"* Link step times: `{zoo.link_json}` ({link_doc['processes']} processes, "
               f"{link_doc['link']}, {link_doc.get('steps', '?')} timed steps each, {link_doc.get('machine', '')}).")
  else:
    out.append("* Link step times: not measured yet (`sudo .venv/bin/python -m experiments.zoo --steps "
               "link,report` on an idle machine; needs root and iproute2).")
  out += ["", f"To rerun one cell by hand: `python -m experiments.train --config {zoo.config_arg} --workdir DIR "
          "--config.compressor=NAME --config.compressor_kwargs='{...}' --config.seed=S` with the row's "
          "settings (non-kwarg settings such as `min_size` or `optimizer` as `--config.KEY=VALUE`).", ""]
  return out


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
