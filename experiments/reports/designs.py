"""Helpers for experiments that compare designs (compressors) against a float baseline.

Used by the 3LC and QSGD renderers: whether runs are at the paper's scale or
reduced (and how), the accuracy table with the paper's numbers beside ours,
and wire sizes per value, all read from the runs' ``config.json``,
``summary.json`` and ``metrics.csv``.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Callable, Optional

from experiments import plots
from experiments.reports.common import fmt_time, pct, rel_link


def model_label(config: dict[str, Any]) -> str:
  """``"ResNet-8"`` etc. from a config dict (``model`` and ``model_kwargs``)."""
  model = config["model"]
  depth = (config.get("model_kwargs") or {}).get("depth")
  if model.startswith("resnet"):
    return f"ResNet-{depth or model[len('resnet'):]}"
  return model


def scale_differences(config: dict[str, Any], paper_config: Any) -> list[tuple[str, str, str]]:
  """``(what, ours, paper's)`` for each setting where a run's config differs from the paper config."""
  out = []
  checks: list[tuple[str, Callable[[Any], Any]]] = [
      ("dataset", lambda c: c["dataset"]),
      ("model", model_label),
      ("steps", lambda c: f"{c['num_train_steps']:,}"),
      ("workers x batch", lambda c: f"{c['workers']} x {c['batch_size'] // c['workers']}"),
      ("LR warm-up steps", lambda c: f"{c['lr_warmup_steps']:,}"),
  ]
  paper = paper_config.to_dict()
  for what, get in checks:
    ours, theirs = get(config), get(paper)
    if ours != theirs:
      out.append((what, str(ours), str(theirs)))
  return out


def finished(runs: dict[str, dict], names) -> dict[str, dict[str, Any]]:
  """``{name: summary}`` of the finished runs among ``names``."""
  return {n: runs[n]["summary"] for n in names if n in runs and runs[n]["summary"]}


def scale_lines(runs: dict[str, dict], paper_config: Any, planned: int) -> list[str]:
  """Markdown lines: full or reduced scale (what differs from the paper), seeds, steps, time.

  ``planned`` is the number of runs in the experiment's grid (``runs`` holds only those
  with a directory on disk).
  """
  done = [r for r in runs.values() if r["summary"]]
  if not done:
    return ["No run has finished.", ""]
  diffs = sorted({d for r in done for d in scale_differences(r["config"], paper_config)})
  lines = []
  if diffs:
    lines.append("**Scale: REDUCED** — " + "; ".join(f"{w}: {o} (paper: {p})" for w, o, p in diffs) + ".")
  else:
    lines.append("**Scale: full** (the paper's dataset, model, steps and workers).")
  s = [r["summary"] for r in done]
  step_time = statistics.mean(1.0 / x["steps_per_sec"] for x in s if x.get("steps_per_sec"))
  steps = ", ".join(f"{n:,}" for n in sorted({x["steps"] for x in s}))
  seeds = ", ".join(str(n) for n in sorted({x["seed"] for x in s}))
  tests = ", ".join(f"{n:,.0f}" for n in sorted({x["test_examples"] for x in s if x.get("test_examples")}))
  lines.append(
      f"Runs finished: {len(done)} of {planned}; steps: {steps}; seeds: {seeds} (one run per "
      f"design); test images: {tests}; total wall time {fmt_time(sum(x['wall_time_sec'] for x in s))}, "
      f"{step_time:.2f} s per training step on average (2 shared vCPUs, simulated workers; "
      f"other jobs may have run beside them).")
  lines.append("")
  return lines


def bits_per_value(summary: dict[str, Any], key: str = "mean_bytes_on_wire") -> Optional[float]:
  """Bits per gradient value per worker per step, averaged over the run (all tensors)."""
  if summary.get(key) is None or not summary.get("float32_bytes"):
    return None
  return 8 * summary[key] / (summary["float32_bytes"] / 4)


def train_rows(workdir: str) -> list[dict[str, float]]:
  """The run's train rows of ``metrics.csv``, each with ``steps``: the steps it averages."""
  rows = plots.read_metrics(workdir)["train"]
  prev = 0
  for r in rows:
    r["steps"] = r["step"] - prev
    prev = r["step"]
  return [r for r in rows if r["steps"] > 0]


def weighted_mean(rows: list[dict[str, float]], fn: Callable[[dict[str, float]], float]) -> float:
  """Mean of ``fn(row)`` over training steps (rows weighted by the steps they average)."""
  total = sum(r["steps"] for r in rows)
  return sum(fn(r) * r["steps"] for r in rows) / total


def accuracy_table(designs: dict[str, tuple[str, Any]], paper_acc: dict[str, Optional[float]],
                   summaries: dict[str, dict[str, Any]], baseline: str,
                   extra: list[tuple[str, Callable[[str, dict], str]]] = ()) -> list[str]:
  """The paper's accuracy and Δ vs the baseline beside ours, one row per design.

  Columns: design, paper accuracy, paper Δ, our accuracy, our Δ, our Δ minus
  the paper's Δ, the ``extra`` columns (``(header, fn(name, summary) -> cell)``),
  steps, seed, wall time. Missing runs or numbers are "—".
  """
  header = ["design", "paper: test acc. (%)", "paper: Δ vs float (pp)", "ours: test acc. (%)",
            "ours: Δ vs float (pp)", "difference of Δs (pp)"] + [h for h, _ in extra] + [
                "steps", "seed", "wall time"]
  lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
  p_base = paper_acc.get(baseline)
  o_base = summaries.get(baseline, {}).get("test_accuracy")
  for name, (label, _) in designs.items():
    p = paper_acc.get(name)
    s = summaries.get(name)
    o = s.get("test_accuracy") if s else None
    p_d = (p - p_base) if (p is not None and p_base is not None and name != baseline) else None
    o_d = 100 * (o - o_base) if (o is not None and o_base is not None and name != baseline) else None
    cells = [label, "—" if p is None else f"{p:.2f}", "—" if p_d is None else f"{p_d:+.2f}", pct(o),
             "—" if o_d is None else f"{o_d:+.2f}",
             "—" if (o_d is None or p_d is None) else f"{o_d - p_d:+.2f}"]
    cells += [fn(name, s) if s else "—" for _, fn in extra]
    cells += [f"{s['steps']:,}" if s else "—", str(s["seed"]) if s else "—",
              fmt_time(s["wall_time_sec"]) if s else "—"]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  return lines


def design_section(cfg: Any, dataset: str, runs: dict[str, dict], extra, curve_names, png_name: str,
                   title: str, out_path: str, img_dir: str) -> list[str]:
  """One dataset's section: scale, :func:`accuracy_table` of ``cfg.DESIGNS``, training curves.

  ``cfg`` is the experiment's config module (``DESIGNS``, ``PAPER["accuracy"]``,
  ``get_config()`` at the paper's scale; the baseline design is ``"float32"``);
  ``curve_names`` the designs whose curves are plotted.
  """
  lines = [f"### {dataset}", ""]
  lines += scale_lines(runs, cfg.get_config(), len(cfg.DESIGNS))
  summaries = finished(runs, cfg.DESIGNS)
  lines += accuracy_table(cfg.DESIGNS, cfg.PAPER["accuracy"], summaries, "float32", extra)
  curves = [(cfg.DESIGNS[n][0], runs[n]["workdir"]) for n in curve_names if n in summaries]
  if curves:
    os.makedirs(img_dir, exist_ok=True)
    png = os.path.join(img_dir, png_name)
    plots.convergence_plot(curves, png, title=title, smooth=3)
    lines += [f"![{title}]({rel_link(png, out_path)})", ""]
  return lines


def finish_plot(fig, ax, path: str, title: str, xlabel: str, ylabel: str, legend_size=None) -> None:
  """Labels, grid, legend and title; writes ``path`` and closes the figure."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=legend_size)
  ax.set_title(title, fontsize=10)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  plt.close(fig)
