"""``summary.json``: what a finished run reports, written by process 0 at its end."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from absl import logging
import jax
import numpy as np

from experiments import lm
from experiments.build import Run, Start
from experiments.distributed import is_writer
from experiments.loop import End
from jaxcomp import models as models_lib


def write(run: Run, start: Start, end: End, timing: dict[str, float]) -> dict[str, Any]:
  """The summary of a finished run; process 0 writes it to ``summary.json``."""
  summary = _summary(run, start, end, timing)
  if is_writer():
    with open(os.path.join(run.workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  logging.info("done: %s", json.dumps({k: summary[k] for k in
                                       ("test_accuracy", "bytes_on_wire", "compression_ratio",
                                        "wall_time_sec")}))
  return summary


def _summary(run: Run, start: Start, end: End, timing: dict[str, float]) -> dict[str, Any]:
  c, history, last_eval = run.config, end.history, end.last_eval
  last_train = history[-1] if history else {}

  def mean(key):
    return float(np.mean([h[key] for h in history])) if history else None

  return {
      "experiment": c.experiment,
      "dataset": c.dataset,
      "model": c.model,
      "compressor": c.compressor,
      "compressor_kwargs": c.compressor_kwargs.to_dict(),
      "workers": c.workers,
      "devices": run.mesh.size,
      "processes": jax.process_count(),
      "hosts": c.get("hosts", 0),
      "batch_size": c.batch_size,
      "optimizer": c.optimizer,
      "learning_rate": c.learning_rate,
      "steps": end.step,
      "seed": c.seed,
      "parameters": models_lib.param_count(jax.eval_shape(run.whole_params, run.state.params)),
      "test_accuracy": last_eval.get("accuracy"),
      "test_top5_accuracy": last_eval.get("top5_accuracy"),
      "test_loss": last_eval.get("loss"),
      "test_examples": last_eval.get("count"),
      "test_bits_per_byte": last_eval.get("bits_per_byte"),
      **(lm.corpus_label(c) if run.is_text else {}),
      "evaluated": "ema" if c.eval_with_ema else "params",
      **{k: last_train.get(k) for k in ("bytes_on_wire", "float32_bytes", "compression_ratio",
                                        "compressed_ratio", "float_bytes", "encoded_bytes")},
      "mean_bytes_on_wire": mean("bytes_on_wire"),
      "peak_bytes_on_wire": peak_bytes(history),
      "mean_encoded_bytes": mean("encoded_bytes"),
      "final_train_loss": last_train.get("loss"),
      "wall_time_sec": end.wall_time,
      "train_time_sec": end.train_time,
      "steps_per_sec": mean("steps_per_sec"),
      **timing,
      "resumed_from_step": start.step or None,
      "jax_version": jax.__version__,
      "backend": jax.default_backend(),
      "git_commit": _git_commit(),
  }


def peak_bytes(history: list[dict[str, float]]) -> Optional[float]:
  """The largest ``bytes_on_wire`` one worker handed to the collectives in one step of the run.

  Read off the train rows' ``peak_bytes_on_wire`` (each its interval's largest step, from the
  transport's per-step counts); ``None`` if a row lacks it (a run from before the column).
  """
  peaks = [h.get("peak_bytes_on_wire") for h in history]
  return max(peaks) if peaks and None not in peaks else None


def _git_commit() -> Optional[str]:
  """The commit of the code that ran (with ``+dirty`` for local changes), if in a checkout."""
  import subprocess  # pylint: disable=g-import-not-at-top

  here = os.path.dirname(os.path.abspath(__file__))
  try:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                         timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "jaxcomp",
                            "experiments", "configs"], cwd=here, capture_output=True, text=True,
                           timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return (rev + ("+dirty" if dirty else "")) or None
