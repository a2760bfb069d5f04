"""TernGrad's tables: CifarNet (TG-T1), AlexNet and GoogLeNet on ImageNet (TG-T2, TG-T3), and TG-F4.

TernGrad: Wen et al., "TernGrad: Ternary Gradients to Reduce Communication
in Distributed Deep Learning", NeurIPS 2017, arXiv:1705.07878, Tables 1-3
and Fig. 4. TG-T1 reads ``runs/TG-T1``; TG-T2/TG-T3 read
``runs/TG-T2``/``runs/TG-T3`` and, without ImageNet here, say so with the
command that would run them; TG-F4 is drawn from TG-T2's N = 4 runs. The
zero codes of the ternary gradients (Fig. 4(c)) come from the runs'
``metrics.csv``.
"""

from __future__ import annotations

import os

from experiments import plots
from experiments.reports import designs as D
from experiments.reports.common import fmt_time, rel_link
from experiments.reports.terngrad_common import accuracy, cell, diff, summary_of

IMAGENET_NOTE = "**Not run: needs ImageNet (not available offline).**"
VARIANT_LABELS = {"none": "floating", "terngrad": "TernGrad", "terngrad_noclip": "TernGrad-noclip"}


def zero_fractions(workdir: str, tensor: str) -> list[tuple[float, float, float]]:
  """``(step, steps averaged, fraction of zero codes)`` per logged interval of ``tensor``.

  From the ``zeros:<tensor>`` / ``elements:<tensor>`` columns that
  ``compress(tensor_metrics=...)`` adds to ``metrics.csv`` (per worker,
  averaged over workers and the interval's steps).
  """
  out = []
  for r in D.train_rows(workdir):
    z, n = r.get(f"zeros:{tensor}"), r.get(f"elements:{tensor}")
    if z is not None and n:
      out.append((r["step"], r["steps"], z / n))
  return out


def mean_zero_fraction(workdir: str, tensor: str):
  rows = zero_fractions(workdir, tensor)
  total = sum(w for _, w, _ in rows)
  return sum(f * w for _, w, f in rows) / total if total else None


def _paper_vs_ours_table(rows, metric_label: str) -> list[str]:
  """Rows of ``(N, variant, paper %, paper Δ, ours %, ours Δ, summary)`` as a markdown table."""
  lines = [f"| N | gradients | paper: {metric_label} (%) | paper: Δ vs floating (pp) | ours: {metric_label} (%) "
           "| ours: Δ vs floating (pp) | dataset | steps | seed | wall time |",
           "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
  for n, v, p, pd, o, od, s in rows:
    run = [s["dataset"], f"{s['steps']:,}", str(s["seed"]), fmt_time(s["wall_time_sec"])] if s else ["—"] * 4
    lines.append(f"| {n} | {VARIANT_LABELS[v]} | {cell(p)} | {cell(pd, '{:+.2f}')} | {cell(o)} | "
                 f"{cell(od, '{:+.2f}')} | " + " | ".join(run) + " |")
  lines.append("")
  return lines


def _imagenet_table(cfg, runs_by_dataset, key: str, metric: str, label: str) -> tuple[list[str], bool]:
  """The paper's ``cfg.PAPER[key]`` table with ours beside it; and whether any run finished."""
  runs = runs_by_dataset.get("imagenet2012", {})
  rows, any_done = [], False
  for n, by_variant in cfg.PAPER[key].items():
    o_base = accuracy(summary_of(runs, f"N{n}/none"), metric)
    for v, p in by_variant.items():
      s = summary_of(runs, f"N{n}/{v}")
      any_done |= s is not None
      o = accuracy(s, metric)
      rows.append((n, v, p, None if v == "none" else p - by_variant["none"], o,
                   None if v == "none" else diff(o_base, o), s))
  return _paper_vs_ours_table(rows, label), any_done


def _not_run_lines(config_path: str, extra: str = "") -> list[str]:
  return [IMAGENET_NOTE + " The config runs where a prepared tfds `imagenet2012` exists (in "
          "`$TFDS_DATA_DIR`); here its default run stops at once with the data module's message, "
          "and its `runlocal` smoke run (3 steps on a labelled stand-in, Fashion-MNIST resized to "
          "64×64×3 or 32×32×3) shows that everything else runs (`tests/test_configs_terngrad.py`)."
          + extra, "",
          "```bash", f"python -m experiments.sweep --config {config_path} --root runs",
          "python -m experiments.report", "```", ""]


# ---------------------------------------------------------------------------------------------
# TG-T1: CifarNet, Table 1.


def render_tg_t1(runs_by_dataset, out_path: str, img_dir: str) -> list[str]:
  from configs import terngrad_cifarnet as cfg  # pylint: disable=g-import-not-at-top

  lines = ["## TG-T1 — TernGrad on CifarNet, N = 2 and 16, the same epochs (TernGrad Table 1)", ""]
  lines += [
      f"Paper ({cfg.PAPER['source']}): CIFAR-10, total batch 128 (N = 2, 300K iterations) and 2048 "
      f"(N = 16, 18.75K iterations), i.e. {cfg.PAPER['epochs']} epochs each; TernGrad within 1 point "
      "of floating. Settings (`configs/terngrad_cifarnet.py`): Adam 2e-4 constant, weight decay "
      "0.004 on fc3/fc4 weights (the authors' code), random 24×24 crop + flip + brightness/contrast, "
      "center crop at test; every tensor ternarized (c = 2.5, scalar sharing); the parameters' EMA "
      "(0.9999) evaluated on the whole test set. Within each N, floating and TernGrad have the same "
      "steps and seed. The table's batch 2048 for N = 16 is 128 per worker (the text says the "
      "per-worker batch stays 64; we follow the table).",
      "",
  ]
  for dataset, runs in sorted(runs_by_dataset.items()):
    lines += _tg_t1_dataset(cfg, dataset, runs, out_path, img_dir)
  return lines


def _epochs_per_step(summary) -> float:
  from jaxcomp import data  # pylint: disable=g-import-not-at-top

  return summary["batch_size"] / data.get_spec(summary["dataset"]).num_examples("train")


def _epochs(summary) -> float:
  return summary["steps"] * _epochs_per_step(summary)


def _tg_t1_dataset(cfg, dataset, runs, out_path, img_dir) -> list[str]:
  done = [r["summary"] for r in runs.values() if r["summary"]]
  lines = [f"### {dataset}", ""] + _t1_scale(cfg, dataset, done) + _t1_table(cfg, runs)
  if done:
    lines.append(f"Runs finished: {len(done)} of {2 * len(cfg.WORKERS)}; test images: "
                 f"{done[0]['test_examples']:,.0f}; total wall time "
                 f"{fmt_time(sum(s['wall_time_sec'] for s in done))} (2 shared vCPUs, simulated "
                 "workers; other jobs may have run beside them).")
    lines.append("")
  sparsity = _t1_sparsity(cfg, runs)
  return lines + _t1_sparsity_lines(sparsity) + _t1_plots(cfg, dataset, runs, sparsity, out_path, img_dir)


def _t1_scale(cfg, dataset, done) -> list[str]:
  """Full or REDUCED scale, and what was reduced: the dataset, the epochs."""
  if not done:
    return []
  epochs = sorted({round(_epochs(s), 2) for s in done})
  reduced = []
  if dataset != cfg.PAPER_DATASET:
    reduced.append(f"dataset {dataset} (paper: {cfg.PAPER_DATASET}, not available offline; "
                   "28×28 grey images zero-padded to 32×32 with the channel repeated 3 times)")
  if any(e != cfg.PAPER["epochs"] for e in epochs):
    reduced.append(f"{', '.join(f'{e:g}' for e in epochs)} epochs (paper: {cfg.PAPER['epochs']}), "
                   "because the paper's 38.4M training images per run would take days per run on "
                   "the 2 shared vCPUs")
  return [("**Scale: REDUCED** — " + "; ".join(reduced) + ".") if reduced else
          "**Scale: full** (the paper's dataset and iterations).", ""]


def _t1_table(cfg, runs) -> list[str]:
  """Table 1's rows, the paper's beside ours, with each run's steps, epochs, seed and wall time."""
  lines = ["| N | total batch | steps (paper) | epochs (paper) | paper: floating (%) | paper: TernGrad (%) "
           "| paper: Δ (pp) | ours: floating (%) | ours: TernGrad (%) | ours: Δ (pp) | ours: top-5 "
           "float / TernGrad (%) | seed | wall time float / TernGrad |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for n in cfg.WORKERS:
    a, b = summary_of(runs, f"N{n:02d}/none"), summary_of(runs, f"N{n:02d}/terngrad")
    pa, pb = cfg.PAPER["accuracy"][n]["none"], cfg.PAPER["accuracy"][n]["terngrad"]
    oa, ob = accuracy(a), accuracy(b)
    ref = a or b
    steps = f"{ref['steps']:,}" if ref else "—"
    epochs = f"{_epochs(ref):.2g}" if ref else "—"
    seeds = "/".join(sorted({str(s["seed"]) for s in (a, b) if s})) or "—"
    lines.append(
        f"| {n} | {cfg.TOTAL_BATCH[n]:,} | {steps} ({cfg.PAPER_ITERATIONS[n]:,}) | {epochs} "
        f"({cfg.PAPER['epochs']}) | {pa:.2f} | {pb:.2f} | {pb - pa:+.2f} | {cell(oa)} | {cell(ob)} | "
        f"{cell(diff(oa, ob), '{:+.2f}')} | {cell(accuracy(a, 'test_top5_accuracy'))} / "
        f"{cell(accuracy(b, 'test_top5_accuracy'))} | {seeds} | "
        f"{fmt_time(a['wall_time_sec']) if a else '—'} / {fmt_time(b['wall_time_sec']) if b else '—'} |")
  return lines + [""]


def _t1_sparsity(cfg, runs) -> dict:
  """``{N: mean fraction of zero codes of fc3}`` over the finished TernGrad runs that log it."""
  sparsity = {n: mean_zero_fraction(runs[k]["workdir"], "fc3/kernel")
              for n in cfg.WORKERS if (k := f"N{n:02d}/terngrad") in runs and runs[k]["summary"]}
  return {n: f for n, f in sparsity.items() if f is not None}


def _t1_sparsity_lines(sparsity) -> list[str]:
  if not sparsity:
    return []
  return ["Zero codes in CifarNet's first fully connected layer (fc3, the counterpart of AlexNet's "
          "fc6 in Fig. 4(c)), per worker, mean over training: " +
          ", ".join(f"N = {n}: {100 * f:.1f}%" for n, f in sparsity.items()) +
          " (paper, AlexNet fc6 on ImageNet: 71.32%).", ""]


def _t1_plots(cfg, dataset, runs, sparsity, out_path, img_dir) -> list[str]:
  """The curves against epochs, and fc3's zero codes."""
  lines = []
  shown = [(f"N={n} {VARIANT_LABELS[v]}", runs[k]) for n in cfg.WORKERS for v in ("none", "terngrad")
           if (k := f"N{n:02d}/{v}") in runs and runs[k]["summary"]]
  if shown:
    os.makedirs(img_dir, exist_ok=True)
    png = os.path.join(img_dir, f"tg_t1_{dataset}_curves.png")
    # Against epochs: N = 2 and N = 16 run the same epochs in 16x fewer steps.
    plots.convergence_plot([(label, r["workdir"]) for label, r in shown], png,
                           title=f"TG-T1 on {dataset}: test accuracy (EMA) and training loss", smooth=3,
                           epochs_per_step=[_epochs_per_step(r["summary"]) for _, r in shown])
    lines += [f"![TG-T1 curves]({rel_link(png, out_path)})", ""]
  if sparsity:
    png = os.path.join(img_dir, f"tg_t1_{dataset}_fc3_sparsity.png")
    tern = {f"N={n} TernGrad": runs[f"N{n:02d}/terngrad"] for n in sparsity}
    plot_sparsity({label: r["workdir"] for label, r in tern.items()},
                  "fc3/kernel", png, f"TG-T1 on {dataset}: zero codes of fc3 (cf. Fig. 4(c), fc6)",
                  epochs_per_step={label: _epochs_per_step(r["summary"]) for label, r in tern.items()})
    lines += [f"![TG-T1 fc3 sparsity]({rel_link(png, out_path)})", ""]
  return lines


def plot_sparsity(workdirs: dict[str, str], tensor: str, path: str, title: str,
                  paper_percent: float | None = 71.32,
                  epochs_per_step: dict[str, float] | None = None) -> None:
  """Zero codes of ``tensor`` against step, or against epoch given each run's epochs per step."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6, 4))
  for label, workdir in workdirs.items():
    rows = zero_fractions(workdir, tensor)
    scale = epochs_per_step[label] if epochs_per_step else 1.0
    ax.plot([r[0] * scale for r in rows], [100 * r[2] for r in rows], label=label)
  if paper_percent is not None:
    ax.axhline(paper_percent, color="grey", ls=":", label=f"paper, AlexNet fc6: {paper_percent}%")
  D.finish_plot(fig, ax, path, title, "epoch" if epochs_per_step else "step", "zero ternary codes (%)")


# ---------------------------------------------------------------------------------------------
# TG-T2 / TG-T3: AlexNet and GoogLeNet on ImageNet, Tables 2 and 3.


def render_tg_t2(runs_by_dataset, out_path: str, img_dir: str) -> list[str]:
  del img_dir
  from configs import terngrad_alexnet as cfg  # pylint: disable=g-import-not-at-top

  lines = ["## TG-T2 — TernGrad on AlexNet-BN / ImageNet, N = 2, 4, 8 (TernGrad Table 2)", ""]
  lines += [
      f"Paper ({cfg.PAPER['source']}): floating with dropout ratio 0.5, TernGrad (last layer in float) "
      "with 0.2, weight decay 5e-4; batch 128 per worker, LR 0.01/0.02/0.04, 370K/185K/92.5K "
      "iterations. Config: `configs/terngrad_alexnet.py` (Caffe-style augmentation, LR ÷10 every 20 "
      "epochs and tensors ≤ 9,216 elements in float as in the authors' script).",
      "",
  ]
  table1, done1 = _imagenet_table(cfg, runs_by_dataset, "top1", "test_accuracy", "top-1")
  table5, done5 = _imagenet_table(cfg, runs_by_dataset, "top5", "test_top5_accuracy", "top-5")
  if not (done1 or done5):
    lines += _not_run_lines("configs/terngrad_alexnet.py")
  lines += ["Top-1:", ""] + table1 + ["Top-5:", ""] + table5
  return lines


def render_tg_t3(runs_by_dataset, out_path: str, img_dir: str) -> list[str]:
  del out_path, img_dir
  from configs import terngrad_googlenet as cfg  # pylint: disable=g-import-not-at-top

  lines = ["## TG-T3 — TernGrad on GoogLeNet (no aux heads) / ImageNet, N = 2, 4, 8 (TernGrad Table 3)", ""]
  lines += [
      f"Paper ({cfg.PAPER['source']}): total batch 128/256/512, LR 0.04/0.08/0.10, 600K/300K/300K "
      "iterations, polynomial LR decay; floating with weight decay 4e-5 and dropout 0.2, TernGrad "
      "with 1e-5/1e-5/2e-5 and 0.08; \"on average, the accuracy loss is less than 2%\". Config: "
      "`configs/terngrad_googlenet.py`.",
      "",
  ]
  table, done = _imagenet_table(cfg, runs_by_dataset, "top5", "test_top5_accuracy", "top-5")
  if not done:
    lines += _not_run_lines("configs/terngrad_googlenet.py")
  return lines + table


# ---------------------------------------------------------------------------------------------
# TG-F4: from TG-T2's N = 4 runs.


def render_tg_f4(runs_by_dataset, out_path: str, img_dir: str) -> list[str]:
  from configs import terngrad_alexnet as cfg  # pylint: disable=g-import-not-at-top

  n = cfg.FIG4_WORKERS
  lines = [f"## TG-F4 — AlexNet, N = {n}, batch {n * cfg.PER_WORKER_BATCH}: accuracy, loss and fc6 "
           "sparsity vs iteration (TernGrad Fig. 4)", ""]
  lines.append(f"Paper ({cfg.PAPER['fig4_source']}): TernGrad's top-1 curve matches floating's, its "
               "training loss ends slightly lower, and on average "
               f"{cfg.PAPER['fig4_fc6_zero_percent']}% of fc6's ternary gradients are zero. Drawn from "
               f"TG-T2's N = {n} runs (`metrics.csv`: test rows, train loss, and the "
               "`zeros:fc6/kernel` / `elements:fc6/kernel` columns).")
  lines.append("")
  runs = runs_by_dataset.get("imagenet2012", {})
  a, b = runs.get(f"N{n}/none"), runs.get(f"N{n}/terngrad")
  if not (a and a["summary"]) and not (b and b["summary"]):
    lines += _not_run_lines(f"configs/terngrad_alexnet.py --only workers={n}",
                            " A small-scale counterpart measured here: the fc3 sparsity of CifarNet "
                            "in TG-T1, and the live curves of notebook 02.")
    return lines
  curves = [(f"{VARIANT_LABELS[v]}", r["workdir"]) for v, r in (("none", a), ("terngrad", b))
            if r and r["summary"]]
  os.makedirs(img_dir, exist_ok=True)
  png = os.path.join(img_dir, "tg_f4_curves.png")
  plots.convergence_plot(curves, png, title="TG-F4: AlexNet N = 4 (Fig. 4 (a), (b))", smooth=3)
  lines += [f"![TG-F4 curves]({rel_link(png, out_path)})", ""]
  if b and b["summary"]:
    f = mean_zero_fraction(b["workdir"], "fc6/kernel")
    lines.append(f"fc6 zero codes, mean over training: ours {cell(None if f is None else 100 * f)}% "
                 f"(paper {cfg.PAPER['fig4_fc6_zero_percent']}%).")
    lines.append("")
    png = os.path.join(img_dir, "tg_f4_fc6_sparsity.png")
    plot_sparsity({"TernGrad": b["workdir"]}, "fc6/kernel", png, "TG-F4 (c): zero codes of fc6")
    lines += [f"![TG-F4 fc6 sparsity]({rel_link(png, out_path)})", ""]
  return lines

