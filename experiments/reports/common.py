"""Helpers shared by the report renderers."""

from __future__ import annotations

import collections
import glob
import json
import os
from typing import Any, Optional


def load_runs(root: str) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
  """``{experiment: {dataset: {name: run}}}``; a run holds its summary and workdir."""
  out: dict = collections.defaultdict(lambda: collections.defaultdict(dict))
  for cfg_path in glob.glob(os.path.join(root, "**", "config.json"), recursive=True):
    workdir = os.path.dirname(cfg_path)
    rel = os.path.relpath(workdir, root).split(os.sep)
    if len(rel) < 3:
      continue
    experiment, dataset, name = rel[0], rel[1], "/".join(rel[2:])
    with open(cfg_path) as f:
      config = json.load(f)
    summary = None
    if os.path.exists(os.path.join(workdir, "summary.json")):
      with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    out[experiment][dataset][name] = {"workdir": workdir, "config": config, "summary": summary}
  return out


def pct(x: Optional[float], digits: int = 2) -> str:
  return "—" if x is None else f"{100 * x:.{digits}f}"


def fmt_time(sec: Optional[float]) -> str:
  if sec is None:
    return "—"
  return f"{sec / 60:.1f} min" if sec < 3600 else f"{sec / 3600:.2f} h"


def rel_link(path: str, out_path: str) -> str:
  return os.path.relpath(path, os.path.dirname(os.path.abspath(out_path)))


