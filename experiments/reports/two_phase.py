"""The two-phase exchange in the report (this project's addition): training with it, and its model checked.

* TWO-PHASE: ``configs/two_phase_training.py``'s runs
  (``runs/TWO-PHASE/<dataset>/...``) beside 3LC-T1's committed float and
  all-gather 3LC runs at the same steps and seed.
* LINK-MODEL: ``jaxcomp.perfmodel``'s exchange times against the times
  ``benchmarks/link.py`` measured, from its JSON documents under
  ``<root>/link/`` (``--json``).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Optional

from experiments import plots
from experiments.reports import designs as D


def _cfg():
  from configs import two_phase_training as cfg  # pylint: disable=g-import-not-at-top

  return cfg


def _acc(run: Optional[dict[str, Any]]) -> str:
  return f"{100 * run['summary']['test_accuracy']:.2f}" if run and run["summary"] else "—"


def received(run: Optional[dict[str, Any]], workers: int) -> str:
  """Bytes one worker received per step, averaged over the run.

  Two-phase runs log ``received_bytes``; an all-gather receives the other
  ``N − 1`` workers' payloads, ``(N − 1) × bytes_on_wire``.
  """
  if not run or not run["summary"]:
    return "—"
  rows = D.train_rows(run["workdir"])
  if rows and "received_bytes" in rows[0]:
    return f"{D.weighted_mean(rows, lambda r: r['received_bytes']):,.0f}"
  return f"{(workers - 1) * run['summary']['mean_bytes_on_wire']:,.0f}"


def lenet_lines(cfg: Any, runs: dict[str, dict]) -> list[str]:
  lines = ["| workers | floating (%) | TernGrad all-gather (%) | TernGrad two-phase (%) | "
           "two-phase − all-gather (pp) | received / worker / step: all-gather | two-phase |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
  for n in cfg.LENET_WORKERS:
    row = {name: runs.get(f"lenet/N{n:02d}/{name}") for name in cfg.LENET_DESIGNS}
    ag, tp = row["terngrad"], row["terngrad_two_phase"]
    diff = (f"{100 * (tp['summary']['test_accuracy'] - ag['summary']['test_accuracy']):+.2f}"
            if ag and tp and ag["summary"] and tp["summary"] else "—")
    lines.append(f"| {n} | {_acc(row['float'])} | {_acc(ag)} | {_acc(tp)} | {diff} | "
                 f"{received(ag, n)} | {received(tp, n)} |")
  return lines + [""]


def resnet_lines(runs: dict[str, dict], t1: dict[str, dict]) -> list[str]:
  designs = _cfg().RESNET_DESIGNS
  rows = [("3LC (s=1.00), all-gather (3LC-T1)", t1.get("3lc_s1.00"))]
  rows += [(label, runs.get(name)) for name, (label, _) in designs.items()]
  lines = ["| design | test acc. (%) | Δ vs float (pp) | received / worker / step | steps |",
           "|---|---:|---:|---:|---:|"]
  base = t1.get("float32")
  lines.append(f"| 32-bit float (3LC-T1) | {_acc(base)} | — | — | "
               f"{base['summary']['steps'] if base and base['summary'] else '—'} |")
  mismatched = False
  for label, run in rows:
    if not run or not run["summary"]:
      lines.append(f"| {label} | — | — | — | — |")
      continue
    s = run["summary"]
    comparable = base and base["summary"] and base["summary"]["steps"] == s["steps"]
    mismatched |= bool(base and base["summary"] and not comparable)
    delta = f"{100 * (s['test_accuracy'] - base['summary']['test_accuracy']):+.2f}" if comparable else "—"
    lines.append(f"| {label} | {_acc(run)} | {delta} | {received(run, s['workers'])} | {s['steps']:,} |")
  if mismatched:
    lines += ["", "The rows have different numbers of steps, so no Δ is given across them: rerun "
              "`python -m experiments.sweep --config configs/two_phase_training.py:resnet --root runs` "
              "(after removing the old run) to match 3LC-T1's current length."]
  return lines + [""]


def render_training(root: str, runs: dict, out_path: str, img_dir: str) -> list[str]:
  del root, out_path, img_dir
  cfg = _cfg()
  mine = runs.get("TWO-PHASE", {})
  if not mine:
    return []
  lines = ["## TWO-PHASE — training with the two-phase exchange (this project's addition)", ""]
  lines += [
      "The two-phase exchange (`exchange=\"two_phase\"`) sends each worker's chunk j to worker j "
      "(compressed all-to-all), which averages its N chunks, re-encodes that shard of the mean and "
      "all-gathers it, so a worker's bytes stay near 2(N−1)/N of one payload at any N (Dryden et "
      "al. §3.4; 3LC's compressed pushes and pulls). The second quantization adds error: unbiased "
      "for TernGrad (fresh keys), kept in a second residual for 3LC. Same steps and seed in every "
      "row, one run each (so differences within a point may be seed noise); "
      "`configs/two_phase_training.py`. *Received*: bytes that reached one worker per step, "
      "averaged over the run (`jaxcomp.metrics`' `received_bytes`; for the all-gather, N − 1 "
      "times its `bytes_on_wire`).",
      ""]
  for dataset, by_name in sorted(mine.items()):
    done = {k: v for k, v in by_name.items() if v["summary"]}
    lenet = {k: v for k, v in done.items() if k.startswith("lenet/")}
    if lenet:
      any_run = next(iter(lenet.values()))["summary"]
      lines += [f"### LeNet, TG-F3 settings, {dataset}", "",
                f"REDUCED: {any_run['steps']:,} steps (TG-F3: 10,000), total batch 64, momentum, "
                "TernGrad with 2.5σ clipping, parameter EMA evaluated.", ""]
      lines += lenet_lines(cfg, lenet)
    resnet = {k: v for k, v in done.items() if not k.startswith("lenet/")}
    if resnet:
      t1 = runs.get("3LC-T1", {}).get(dataset, {})
      lines += [f"### ResNet-8, reduced 3LC-T1 settings, {dataset}", "",
                "REDUCED as 3LC-T1's committed runs (ResNet-8, 10 workers x 32); the float and "
                "all-gather rows are those runs.", ""]
      lines += resnet_lines(resnet, t1)
      lines += resnet_finding(_cfg(), resnet, t1)
  return lines


def _loss_at(metrics: dict[str, list], step: int) -> Optional[float]:
  """The training loss logged at ``step`` (the mean over the interval it ends), from :func:`plots.read_metrics`."""
  return next((r["loss"] for r in metrics["train"] if r["step"] == step), None)


def resnet_finding(cfg: Any, runs: dict[str, dict], t1: dict[str, dict]) -> list[str]:
  """Where the two-phase ResNet row parts from the all-gather's, and what the warm-up sweep picks."""
  ag, tp = t1.get("3lc_s1.00"), runs.get("3lc_s1.00_two_phase")
  sweep = {w: runs.get(f"3lc_s1.00_two_phase.warmup{w}") for w in cfg.RESNET_WARMUPS}
  control = runs.get(f"3lc_s1.00.warmup{cfg.RESNET_CONTROL_WARMUP}")
  if not all(r and r["summary"] for r in (ag, tp, control, *sweep.values())):
    return []
  metrics = [plots.read_metrics(r["workdir"]) for r in (tp, ag)]  # each run's file read once
  early = [(step, _loss_at(metrics[0], step), _loss_at(metrics[1], step)) for step in (10, 30)]
  if any(v is None for _, a, b in early for v in (a, b)):
    return []
  test = [m["test"] for m in metrics]
  first_eval = (f"; test accuracy at step {int(test[0][0]['step'])}: {100 * test[0][0]['accuracy']:.1f} % against "
                f"{100 * test[1][0]['accuracy']:.1f} %" if all(test) and test[0][0]["step"] == test[1][0]["step"] else "")
  target = 100 * ag["summary"]["test_accuracy"] - cfg.RESNET_WITHIN
  within = [w for w in cfg.RESNET_WARMUPS if 100 * sweep[w]["summary"]["test_accuracy"] >= target]
  swept = ", ".join(f"{w} steps {_acc(sweep[w])} %" for w in cfg.RESNET_WARMUPS)
  pick = (f"The smallest within {cfg.RESNET_WITHIN:g} point of the all-gather row ({_acc(ag)} %) is "
          f"**{within[0]} steps: {_acc(sweep[within[0]])} %**." if within else
          f"**None is within {cfg.RESNET_WITHIN:g} point of the all-gather row ({_acc(ag)} %).**")
  return [
      f"**Finding.** The two-phase row falls behind in its first steps and does not catch up: training "
      f"loss over steps 1–10 {early[0][1]:.2f} against the all-gather's {early[0][2]:.2f}, over steps "
      f"21–30 {early[1][1]:.2f} against {early[1][2]:.2f}{first_eval}. Both start at the full scaled "
      f"learning rate (1.0, 3LC-T1's setting). With a linear warm-up (Goyal et al., arXiv:1706.02677, "
      f"§2.2) over the first steps, two-phase 3LC reaches: {swept}. {pick} The all-gather with a "
      f"{cfg.RESNET_CONTROL_WARMUP}-step warm-up, the control, reaches {_acc(control)} %.",
      ""]


def link_docs(root: str) -> list[dict[str, Any]]:
  out = []
  for path in sorted(glob.glob(os.path.join(root, "link", "*.json"))):
    with open(path) as f:
      out.append(json.load(f))
  return out


def render_model_check(root: str, runs: dict, out_path: str, img_dir: str) -> list[str]:
  """Modelled against measured exchange times, for n >= 1M on shaped links, per (processes, link)."""
  del runs, out_path, img_dir
  import statistics  # pylint: disable=g-import-not-at-top

  from experiments import link_results as link  # pylint: disable=g-import-not-at-top

  docs = [d for d in link_docs(root) if link.rate_bits_per_second(d["link"])]
  if not docs:
    return []
  rows = [r for r in link.table_rows(docs) if r[2] >= 1_000_000 and r[8]]
  lines = ["## LINK-MODEL — the exchange model against measured times (this project's addition)", "",
           "`jaxcomp.perfmodel.exchange_costs` (α-β: float ring all-reduce, compressed all-gather, "
           "two-phase; B = the link's rate, α = the measured time of a one-value all-reduce) "
           "against one jitted `tx.update` measured by `benchmarks/link.py` (median; every method "
           "and exchange of docs/benchmarks.md, n = 1.7M and 8M; documents under `runs/link/`). The "
           "model counts wire bytes and latency only: encoding, decoding and averaging are not "
           "modelled, nor the TCP/IP and Ethernet headers (about 4 % of a full frame). "
           "`python -m benchmarks.link --report runs/link/*.json` prints every cell.", "",
           "| processes | link | cells | within 25 % | median measured / modelled | over 25 % (measured / modelled) |",
           "|---:|---|---:|---:|---:|---|"]
  groups: dict = {}
  for r in rows:
    groups.setdefault((r[0], r[1]), []).append(r)
  total = within = 0
  for (p, rate), cell in sorted(groups.items(), key=lambda kv: (kv[0][0], link.rate_bits_per_second(kv[0][1]))):
    ratios = [(r[4] / r[8], r) for r in cell]
    ok = sum(abs(q - 1) <= 0.25 for q, _ in ratios)
    total, within = total + len(ratios), within + ok
    over = sorted((q, r) for q, r in ratios if abs(q - 1) > 0.25)[::-1]
    listed = ", ".join(f"`{r[3]}` {r[2] / 1e6:g}M {q:.2f}" for q, r in over[:6])
    more = f" and {len(over) - 6} more" if len(over) > 6 else ""
    lines.append(f"| {p} | {rate} | {len(ratios)} | {ok} | {statistics.median(q for q, _ in ratios):.2f} | "
                 f"{listed}{more} |")
  lines += ["", f"Within 25 %: {within} of {total} cells. What the model misses is compute: the cells "
            "outside are those where encoding and decoding take as long as the wire or longer (every "
            "compressor at 1 Gbit/s, and at 100 Mbit/s the compressors with the most work per value: "
            "3LC, 1-bit SGD, threshold, adaptive, top-k); the same exchange with no link "
            "(docs/benchmarks.md) takes about the difference.", ""]
  return lines


RENDERERS: dict = {}
WIDE_RENDERERS = {"TWO-PHASE": render_training, "LINK-MODEL": render_model_check}
