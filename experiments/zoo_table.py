"""The zoo's table and plot: a row per compressor from its runs' summaries and the throughput and
link measurements (``python -m experiments.zoo``'s report, :mod:`experiments.zoo_report`).
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Optional

from experiments.zoo_spec import METRICS, NOT_MEASURED, Metric, Zoo, load


def run_summaries(zoo: Zoo) -> dict[str, list[dict]]:
  """compressor -> the summaries of its finished seeds."""
  out: dict[str, list[dict]] = {}
  if not os.path.isdir(zoo.runs_dir):
    return out
  for name in sorted(os.listdir(zoo.runs_dir)):
    d = os.path.join(zoo.runs_dir, name)
    for seed in sorted(os.listdir(d)) if os.path.isdir(d) else []:
      s = load(os.path.join(d, seed, "summary.json"))
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
  summaries = run_summaries(zoo)
  thr = {r["compressor"]: r for r in (load(zoo.throughput_json) or {}).get("results", [])}
  link_doc = load(zoo.link_json) or {}
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


def size_label(n: int) -> str:
  from experiments import throughput  # pylint: disable=g-import-not-at-top
  return throughput.size_label(n) if n >= 2**20 else f"{n:,}-value"


def fmt_bytes(b: float) -> str:
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
    wire = fmt_bytes(r["acc"]["bytes"]) if r["acc"] else NOT_MEASURED
    peak = fmt_bytes(r["acc"]["peak"]) if r["acc"] and r["acc"]["peak"] is not None else NOT_MEASURED
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
