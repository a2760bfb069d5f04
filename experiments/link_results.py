"""Reading the link benchmark's results: method specs, link rates, and the rows of its tables.

``benchmarks/link.py`` writes one JSON document per run (``runs/link/``); the experiments'
reports and the benchmarks read them with these functions, so that the reports import nothing
from ``benchmarks/``.
"""

from __future__ import annotations


def method_spec(method: str) -> tuple[str, dict]:
  """``"name:key=value:..."`` as ``(name, kwargs)``; values are Python literals, else strings.

  ``name`` is a registered compressor or optimizer wrapper (``jaxcomp.names()``).
  """
  import ast  # pylint: disable=g-import-not-at-top
  from jaxcomp import compressors  # pylint: disable=g-import-not-at-top
  name, *pairs = method.split(":")
  if name not in compressors.names():  # compressors and optimizer wrappers (local_steps)
    raise ValueError(f"unknown method {name!r} in {method!r}; known: {', '.join(compressors.names())}")
  kwargs = {}
  for pair in pairs:
    key, eq, value = pair.partition("=")
    if not eq or not key:
      raise ValueError(f"bad argument {pair!r} in {method!r}: key=value expected")
    try:
      kwargs[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      kwargs[key] = value
  return name, kwargs


def bench_compressor(name: str, kwargs: dict):
  """The Compressor that registry factory ``name`` builds with ``kwargs``."""
  from experiments import throughput  # pylint: disable=g-import-not-at-top
  return throughput.compressor_of(name, **kwargs)


def modelled_seconds(method: str, n: int, processes: int, link: str, latency: float):
  """``jaxcomp.perfmodel``'s time for one exchange (``None`` on an unshaped link).

  The α-β model of :func:`jaxcomp.perfmodel.exchange_costs` with ``B`` the
  link's RATE (in bytes/s) and ``α`` the measured latency of a one-value
  all-reduce; float for ``none``, else the method's exchange.
  """
  from jaxcomp import perfmodel  # pylint: disable=g-import-not-at-top
  from jaxcomp.exchange import plan  # pylint: disable=g-import-not-at-top
  rate = rate_bits_per_second(link)
  if not rate:
    return None
  name, kwargs = method_spec(method)
  exchange = kwargs.pop("exchange", "all_gather")
  compressor = None if name == "none" else bench_compressor(name, kwargs)
  costs = perfmodel.exchange_costs(compressor, n, processes, rate / 8, latency)
  if compressor is None:
    return costs["float"].seconds
  used = plan.choose(compressor, n, processes, exchange)
  return (costs[used] or costs["all_gather"]).seconds


def table_rows(docs):
  """Rows of flat-vector results: ``(processes, link, n, method, median_s, bytes, speedup, wire_ratio, modelled_s)``."""
  rows = []
  for doc in docs:
    by_n = {}
    for r in doc["results"]:
      if "model" not in r:
        by_n.setdefault(r["n"], []).append(r)
    for n, results in sorted(by_n.items()):
      base = next((r for r in results if r["method"] == "none"), None)
      for r in results:
        speedup = base["median_s"] / r["median_s"] if base else None
        ratio = base["bytes_on_wire"] / r["bytes_on_wire"] if base else None
        model = modelled_seconds(r["method"], n, doc["processes"], doc["link"], doc.get("latency_s", 0.0))
        rows.append((doc["processes"], doc["link"], n, r["method"], r["median_s"], r["bytes_on_wire"],
                     speedup, ratio, model))
  return rows


def rate_bits_per_second(link: str) -> float:
  """A document's ``link`` (``RATE[,DELAY]``) in bit/s; 0 for an unshaped (loopback) run."""
  from experiments import netns  # pylint: disable=g-import-not-at-top
  try:
    return netns.rate_bits_per_second(netns.parse_link(link).rate)
  except netns.LaunchError:
    return 0.0
