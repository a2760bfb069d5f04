"""Plots of training runs, read from their ``metrics.csv`` files."""

from __future__ import annotations

import csv
import os
from typing import Iterable, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(workdir: str) -> dict[str, list[dict[str, float]]]:
  """``metrics.csv`` of a run as ``{"train": rows, "test": rows}`` of floats."""
  out: dict[str, list[dict[str, float]]] = {"train": [], "test": []}
  with open(os.path.join(workdir, "metrics.csv"), newline="") as f:
    for row in csv.DictReader(f):
      split = row.pop("split")
      out.setdefault(split, []).append({k: float(v) for k, v in row.items() if v not in ("", None)})
  return out


def convergence_plot(
    runs: Sequence[tuple[str, str]],
    path: str,
    title: str = "",
    smooth: int = 1,
    epochs_per_step: Optional[Sequence[float]] = None,
) -> str:
  """Test accuracy and training loss against step (or epoch), one line per run.

  Args:
    runs: ``(label, workdir)`` pairs.
    path: where to write the PNG.
    title: figure title.
    smooth: moving-average window over logged training-loss points.
    epochs_per_step: one value per run (its total batch / training-set size):
      the x axis is then epochs, so runs with different batch sizes and step
      counts (TG-T1's N = 2 and 16) share one axis.

  Returns:
    ``path``.

  Raises:
    ValueError: if ``epochs_per_step`` does not give one positive value per run.
  """
  if epochs_per_step is not None:
    epochs_per_step = list(epochs_per_step)
    if len(epochs_per_step) != len(runs) or not all(e > 0 for e in epochs_per_step):
      raise ValueError(f"epochs_per_step needs one positive value per run ({len(runs)}); "
                       f"got {epochs_per_step}.")
  scales = epochs_per_step or [1.0] * len(runs)
  xlabel = "epoch" if epochs_per_step else "step"
  fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
  for (label, workdir), scale in zip(runs, scales):
    m = read_metrics(workdir)
    test = m.get("test", [])
    if test:
      ax_acc.plot([r["step"] * scale for r in test], [100 * r["accuracy"] for r in test], marker="o",
                  markersize=3, label=label)
    train = m.get("train", [])
    if train:
      steps = [r["step"] * scale for r in train]
      loss = _moving_average([r["loss"] for r in train], smooth)
      ax_loss.plot(steps, loss, label=label)
  ax_acc.set_xlabel(xlabel)
  ax_acc.set_ylabel("test accuracy (%)")
  ax_acc.grid(alpha=0.3)
  ax_acc.legend()
  ax_loss.set_xlabel(xlabel)
  ax_loss.set_ylabel("training loss")
  ax_loss.set_yscale("log")
  ax_loss.grid(alpha=0.3, which="both")
  ax_loss.legend()
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _moving_average(xs: Iterable[float], k: int) -> list[float]:
  xs = list(xs)
  if k <= 1:
    return xs
  out = []
  acc = 0.0
  for i, x in enumerate(xs):
    acc += x
    if i >= k:
      acc -= xs[i - k]
    out.append(acc / min(i + 1, k))
  return out
