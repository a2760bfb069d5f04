"""TernGrad's experiments in the report (papers/terngrad.md)."""

from __future__ import annotations

import os

from experiments import plots
from experiments.reports.common import fmt_time, pct, rel_link



def render_tg_f3(runs_by_dataset, out_path: str, img_dir: str) -> list[str]:
  from configs import terngrad_lenet as cfg  # pylint: disable=g-import-not-at-top

  lines = ["## TG-F3 — TernGrad on LeNet, total batch 64, N workers (TernGrad Fig. 3)", ""]
  lines += [
      f"Paper ({cfg.PAPER['source']}): on MNIST, TernGrad's accuracy is within "
      f"+{cfg.PAPER['max_gain_pp']} / −{cfg.PAPER['max_loss_pp']} percentage points of floating "
      "for every N and both optimizers. Our target: within ±0.5 points in every cell.",
      "",
      "Settings (the paper's): total batch 64 split over N workers, 10K iterations, momentum SGD "
      "(0.9, base LR 0.01) or vanilla SGD (base LR 0.1), polynomial decay (power 0.5) to 0, "
      "weight decay 5e-4, no augmentation; every tensor ternarized (clipping c = 2.5, scalar "
      "sharing); the EMA of the parameters (TF-style, decay 0.9999) is evaluated on the whole test "
      "set. **Dataset: the paper used MNIST, which is not available offline here**; we run on "
      "the datasets named below.",
      "",
  ]
  for dataset, runs in sorted(runs_by_dataset.items()):
    lines += render_tg_f3_dataset(cfg, dataset, runs, out_path, img_dir)
  return lines


def render_tg_f3_dataset(cfg, dataset, runs, out_path, img_dir) -> list[str]:
  lines = [f"### {dataset}", ""]
  header = ("| N | per-worker batch | " + " | ".join(
      f"{opt}: floating | {opt}: TernGrad | {opt}: Δ (pp)" for opt in cfg.OPTIMIZERS) +
            " | within ±0.5 |")
  lines.append(header)
  lines.append("|" + "---|" * (3 * len(cfg.OPTIMIZERS) + 3))
  diffs, cells_done, cells_total = [], 0, 0
  acc_by = {}
  steps, seeds, total_time = set(), set(), 0.0
  for n in cfg.WORKERS:
    row = [str(n), str(64 // n)]
    ok_all = True
    for opt in cfg.OPTIMIZERS:
      a = runs.get(f"{opt}/N{n:02d}/none", {}).get("summary")
      b = runs.get(f"{opt}/N{n:02d}/terngrad", {}).get("summary")
      cells_total += 1
      for s in (a, b):
        if s:
          steps.add(s["steps"])
          seeds.add(s["seed"])
          total_time += s["wall_time_sec"]
      fa = a["test_accuracy"] if a else None
      fb = b["test_accuracy"] if b else None
      acc_by[(opt, n)] = (fa, fb)
      if fa is not None and fb is not None:
        d = 100 * (fb - fa)
        diffs.append(d)
        cells_done += 1
        ok_all &= abs(d) <= 0.5
        row += [pct(fa), pct(fb), f"{d:+.2f}"]
      else:
        ok_all = False
        row += [pct(fa), pct(fb), "—"]
    row.append("yes" if ok_all else ("no" if all(
        x is not None for opt in cfg.OPTIMIZERS for x in acc_by[(opt, n)]) else "—"))
    lines.append("| " + " | ".join(row) + " |")
  lines.append("")
  if diffs:
    lines.append(f"Cells finished: {cells_done} of {cells_total}. TernGrad − floating over finished "
                 f"cells: from {min(diffs):+.2f} to {max(diffs):+.2f} points "
                 f"(paper on MNIST: −{cfg.PAPER['max_loss_pp']} to +{cfg.PAPER['max_gain_pp']}).")
  else:
    lines.append(f"Cells finished: 0 of {cells_total}.")
  any_run = next((r for r in runs.values() if r["summary"]), None)
  if any_run:
    s = any_run["summary"]
    lines.append(f"Steps: {', '.join(map(str, sorted(steps)))}; seeds: "
                 f"{', '.join(map(str, sorted(seeds)))}; test images: {s['test_examples']:.0f}; "
                 f"total wall time of the finished runs: {fmt_time(total_time)} "
                 f"(2 shared vCPUs, simulated workers).")
  lines.append("")
  # Plots.
  os.makedirs(img_dir, exist_ok=True)
  png = os.path.join(img_dir, f"tg_f3_{dataset}_accuracy_vs_workers.png")
  if plot_accuracy_vs_workers(cfg, acc_by, png, dataset):
    lines.append(f"![TG-F3 accuracy vs workers]({rel_link(png, out_path)})")
    lines.append("")
  curves = [(f"{opt} N={n} {'TernGrad' if c == 'terngrad' else 'floating'}", runs[k]["workdir"])
            for opt in cfg.OPTIMIZERS for n in (8, 64) for c in ("none", "terngrad")
            if (k := f"{opt}/N{n:02d}/{c}") in runs and runs[k]["summary"]]
  if curves:
    png2 = os.path.join(img_dir, f"tg_f3_{dataset}_curves.png")
    plots.convergence_plot(curves, png2, title=f"TG-F3 on {dataset}: N = 8 and 64", smooth=5)
    lines.append(f"![TG-F3 curves]({rel_link(png2, out_path)})")
    lines.append("")
  return lines


def plot_accuracy_vs_workers(cfg, acc_by, path, dataset) -> bool:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  if not any(v is not None for pair in acc_by.values() for v in pair):
    return False
  fig, axes = plt.subplots(1, len(cfg.OPTIMIZERS), figsize=(11, 4), sharey=True)
  for ax, opt in zip(axes, cfg.OPTIMIZERS):
    for j, label in enumerate(("floating", "TernGrad")):
      xs = [n for n in cfg.WORKERS if acc_by[(opt, n)][j] is not None]
      ys = [100 * acc_by[(opt, n)][j] for n in xs]
      ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(cfg.WORKERS, [str(n) for n in cfg.WORKERS])
    ax.set_xlabel("workers N (total batch 64)")
    ax.set_title(f"{opt} SGD")
    ax.grid(alpha=0.3)
    ax.legend()
  axes[0].set_ylabel("test accuracy (%)")
  fig.suptitle(f"TG-F3 on {dataset} (paper: MNIST, Fig. 3)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True



RENDERERS = {"TG-F3": render_tg_f3}
