"""Training over emulated links in the report: 3LC-T1's speedup columns (``configs/threelc_link.py``).

Every run is one design over one link, in 4 processes
(``runs/3LC-T1-link/<dataset>/<link>_<design>``). From its ``metrics.csv``:
``train_time`` (seconds in training steps; evaluations and the compiling
first step excluded) at the last step, and at the first evaluation whose test
accuracy reaches the config's target (time to accuracy). Speedups are float's
time over the design's at the same link. The paper's speedups come from
``configs/threelc_link.PAPER``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from experiments import plots
from experiments.reports import designs as D
from experiments.reports.common import rel_link


def _cfg():
  from configs import threelc_link as cfg  # pylint: disable=g-import-not-at-top

  return cfg


def times(workdir: str, target: float) -> dict[str, Optional[float]]:
  """``train_time`` at the end, at the first test row reaching ``target``, and per step."""
  rows = plots.read_metrics(workdir)
  train, test = rows["train"], rows["test"]
  end = train[-1]["train_time"] if train and "train_time" in train[-1] else None
  reached = next((r for r in test if r["accuracy"] >= target), None)
  return {"train_time": end,
          "to_target": reached["train_time"] if reached else None,
          "target_step": reached["step"] if reached else None,
          "per_step": end / max(train[-1]["step"] - 1, 1) if end is not None else None}


def _ratio(a: Optional[float], b: Optional[float]) -> str:
  return f"{a / b:.2f}x" if a is not None and b else "—"


def _seconds(t: Optional[float]) -> str:
  return "not reached" if t is None else f"{t:.0f} s"


def link_table(cfg: Any, runs: dict[str, dict], link: str, column: int) -> list[str]:
  """One link's rows: times, speedups over float, the paper's speedup, accuracy and bytes."""
  target = cfg.TARGET_ACCURACY
  base = runs.get(cfg.run_name(link, "float32"))
  base_t = times(base["workdir"], target) if base else {}
  lines = [f"**{link}**", "",
           f"| design | s / step | train time | speedup | time to {100 * target:.0f} % | speedup "
           "| paper speedup | test acc. (%) | bytes / worker / step | fallback rounds / step |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for name, (label, _) in cfg.designs(link).items():
    run = runs.get(cfg.run_name(link, name))
    paper = cfg.PAPER["speedup"].get(name.removesuffix("_two_phase"))
    paper_cell = f"{paper[column]:g}x" if paper else "—"
    if run is None:
      lines.append(f"| {label} | — | — | — | — | — | {paper_cell} | — | — | — |")
      continue
    s, t = run["summary"], times(run["workdir"], target)
    rows = D.train_rows(run["workdir"])
    fallbacks = (D.weighted_mean(rows, lambda r: r.get("zero_run_fallback_rounds", 0.0))
                 if rows and "zero_run_fallback_rounds" in rows[0] else None)
    lines.append(
        f"| {label} | {t['per_step']:.3f} | {_seconds(t['train_time'])} | "
        f"{_ratio(base_t.get('train_time'), t['train_time'])} | {_seconds(t['to_target'])} | "
        f"{_ratio(base_t.get('to_target'), t['to_target'])} | {paper_cell} | "
        f"{100 * s['test_accuracy']:.2f} | {s['mean_bytes_on_wire']:,.0f} | "
        f"{'—' if fallbacks is None else f'{fallbacks:.1f}'} |")
  return lines + [""]


def bucket_lines(cfg: Any, runs: dict[str, dict]) -> list[str]:
  """What the tbf bucket of the runs (``cfg.RUNS_TBF_BURST``) is worth at each link."""
  from experiments import netns  # pylint: disable=g-import-not-at-top

  worth = ", ".join(
      f"{cfg.RUNS_TBF_BURST[link] / 1024:.0f} KiB at {link} "
      f"({8e3 * cfg.RUNS_TBF_BURST[link] / netns.rate_bits_per_second(link):.1f} ms of wire)"
      for link in cfg.LINKS)
  sent = {name: _sent_per_step(runs[cfg.run_name(cfg.LINKS[0], name)]["summary"])
          for name in cfg.DESIGNS if cfg.run_name(cfg.LINKS[0], name) in runs}
  line = (f"**Link emulation.** A tbf lets its bucket pass at once, above the rate, after an idle "
          f"spell such as a step's computation; a NIC has no such bucket. These runs' bucket: {worth} "
          "(`experiments.netns.tbf_burst`: a smaller one cost throughput with 64 KB TCP segments).")
  if "float32" in sent and len(sent) > 1:
    slow, bucket = cfg.LINKS[0], cfg.RUNS_TBF_BURST[cfg.LINKS[0]]
    small = [v for k, v in sent.items() if k != "float32"]
    within = sum(v <= bucket for v in small)
    line += (f" Each process sends about {sent['float32'] / 1e3:.0f} KB a step for float's all-reduce "
             f"and {min(small) / 1e3:.0f}–{max(small) / 1e3:.0f} KB for the compressed designs' "
             f"all-gathers: {within} of the {len(small)} compressed designs send no more than the "
             f"bucket, so at {slow} their messages may pass without waiting for the rate after a "
             f"computing spell, while float waits for all but {bucket / 1e3:.0f} KB of its. The "
             f"speedups at {slow} are therefore larger than a link without a bucket would give.")
  return [line, ""]


def _sent_per_step(summary: dict) -> float:
  """Bytes one process sends a step: a ring all-reduce's 2(P−1)/P of float's, else (P−1) messages."""
  p = summary["processes"]
  if summary["compressor"] == "none":
    return 2 * (p - 1) / p * summary["float32_bytes"]
  return (p - 1) * summary["mean_bytes_on_wire"]


def render(runs_by_dataset, out_path: str, img_dir: str) -> list[str]:
  cfg = _cfg()
  lines = ["## 3LC-T1-link — time to accuracy over emulated links (3LC Table 1's speedups)", ""]
  lines += [
      f"Paper ({cfg.PAPER['source']}): the speedup of each design over 32-bit float at 10 Mbps, "
      "100 Mbps and 1 Gbps. Ours: every run measured whole over an emulated link, "
      f"{cfg.PROCESSES} processes (one worker each, `experiments.launch --link RATE`: one network "
      "namespace per process, a bridge, `tc` tbf at RATE both ways), the same "
      f"{cfg.STEPS} steps and seed for every design and link. *Train time*: seconds in training "
      "steps (evaluations and the compiling first step excluded); *time to "
      f"{100 * cfg.TARGET_ACCURACY:.0f} %*: the train time at the first evaluation (every "
      f"{cfg.EVAL_EVERY} steps) whose test accuracy reached the target, chosen before the runs "
      "and written in the config; *speedup*: float's time over the design's at the same link. "
      f"3LC sends its zero-run stream in a buffer of a fixed fraction of the base-3⁵ size (s = 1.00: "
      f"{cfg.CAPACITY[1.00]}, s = 1.75: {cfg.CAPACITY[1.75]}, chosen before the runs); a tensor whose "
      "stream did not fit on some worker is sent again in base-3⁵ (*fallback rounds*). At "
      f"{', '.join(cfg.TWO_PHASE_LINKS)} every compressed design runs a second time with the two-phase "
      "exchange (*two-phase* rows: compressed reduce-scatter, re-encode, all-gather, so pulls are "
      "compressed as in the paper; the others' all-gather compresses pushes only). TernGrad is this project's addition "
      "(the paper's nearest row, Stoch 3-value b-3-5, is TernGrad without clipping). The 4 "
      "processes share 2 CPU cores, so compute takes a far larger share of a step than on the "
      "paper's GPUs and every speedup is smaller.",
      ""]
  for dataset, runs in sorted(runs_by_dataset.items()):
    done = {k: v for k, v in runs.items() if v["summary"]}
    lines += [f"### {dataset}", ""]
    lines += scale_lines(cfg, done)
    lines += bucket_lines(cfg, done)
    for column, link in enumerate(cfg.LINKS):
      lines += link_table(cfg, done, link, column)
    png = os.path.join(img_dir, f"3lc_t1_link_{dataset}_accuracy_vs_time.png")
    if plot_accuracy_vs_time(cfg, done, png, dataset):
      title = f"3LC-T1-link on {dataset}: test accuracy against training time"
      lines += [f"![{title}]({rel_link(png, out_path)})", ""]
  return lines


def scale_lines(cfg: Any, done: dict[str, dict]) -> list[str]:
  """What differs from the paper's scale, and how many runs finished, with their total time."""
  if not done:
    return ["No run has finished.", ""]
  diffs = sorted({d for r in done.values() for d in D.scale_differences(r["config"], _paper_scale())})
  return [("**Scale: REDUCED** — " + "; ".join(f"{w}: {o} (paper: {p})" for w, o, p in diffs) + "."
           if diffs else "**Scale: full**."),
          f"Runs finished: {len(done)} of {len(cfg.get_sweep())}; seed 0; "
          f"{sum(r['summary']['wall_time_sec'] for r in done.values()) / 60:.0f} min of wall time in "
          f"all (process start-up and evaluations included), one run at a time.", ""]


def _paper_scale():
  from configs import threelc_resnet110  # pylint: disable=g-import-not-at-top

  return threelc_resnet110.get_config()


def plot_accuracy_vs_time(cfg: Any, runs: dict[str, dict], path: str, dataset: str) -> bool:
  """One panel per link: each design's test accuracy against its train time; the target dashed."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  if not runs:
    return False
  fig, axes = plt.subplots(1, len(cfg.LINKS), figsize=(4.6 * len(cfg.LINKS), 4), sharey=True)
  for ax, link in zip(axes, cfg.LINKS):
    for name, (label, _) in cfg.designs(link).items():
      run = runs.get(cfg.run_name(link, name))
      if run is None:
        continue
      test = plots.read_metrics(run["workdir"])["test"]
      design = name.removesuffix("_two_phase")  # a two-phase run: dashed, in its design's colour
      ax.plot([r["train_time"] for r in test], [100 * r["accuracy"] for r in test], marker="o",
              ms=3, label=label, ls="-" if design == name else "--",
              color=f"C{list(cfg.DESIGNS).index(design)}")
    ax.axhline(100 * cfg.TARGET_ACCURACY, color="k", ls="--", lw=0.8)
    ax.set_title(link)
    ax.set_xlabel("training time (s)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("test accuracy (%)")
  if axes[0].get_legend_handles_labels()[0]:
    axes[0].legend(fontsize=7)
  fig.suptitle(f"3LC-T1 over emulated links, {cfg.PROCESSES} processes ({dataset})", fontsize=10)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


RENDERERS = {"3LC-T1-link": render}
