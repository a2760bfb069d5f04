"""Encode + decode throughput of every registered compressor, beside a float32 copy.

For each compressor in :data:`jaxcomp.REGISTRY` (built with its default
arguments) and each tensor size, on one synthetic float32 Gaussian tensor
(synthetic data: this is a throughput benchmark only):

* ``encode``: ``jit(x, key -> encode(x, key, agree(x)))``, the payload
  materialised (block_until_ready on its arrays);
* ``decode``: ``jit(payload -> decode(payload, shape))``;
* ``throughput = n / (t_encode + t_decode)`` in million elements per second;
* compressors with a custom exchange (several collectives, e.g. PowerSGD) are
  timed through ``exchange(x, key, axis_name=None, state)`` as one call.

The reference is a jitted float32 multiply-copy ``x * 2`` of the same tensor
(it reads and writes every element once: the memory-bandwidth bound). Every
repeat times the copy, the encode and the decode back to back; times are the
medians over ``--repeats`` repeats (after two warm-up calls each), and
``vs copy`` is the median of the per-repeat ratios ``t_copy / (t_encode +
t_decode)``, so each ratio compares calls made side by side on a shared,
noisy machine.

Usage::

    python -m benchmarks.compressors [--sizes 1M,4M,16M] [--repeats 7] [--only terngrad,threelc]
        [--json out.json] [--markdown]
    python -m benchmarks.compressors --combine run1.json run2.json run3.json

Prints a table and a JSON document (to stdout, or to ``--json``). ``--combine``
prints one table from several runs' JSON files: median times, every run's
ratio, and the target judged on the ratios' median (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import jax
import jax.numpy as jnp

from experiments import throughput
import jaxcomp

# This project's throughput targets, as fractions of a float32 copy's: every compressor at
# least 10%; TernGrad, 3LC, int8 and the compressors the other frameworks ship (half precision,
# random-k, natural, Signum, DGC, 1-bit Adam's code) at least 25%.
TARGET_ALL = 0.10
TARGET_FAST = {name: 0.25 for name in ("terngrad", "threelc", "int8", "half", "randomk", "natural",
                                       "signum", "dgc", "onebit_adam")}

# The per-tensor code of optimizer wrappers that have one (they are not in jaxcomp.REGISTRY).
WRAPPER_CODES = {"onebit_adam": lambda: jaxcomp.OneBitAdamSign()}

# Variants beyond the registry defaults that the docs quote (name -> (registry name, kwargs)).
VARIANTS = {
    "threelc[capacity=0.5]": ("threelc", {"capacity": 0.5}),
    "qsgd[8bit]": ("qsgd", {"bits_per_value": 8}),
    "blockint[4bit]": ("blockint", {"bits": 4}),
}


def emit(doc: dict, path: str = "") -> dict:
  """Writes the JSON document ``doc`` to ``path``, or prints it without one; returns it."""
  text = json.dumps(doc, indent=1, default=float)
  if path:
    with open(path, "w") as f:
      f.write(text + "\n")
  else:
    print(text)
  return doc


def markdown(results: list[dict]) -> str:
  """The results as a Markdown table (median ms; ratio = median of per-repeat t_copy / t_compressor)."""
  lines = [
      "| compressor | n | encode ms | decode ms | M el/s | copy M el/s | vs copy | target |",
      "|---|---:|---:|---:|---:|---:|---:|---|",
  ]
  for r in results:
    lines.append(
        f"| `{r['compressor']}` | {throughput.size_label(r['size'])} | "
        f"{_ms(r.get('encode_s', float('nan')))} | "
        f"{_ms(r.get('decode_s', float('nan')))} | {r['melem_per_s']:.0f} | {r['copy_melem_per_s']:.0f} | "
        f"{r['vs_copy']:.1%} | {_verdict(r['vs_copy'], r['target'])} |"
    )
  return "\n".join(lines)


def _ms(seconds: float) -> str:
  """Milliseconds for the tables; NaN (timed as one exchange) as a dash."""
  return "—" if seconds != seconds else f"{seconds * 1e3:.2f}"


def _verdict(ratio: float, target: float) -> str:
  return f"{'met' if ratio >= target else '**missed**'} ({target:.0%})"


def combine(docs: list[dict]) -> str:
  """One Markdown table from several runs' JSON (``--json``), in the first run's row order.

  Times and throughputs are medians over the runs; every run's ratio is listed,
  and the target is judged on their median. A row missing from a run is an
  error: runs of different sets are not combined.

  Raises:
    ValueError: with fewer than two runs, or runs that measured different rows.
  """
  if len(docs) < 2:
    raise ValueError(f"combine needs at least two runs; got {len(docs)}.")
  keys = [(r["compressor"], r["size"]) for r in docs[0]["results"]]
  by_run = [{(r["compressor"], r["size"]): r for r in d["results"]} for d in docs]
  for i, rows in enumerate(by_run):
    if set(rows) != set(keys):
      raise ValueError(f"run {i + 1} measured different rows from run 1: "
                       f"{sorted(set(rows) ^ set(keys))[:4]} ...")
  lines = [f"| compressor | n | encode ms | decode ms | M el/s | copy M el/s | vs copy, runs 1–{len(docs)} "
           "| vs copy, median | target |",
           "|---|---:|---:|---:|---:|---:|---|---:|---|"]
  med = lambda k, rs: statistics.median(r.get(k, float("nan")) for r in rs)
  for key in keys:
    rs = [rows[key] for rows in by_run]
    ratio = med("vs_copy", rs)
    lines.append(
        f"| `{key[0]}` | {throughput.size_label(key[1])} | {_ms(med('encode_s', rs))} | "
        f"{_ms(med('decode_s', rs))} | "
        f"{med('melem_per_s', rs):.0f} | {med('copy_melem_per_s', rs):.0f} | "
        + " / ".join(f"{100 * r['vs_copy']:.1f}" for r in rs)
        + f" | {ratio:.1%} | {_verdict(ratio, rs[0]['target'])} |")
  return "\n".join(lines)


def compressors_by_name(only: str = "", variants: bool = True) -> dict:
  """``{name: Compressor}``: every registry compressor, the wrappers' codes and the variants.

  ``only`` (comma-separated names) keeps those, in its order; ``variants=False``
  leaves out :data:`VARIANTS`.

  Raises:
    ValueError: a name in ``only`` that is none of these.
  """
  entries = {}
  for name in sorted(jaxcomp.REGISTRY):
    try:
      entries[name] = throughput.compressor_of(name)
    except LookupError:
      continue  # "none": the float baseline has no compressor
  for name, code in WRAPPER_CODES.items():
    if name in jaxcomp.compressors.WRAPPERS:
      entries[name] = code()
  if variants:
    for vname, (base, kw) in VARIANTS.items():
      if base in jaxcomp.REGISTRY:
        entries[vname] = throughput.compressor_of(base, **kw)
  wanted = [w.strip() for w in only.split(",") if w.strip()]
  unknown = [w for w in wanted if w not in entries]
  if unknown:
    raise ValueError(f"unknown compressors {unknown}; known: {sorted(entries)}")
  return {k: entries[k] for k in wanted} if wanted else entries


def measure(entries: dict, sizes: list[int], repeats: int) -> list[dict]:
  """One row per size and compressor of ``entries``: :func:`experiments.throughput.bench_one`
  on a Gaussian float32 tensor of that size, with throughputs and the target judged."""
  copy = jax.jit(lambda x: x * jnp.float32(2.0))
  results = []
  for size in sizes:
    x = jax.random.normal(jax.random.PRNGKey(0), (size,), jnp.float32)
    key = jax.random.PRNGKey(1)
    for name, comp in entries.items():
      r = throughput.bench_one(comp, x, key, copy, repeats)
      r.update(compressor=name, size=size, melem_per_s=size / r["total_s"] / 1e6,
               copy_melem_per_s=size / r["copy_s"] / 1e6)
      target = TARGET_FAST.get(name, TARGET_ALL)
      r.update(target=target, meets_target=bool(r["vs_copy"] >= target))
      results.append(r)
      print(f"  measured {name} n={size}: {r['melem_per_s']:.0f} M el/s, {r['vs_copy']:.1%} of copy", file=sys.stderr)
  return results


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                      help="print one Markdown table from several runs' --json files, and stop")
  parser.add_argument("--sizes", default="1M,4M,16M", help="comma-separated element counts (K/M suffixes)")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--only", default="", help="comma-separated compressor names (registry or variant)")
  parser.add_argument("--no-variants", action="store_true", help="registry defaults only")
  parser.add_argument("--json", default="", help="write the JSON here instead of stdout")
  parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown (docs/benchmarks.md)")
  args = parser.parse_args(argv)
  if args.combine:
    docs = []
    for path in args.combine:
      with open(path) as f:
        docs.append(json.load(f))
    print(combine(docs))
    return {"combined": args.combine}

  try:
    entries = compressors_by_name(args.only, variants=not args.no_variants)
  except ValueError as e:
    parser.error(str(e))

  results = measure(entries, [throughput.parse_size(s) for s in args.sizes.split(",")], args.repeats)

  print(f"{'compressor':26s} {'n':>9s} {'enc ms':>8s} {'dec ms':>8s} {'M el/s':>8s} {'copy M/s':>9s} "
        f"{'vs copy':>8s} {'target':>9s}")
  for r in results:
    enc = r.get("encode_s", float("nan")) * 1e3
    dec = r.get("decode_s", float("nan")) * 1e3
    tgt = f"{'ok' if r['meets_target'] else 'MISS'} {r['target']:.0%}"
    print(f"{r['compressor']:26s} {r['size']:9d} {enc:8.2f} {dec:8.2f} {r['melem_per_s']:8.0f} "
          f"{r['copy_melem_per_s']:9.0f} {r['vs_copy']:8.1%} {tgt:>9s}")
  if args.markdown:
    print(markdown(results))
  doc = {
      "benchmark": "compressors",
      "data": "synthetic float32 Gaussian (throughput only)",
      "jax": jax.__version__,
      "backend": jax.default_backend(),
      "machine": platform.machine(),
      "repeats": args.repeats,
      "results": results,
  }
  return emit(doc, args.json)


if __name__ == "__main__":
  main()
