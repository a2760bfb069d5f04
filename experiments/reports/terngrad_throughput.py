"""TernGrad's throughput vs GPUs (TG-F5): performance-model ESTIMATES, not measurements.

TernGrad: Wen et al., "TernGrad: Ternary Gradients to Reduce Communication
in Distributed Deep Learning", NeurIPS 2017, arXiv:1705.07878, Fig. 5 and
Appendix B. Reads the estimates that ``python -m
experiments.perfmodel_estimates`` writes under ``runs/TG-F5``.
"""

from __future__ import annotations

import os

from experiments.reports.common import rel_link
from experiments.reports.terngrad_common import cell



F5_COMMAND = "python -m experiments.perfmodel_estimates --config configs/terngrad_perfmodel.py --root runs"


def render_tg_f5(runs_by_dataset, out_path: str, img_dir: str) -> list[str]:
  from configs import terngrad_perfmodel as cfg  # pylint: disable=g-import-not-at-top

  lines = ["## TG-F5 — performance-model estimates: throughput vs GPUs (TernGrad Fig. 5, Appendix B)", ""]
  run = runs_by_dataset.get("perfmodel", {}).get("fig5")
  if not run or not run["summary"]:
    return lines + ["Not generated yet (a few seconds on a CPU):", "", "```bash", F5_COMMAND, "```", ""]
  s = run["summary"]
  lines += _tg_f5_assumptions(run["config"]) + _tg_f5_models(s) + _tg_f5_speedups(s)
  lines += _tg_f5_break_even(s.get("break_even")) + _tg_f5_paper(cfg, s)
  os.makedirs(img_dir, exist_ok=True)
  png = os.path.join(img_dir, "tg_f5_throughput.png")
  plot_throughput(s, png)
  return lines + [f"![TG-F5 estimated throughput]({rel_link(png, out_path)})", ""]


def _tg_f5_assumptions(c) -> list[str]:
  """What is assumed and what is computed, from the estimates' config ``c``."""
  return [
      "**These are performance-model ESTIMATES, not measurements.** We have no GPU cluster: "
      "`jaxcomp/perfmodel.py` evaluates Appendix B's model (Eq. 27–30; weak scaling, Eq. 29–30, "
      "as Fig. 5 keeps the per-GPU batch) with the ASSUMED inputs of `configs/terngrad_perfmodel.py`: "
      f"bandwidths and latencies typical of the paper's hardware, and a single-GPU step time "
      f"T(1,1,K) = {c['train_flops_factor']:g} × forward FLOPs × K / ({c['sustained_fraction']:.0%} of "
      "the GPU's FP32 peak) instead of a profiled one. Computed, not assumed: parameter counts and "
      "forward FLOPs of our Flax AlexNet-BN, GoogLeNet and VGG-A (XLA cost analysis), and the bytes "
      "of TernGrad's real payload (2-bit codes + scalar + agreed scalar per tensor; last layer in "
      "float32, §4.2). Every all-reduce hop is charged the same |g|, as the paper's model does. "
      f"Command: `{F5_COMMAND}`.",
      "",
  ]


def _tg_f5_models(s) -> list[str]:
  """Each model's parameters, forward FLOPs and gradient bytes, float32 and TernGrad."""
  lines = ["| model | per-GPU batch | parameters | forward GFLOPs | gradient, float32 (MB) "
           "| gradient, TernGrad (MB) | ratio |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for name, m in s["models"].items():
    lines.append(f"| {name} | {m['per_gpu_batch']} | {m['param_count']:,} | {m['forward_flops'] / 1e9:.2f} | "
                 f"{m['gradient_bytes_float32'] / 1e6:.1f} | {m['gradient_bytes_terngrad'] / 1e6:.1f} | "
                 f"{m['gradient_bytes_float32'] / m['gradient_bytes_terngrad']:.1f}× |")
  return lines


F5_EXCHANGES = (("paper's charge", "speedup", "terngrad_throughput"),
                ("all-gather", "speedup_all_gather", "terngrad_all_gather_throughput"),
                ("two-phase", "speedup_two_phase", "terngrad_two_phase_throughput"))


def _tg_f5_speedups(s) -> list[str]:
  """TernGrad's estimated speedup at 8, 64 and 512 GPUs, per cluster, model and exchange."""
  lines = ["", "TernGrad is charged three ways (all ESTIMATES). *Paper's charge*: every hop moves TernGrad's "
           "payload P, as Appendix B does. *All-gather* and *two-phase*: the two exchanges jaxcomp runs "
           "(`exchange=\"all_gather\"`, `exchange=\"two_phase\"`), each charged on every hop the float "
           "|g| scaled by the bytes a worker receives in that exchange over those it receives in a float32 "
           "ring all-reduce (from `jaxcomp.exchange.two_phase`'s byte functions, tensor by tensor; a tensor too small "
           "to split falls back to the all-gather, as jaxcomp does). The float exchange keeps the paper's "
           "charge, so the three columns compare the exchanges under one model; the two-phase exchange "
           "comes out close to the paper's charge, the all-gather's grows as N·P/2. Models with many small "
           "tensors (GoogLeNet) keep less of the two-phase gain at large N: a tensor of fewer than N × 40 "
           "values is not split and goes by the all-gather.", "",
           "| cluster | model | TernGrad exchange | assumed compute T (s) | TernGrad speedup: 8 GPUs "
           "| 64 GPUs | 512 GPUs | TernGrad images/s at 512 GPUs |", "|---|---|---|---:|---:|---:|---:|---:|"]
  for cl in s["clusters"].values():
    for name, m in cl["models"].items():
      by = {r["gpus"]: r for r in m["rows"]}
      for label, key, tput in F5_EXCHANGES:
        if key not in m["rows"][-1]:
          continue
        cells = [f"{by[g][key]:.2f}×" if g in by else "—" for g in (8, 64, 512)]
        lines.append(f"| {cl['label']} | {name} | {label} | {m['assumed_compute_sec']:.3f} | " + " | ".join(cells) +
                     f" | {m['rows'][-1][tput]:,.0f} |")
  return lines


def _tg_f5_paper(cfg, s) -> list[str]:
  """The paper's headline speedups beside ours, and the compute time that would match them."""
  a = s["alexnet_ethernet_8gpu"]
  match = a.get("compute_sec_matching_paper")
  return ["", f"Paper: {cfg.PAPER['alexnet_ethernet_8gpu_speedup']}× for AlexNet on 8 GPUs over 1 Gbps "
          f"Ethernet; ours (estimate, paper's charge): {a['speedup']:.2f}×. Our model would give the paper's "
          f"{cfg.PAPER['alexnet_ethernet_8gpu_speedup']}× if one GPU's compute for a batch of 128 took "
          f"{cell(match, '{:.3f}')} s instead of the assumed {a['assumed_compute_sec']:.3f} s (derived "
          "by inverting the model, not measured): the paper's profiled step time, its TernGrad "
          "message size (e.g. counting the growing levels of summed codes) or its bandwidths differ "
          f"from our assumptions. Paper, InfiniBand + NVLink: {cfg.PAPER['vgg_a_infiniband_512gpu']} "
          f"(512 GPUs); ours (estimate): {_speedup(s, 'infiniband', 'vgg_a', 512)}.", ""]


def _tg_f5_break_even(break_even) -> list[str]:
  """The table of worker counts at which the compressed all-gather passes a float32 ring all-reduce."""
  if not break_even:
    return []
  lines = ["", "Break-even N (computed from jaxcomp's static byte functions, not timed): the smallest number "
           "of workers at which the compressed all-gather's bytes received per worker, (N−1)·P, exceed a "
           "float32 ring all-reduce's, 2(N−1)/N·4n, for one tensor of each model's parameter count n. "
           "Beside it, all-gather/float bytes at that N and at N−1 (a ratio of 1.0000 at N: the two tie "
           "there up to the per-tensor scalars, and the all-gather loses from N+1 on). The two-phase "
           "exchange is checked against the float ring at N = 2, 4, 8, … (powers of two) up to 65,536, "
           "wherever the tensor is big enough to split into aligned chunks (beyond that jaxcomp falls back "
           "to the all-gather). 3LC is its fixed wire (base-3^5 codes, 1.6 bits per value), without "
           "zero-run coding, whose size depends on the data.", "",
           "| compressor | model | size n | payload P (bits/value) | all-gather passes float at N "
           "| all-gather/float at N; at N−1 | two-phase/float, largest (at N) | two-phase crosses float at "
           "| two-phase checked up to N |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for b in break_even.values():
    for model, e in b["models"].items():
      w, tp = e["all_gather_break_even_workers"], e["two_phase"]
      before = e.get("all_gather_over_float_before")
      lines.append(
          f"| {b['label']} | {model} | {e['n']:,} | {8 * e['payload_bytes'] / e['n']:.3f} | {cell(w, '{}')} | "
          f"{cell(e.get('all_gather_over_float_at_break_even'), '{:.4f}')}; {cell(before, '{:.4f}')} | "
          f"{cell(tp['max_ratio'], '{:.3f}')} ({cell(tp['at_workers'], '{:,}')}) | "
          f"{cell(tp['first_crossing'], '{:,}') if tp['first_crossing'] else 'never'} | "
          f"{cell(max(tp['workers_checked'], default=None), '{:,}')} |")
  return lines + [""]


def _speedup(summary, cluster: str, model: str, gpus: int) -> str:
  rows = summary["clusters"].get(cluster, {}).get("models", {}).get(model, {}).get("rows", [])
  return next((f"{r['speedup']:.2f}×" for r in rows if r["gpus"] == gpus), "—")


def plot_throughput(summary, path: str) -> None:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  clusters = summary["clusters"]
  fig, axes = plt.subplots(1, len(clusters), figsize=(12, 4.5), sharey=True)
  for ax, (cname, cl) in zip(axes, clusters.items()):
    for k, (name, m) in enumerate(cl["models"].items()):
      g = [r["gpus"] for r in m["rows"]]
      color = f"C{k}"
      ax.plot(g, [r["float_throughput"] for r in m["rows"]], ls="--", marker=".", color=color,
              label=f"{name} floating")
      ax.plot(g, [r["terngrad_throughput"] for r in m["rows"]], ls="-", marker="o", markersize=3,
              color=color, label=f"{name} TernGrad")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_title(cl["label"], fontsize=9)
    ax.grid(alpha=0.3, which="both")
  axes[0].set_ylabel("images/s (performance-model ESTIMATE)")
  axes[0].legend(fontsize=7)
  fig.suptitle("TG-F5: estimated training throughput, weak scaling (cf. TernGrad Fig. 5) — not measured")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)

