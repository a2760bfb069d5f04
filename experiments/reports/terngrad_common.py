"""Cell helpers shared by TernGrad's report sections (Wen et al., NeurIPS 2017, arXiv:1705.07878)."""

from __future__ import annotations


def cell(x, fmt="{:.2f}"):
  return "—" if x is None else fmt.format(x)


def summary_of(runs, name):
  """The finished run ``name``'s summary; ``None`` when it is missing or unfinished."""
  run = runs.get(name)
  return run["summary"] if run and run["summary"] else None


def accuracy(summary, key="test_accuracy"):
  """``summary[key]`` in percent; ``None`` without it."""
  return None if summary is None or summary.get(key) is None else 100 * summary[key]


def diff(a, b):
  return None if a is None or b is None else b - a
