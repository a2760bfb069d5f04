"""What a zoo config says (:class:`Zoo`: its rows, their settings, where its files live) and
what its table ranks by (:class:`Metric`), for ``python -m experiments.zoo``'s steps and its report.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple, Optional

NOT_MEASURED = "not measured"


class Metric(NamedTuple):
  """What a zoo's table ranks by: a ``summary.json`` key, shown as ``column`` (times ``scale``)."""
  key: str
  name: str
  column: str
  scale: float
  digits: int
  higher_is_better: bool
  zoom: float  # the plot's second panel: rows within this much of the best mean
  unit: str  # of ``zoom``, in words


METRICS = {
    "test_accuracy": Metric("test_accuracy", "Accuracy", "test accuracy (%)", 100.0, 2, True, 5.0, "points"),
    "test_bits_per_byte": Metric("test_bits_per_byte", "Bits per byte", "held-out bits per byte", 1.0, 3, False, 0.25,
                                 "bits per byte"),
}


class Zoo:
  """The config module and argument, and where the zoo's files live."""

  def __init__(self, config_arg: str, root: str):
    from experiments import sweep  # pylint: disable=g-import-not-at-top
    self.config_arg = config_arg
    path, _, self.arg = config_arg.partition(":")
    self.module = sweep.load_config_module(path)
    self.base = self.module.get_config(self.arg or None)
    self.root = root
    self.dir = os.path.join(root, self.base.experiment)
    self.runs_dir = os.path.join(self.dir, self.base.dataset)
    self.throughput_json = os.path.join(self.dir, "throughput.json")
    self.link_json = os.path.join(self.dir, "link_steps.json")
    self.metric = METRICS[getattr(self.module, "METRIC", "test_accuracy")]

  def studies(self) -> dict[str, "Zoo"]:
    """The tuning sweeps and the diagnoses of this zoo (``:tune``, ``:diagnose``, where its config
    takes them); none for ``runlocal``."""
    if "runlocal" in self.arg.split(","):
      return {}
    path = self.config_arg.partition(":")[0]
    return {study: Zoo(f"{path}:{','.join(filter(None, [self.arg, study]))}", self.root)
            for study in ("tune", "diagnose", "diloco") if study in self.module.ARGS}

  def names(self) -> list[str]:
    """Registered compressors that this sweep runs, in ``SETTINGS`` order."""
    seen = []
    for name, _ in self.module.get_sweep(self.arg or None):
      comp = name.split("/")[0]
      if comp not in seen:
        seen.append(comp)
    return seen

  def seeds_per_name(self) -> dict[str, int]:
    """How many runs (seeds) the sweep has per compressor."""
    out: dict[str, int] = {}
    for name, _ in self.module.get_sweep(self.arg or None):
      out[name.split("/")[0]] = out.get(name.split("/")[0], 0) + 1
    return out

  def row(self, name: str) -> dict:
    return self.module.SETTINGS[name]

  def compressor(self, name: str) -> str:
    """The registered compressor a row runs (a labelled row's, or the row's name)."""
    return self.row(name).get("compressor", name) if name in self.module.SETTINGS else name

  def link_overrides(self, name: str) -> tuple[str, ...]:
    """The row's config overrides that the link timing keeps: all but ``min_size``, which goes in
    the method (the optimizer and its learning rate; 1-bit Adam, the optimizer itself, needs plain
    SGD after it to build at all, and no clipping after it).
    """
    config = self.row(name).get("config", {})
    return tuple(f"{k}={v}" for k, v in config.items() if k != "min_size")

  def timing_kwargs(self, name: str) -> dict:
    """The row's kwargs, with its ``timing`` ones: warm-ups end before the timed calls."""
    row = self.row(name)
    return {**row["kwargs"], **row.get("timing", {})}

  def method(self, name: str) -> str:
    """``name:key=value:...`` for ``benchmarks.train_step_link``: :meth:`timing_kwargs` and ``min_size``."""
    row = self.row(name)
    kwargs = self.timing_kwargs(name)
    if "min_size" in row.get("config", {}):
      kwargs["min_size"] = row["config"]["min_size"]
    for k, v in kwargs.items():
      if ":" in repr(v) or "," in repr(v):
        raise ValueError(f"{name}: argument {k}={v!r} cannot be written as a link method")
    return ":".join([self.compressor(name)] + [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in kwargs.items()])


def load(path: str) -> Optional[dict]:
  """The JSON document at ``path``, or ``None`` if there is none."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
