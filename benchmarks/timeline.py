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
**Overlapped** is the time within the collectives' spans during which a kernel
ran on another thread (of this call or, dispatched asynchronously, the next):
compute the exchange did hide.

``--call NAME`` keeps only the calls of the jitted function ``NAME`` (a
training step is ``step``); ``--collective REGEX`` counts only the collectives
whose names match (``psum``: a float exchange's mean, not the metrics'
all-reduces). Calls without such a collective
are reported apart, as silent steps. A call's spans assume it ran before the
next call was made (steps waited for); pipelined calls overlap their windows.

Usage::

  .venv/bin/python -m benchmarks.link --processes 4 --link 100mbit --models resnet110 \\
      --methods "terngrad:exchange='two_phase':bucket_bytes=2097152" --profile /tmp/prof
  .venv/bin/python -m benchmarks.timeline /tmp/prof/*
  sudo .venv/bin/python -m benchmarks.train_step_link --configs gpt_zoo --link 10mbit --steps 50 \\
      --methods diloco:inner_steps=50:fragments=4:delay=1 --profile /tmp/steps
  .venv/bin/python -m benchmarks.timeline /tmp/steps/* --call step --collective psum
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
WRAPPERS = ("ThunkExecutor::", "CommonPjRt", "ParseArguments", "ThreadpoolListener::", "SlinkyThreadPool::",
            "end: ")  # runtime spans around kernels, and markers: not kernels
CONTROL = re.compile(r"^(conditional|call|while)(\.[\w.]*)?$")  # thunks that run other thunks: not kernels


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
  overlapped: Optional[float] = None  # of the collectives' spans, the time a kernel (of any call) ran beside them


def read(path: str) -> list[Event]:
  """The events of one ``.xplane.pb`` trace."""
  import jax  # pylint: disable=g-import-not-at-top
  out = []
  for plane in jax.profiler.ProfileData.from_file(path).planes:
    for line in plane.lines:
      python = line.name == "python"
      out.extend(Event(e.start_ns, e.start_ns + e.duration_ns, e.name, python) for e in line.events)
  return sorted(out)


def _merged(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
  """The union of ``intervals`` as sorted, disjoint intervals."""
  out = []
  for lo, hi in sorted(intervals):
    if out and lo <= out[-1][1]:
      out[-1] = (out[-1][0], max(out[-1][1], hi))
    else:
      out.append((lo, hi))
  return out


def _union(intervals: Sequence[tuple[int, int]]) -> int:
  return sum(hi - lo for lo, hi in _merged(intervals))


def _intersection(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
  """The length of ``a`` within ``b``, both :func:`_merged`."""
  total, i, j = 0, 0, 0
  while i < len(a) and j < len(b):
    total += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
    if a[i][1] < b[j][1]:
      i += 1
    else:
      j += 1
  return total


def _kernels(events: Sequence[Event]) -> list[tuple[int, int]]:
  """When any kernel of any call ran (:func:`_merged`): not the collectives, wrappers or control flow."""
  return _merged([(e.start, e.end) for e in events if not e.python and not e.name.startswith(WRAPPERS)
                  and not COLLECTIVE.match(e.name) and not CONTROL.match(e.name)])


def _calls(events: Sequence[Event], call: Optional[str]) -> list[tuple[int, Optional[int]]]:
  """``(start, stop)`` of every jitted call (of the function ``call`` only, if given): from its event
  to the next call's, of any function."""
  starts = sorted({e.start for e in events if e.python and e.name.startswith(CALL)})
  mine = {e.start for e in events if e.python and (call is None or e.name == f"{CALL}{call})")}
  return [(start, starts[i + 1] if i + 1 < len(starts) else None) for i, start in enumerate(starts)
          if start in mine]


def spans(events: Sequence[Event], call: Optional[str] = None, collective=COLLECTIVE) -> list[Spans]:
  """Every call's :class:`Spans`: a call runs from its ``PjitFunction`` event to the next call's.

  ``call``: only the calls of that jitted function; ``collective``: only the collectives whose
  names it matches count as such.
  """
  kernels = _kernels(events)
  out = []
  for start, stop in _calls(events, call):
    ops = [e for e in events if not e.python and e.start >= start and (stop is None or e.start < stop)
           and not e.name.startswith(WRAPPERS)]
    if not ops:
      continue
    end = max(e.end for e in ops)
    coll = [(e.start, e.end) for e in ops if collective.match(e.name)]
    s = 1e-9
    if not coll:
      out.append(Spans((end - start) * s, None, 0.0, None, None, 0))
      continue
    first, last = min(lo for lo, _ in coll), max(hi for _, hi in coll)
    busy = _union(coll)
    out.append(Spans(total=(end - start) * s, lead=(first - start) * s, collectives=busy * s,
                     between=(last - first - busy) * s, tail=(end - last) * s, count=len(coll),
                     overlapped=_intersection(_merged(coll), kernels) * s))
  return out


def beside(events: Sequence[Event], collective=COLLECTIVE) -> list[tuple[float, float]]:
  """``(seconds, overlapped seconds)`` of every collective in ``events`` whose name ``collective``
  matches: how long it ran, and for how long a kernel (of any call) ran beside it."""
  kernels = _kernels(events)
  return [((e.end - e.start) * 1e-9, _intersection([(e.start, e.end)], kernels) * 1e-9)
          for e in events if not e.python and collective.match(e.name)]


def _median(values) -> Optional[float]:
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def _ms(v: Optional[float]) -> str:
  return "" if v is None else f"{v * 1e3:.1f}"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("dirs", nargs="+", help="trace directories (benchmarks.link --profile DIR/<method>), or .xplane.pb files")
  p.add_argument("--call", default=None, help="only the calls of this jitted function (a training step: step)")
  p.add_argument("--collective", default=None, metavar="REGEX",
                 help="count only the collectives whose XLA names match (e.g. psum); default: every collective")
  args = p.parse_args(argv)
  collective = COLLECTIVE if args.collective is None else re.compile(args.collective)
  print("| trace | calls | with collectives | step ms | silent step ms | lead ms | collectives ms (count) "
        "| overlapped ms | between ms | tail ms |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for d in args.dirs:
    files = [d] if d.endswith(".xplane.pb") else sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True))
    if not files:
      raise SystemExit(f"no .xplane.pb trace under {d!r}")
    calls = spans(read(files[-1]), args.call, collective)
    if not calls:
      raise SystemExit(f"no jitted call in {files[-1]!r}")
    busy = [c for c in calls if c.count] or calls
    silent = [c.total for c in calls if not c.count]
    print(f"| {os.path.basename(os.path.normpath(d))} | {len(calls)} | {len(calls) - len(silent)} | "
          f"{_ms(_median(c.total for c in busy))} | {_ms(_median(silent))} | {_ms(_median(c.lead for c in busy))} | "
          f"{_ms(_median(c.collectives for c in busy))} ({_median(c.count for c in busy):.0f}) | "
          f"{_ms(_median(c.overlapped for c in busy))} | {_ms(_median(c.between for c in busy))} | "
          f"{_ms(_median(c.tail for c in busy))} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
