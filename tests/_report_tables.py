"""Reading the numbers back out of a generated report (tests/test_reports_*.py).

The report tests check what the tables and sentences *say* (which number stands
in which column of which row, of which section), not how the Markdown is spelt,
so a change of layout or wording does not break them and a wrong number does.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def section(text: str, experiment: str) -> str:
  """The body of the report section whose ``## `` heading starts with ``experiment``."""
  m = re.search(rf"^## {re.escape(experiment)}\b[^\n]*\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
  assert m, f"no section {experiment!r} in the report"
  return m.group(1)


def tables(text: str) -> list[list[dict[str, str]]]:
  """Every Markdown table in ``text``: a list of rows, each ``{header: cell}``."""
  out, block = [], []
  for line in text.splitlines() + [""]:
    if line.startswith("|"):
      block.append([c.strip() for c in line.strip().strip("|").split("|")])
      continue
    if len(block) >= 2:
      header, rows = block[0], [r for r in block[2:]]
      out.append([dict(zip(header, r)) for r in rows])
    block = []
  return out


def table(text: str, *headers: str) -> list[dict[str, str]]:
  """The first table of ``text`` that has every one of ``headers`` among its columns."""
  for t in tables(text):
    if t and all(h in t[0] for h in headers):
      return t
  raise AssertionError(f"no table with columns {headers}")


def row(rows: list[dict[str, str]], **match: str) -> dict[str, str]:
  """The one row whose cells equal ``match`` (keys are column names, ``_`` for spaces)."""
  found = [r for r in rows
           if all(r.get(k.replace("_", " "), r.get(k)) == str(v) for k, v in match.items())]
  assert len(found) == 1, f"{len(found)} rows match {match}"
  return found[0]


def numbers(cell: str) -> list[float]:
  """Every number in a cell or sentence, in order (thousands separators dropped)."""
  return [float(n.replace(",", "")) for n in _NUMBER.findall(cell)]


def number(cell: str) -> float | None:
  """The first number in a cell; None for an empty cell (``—``)."""
  found = numbers(cell)
  assert found or cell.strip() in ("—", "-", ""), f"no number in {cell!r}"
  return found[0] if found else None


def numbers_after(text: str, label: str) -> list[float]:
  """The numbers of the sentence (up to the next full stop or newline) that follows ``label``."""
  i = text.find(label)
  assert i >= 0, f"{label!r} not in the report"
  rest = text[i + len(label):]
  end = re.search(r"\.(?:\s|$)|\n", rest)
  return numbers(rest[:end.start() if end else len(rest)])
