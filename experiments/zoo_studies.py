"""The studies behind a zoo's rows, as report sections: the findings and diagnoses of rows that did
not learn at first, the tuning sweeps, DiLoCo's H x outer learning rate, and the papers' claims with
figures filled in from the committed runs (:mod:`experiments.zoo_report` places them).
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Optional

from experiments.zoo_spec import NOT_MEASURED, Zoo, load
from experiments.zoo_table import fmt_bytes, run_summaries


def claim_text(text: str, rs: list[dict]) -> str:
  """A claim's text with the table's figures filled in: ``{bpb:<row>}`` (mean over the seeds),
  ``{bytes:<row>}`` and ``{peak:<row>}`` (a worker's mean and largest step) and ``{ratio:<row>}``
  (float32 bytes over the mean)."""
  cells = {r["name"]: r["acc"] for r in rs if r["acc"]}
  return fill_figures(text, cells, {"bpb": lambda a: f"{a['mean']:.3f}", "bytes": lambda a: fmt_bytes(a["bytes"]),
                                    "peak": lambda a: fmt_bytes(a["peak"]) if a["peak"] is not None else NOT_MEASURED,
                                    "ratio": lambda a: f"{a['ratio']:.0f}×"})


def claims_section(zoo: Zoo, rs: list[dict]) -> list[str]:
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


def language_findings(zoo: Zoo, diag: Zoo, plot_path: str, out: str, float_bpb: Optional[float]) -> list[str]:
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
  seeds = run_summaries(zoo)
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


def diloco_study(zoo: Zoo, study: Zoo, plot_path: str, out: str, float_bpb: Optional[float],
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
    wire = fmt_bytes(statistics.mean(s["mean_bytes_on_wire"] for s in done.values()))
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
    summary = load(os.path.join(d, "summary.json"))
    if summary is not None:
      out[name] = {"summary": summary, "train": plots.read_metrics(d)["train"]}
  return out


def findings(zoo: Zoo, plot_path: str, out: str) -> list[str]:
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
