"""Where a traced step's time goes: before its first collective, in collectives, between them, after.

``benchmarks.link --profile DIR`` has rank 0 trace three calls of each method's
jitted exchange (``jax.profiler``). This reads those traces and splits every
call, from the Python call to its last kernel, into four spans:

* **lead**: from the call to the start of its first collective (dispatch, the
  first buckets' statistics and encodes, and nothing on the wire yet);
* **collectives**: the union of the collectives' spans (the wire, and the
  wait for the slowest worker: a collective starts on this worker when it is
  ready here and ends when every worker's bytes arrived);
* **between**: the gaps between the first collective's start and the last
  one's end (compute that did not overlap a collective);
* **tail**: from the last collective's end to the call's last kernel (the
  last bucket's decode, the residuals).

Over an emulated link, a step bound by the link is nearly all collectives;
a lead or tail of several milliseconds is compute that the exchange could not
hide. Collectives are told by their XLA names (``all-to-all``,
``all_gather``, ``pmax``, …); on XLA:CPU a collective blocks its thread.

Usage::

  .venv/bin/python -m benchmarks.link --processes 4 --link 100mbit --models resnet110 \\
      --methods "terngrad:exchange='two_phase':bucket_bytes=2097152" --profile /tmp/prof
  .venv/bin/python -m benchmarks.timeline /tmp/prof/*
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
from typing import NamedTuple, Optional, Sequence

COLLECTIVE = re.compile(r"^(all[-_]to[-_]all|all[-_]gather|all[-_]reduce|reduce[-_]scatter|collective[-_]permute|"
                        r"p(max|min|sum)|ppermute)", re.IGNORECASE)
CALL = "PjitFunction("  # the Python call of a jitted function, on the Python thread
WRAPPERS = ("ThunkExecutor::", "CommonPjRt", "ParseArguments")  # runtime spans around kernels, not kernels


class Event(NamedTuple):
  start: int  # ns
  end: int  # ns
  name: str
  python: bool  # on the Python thread


class Spans(NamedTuple):
  """One call's spans, in seconds (see the module docstring); ``lead`` etc. ``None`` without collectives."""

  total: float
  lead: Optional[float]
  collectives: float
  between: Optional[float]
  tail: Optional[float]
  count: int  # collectives


def read(path: str) -> list[Event]:
  """The events of one ``.xplane.pb`` trace."""
  import jax  # pylint: disable=g-import-not-at-top
  out = []
  for plane in jax.profiler.ProfileData.from_file(path).planes:
    for line in plane.lines:
      python = line.name == "python"
      out.extend(Event(e.start_ns, e.start_ns + e.duration_ns, e.name, python) for e in line.events)
  return sorted(out)


def _union(intervals: Sequence[tuple[int, int]]) -> int:
  total, reach = 0, None
  for lo, hi in sorted(intervals):
    if reach is None or lo > reach:
      total += hi - lo
      reach = hi
    elif hi > reach:
      total += hi - reach
      reach = hi
  return total


def spans(events: Sequence[Event]) -> list[Spans]:
  """Every call's :class:`Spans`: a call runs from its ``PjitFunction`` event to the next call's."""
  starts = sorted({e.start for e in events if e.python and e.name.startswith(CALL)})
  out = []
  for i, start in enumerate(starts):
    stop = starts[i + 1] if i + 1 < len(starts) else None
    ops = [e for e in events if not e.python and e.start >= start and (stop is None or e.start < stop)
           and not e.name.startswith(WRAPPERS)]
    if not ops:
      continue
    end = max(e.end for e in ops)
    coll = [(e.start, e.end) for e in ops if COLLECTIVE.match(e.name)]
    s = 1e-9
    if not coll:
      out.append(Spans((end - start) * s, None, 0.0, None, None, 0))
      continue
    first, last = min(lo for lo, _ in coll), max(hi for _, hi in coll)
    busy = _union(coll)
    out.append(Spans(total=(end - start) * s, lead=(first - start) * s, collectives=busy * s,
                     between=(last - first - busy) * s, tail=(end - last) * s, count=len(coll)))
  return out


def _median(values) -> Optional[float]:
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def _ms(v: Optional[float]) -> str:
  return "" if v is None else f"{v * 1e3:.1f}"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("dirs", nargs="+", help="trace directories (benchmarks.link --profile DIR/<method>), or .xplane.pb files")
  args = p.parse_args(argv)
  print("| trace | calls | step ms | lead ms | collectives ms (count) | between ms | tail ms |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for d in args.dirs:
    files = [d] if d.endswith(".xplane.pb") else sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True))
    if not files:
      raise SystemExit(f"no .xplane.pb trace under {d!r}")
    calls = spans(read(files[-1]))
    if not calls:
      raise SystemExit(f"no jitted call in {files[-1]!r}")
    print(f"| {os.path.basename(os.path.normpath(d))} | {len(calls)} | {_ms(_median(c.total for c in calls))} | "
          f"{_ms(_median(c.lead for c in calls))} | {_ms(_median(c.collectives for c in calls))} "
          f"({_median(c.count for c in calls):.0f}) | {_ms(_median(c.between for c in calls))} | "
          f"{_ms(_median(c.tail for c in calls))} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
