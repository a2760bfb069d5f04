r"""Where an exchange's compute goes: each part of one tensor's exchange, timed alone.

``benchmarks/link.py`` times a whole ``tx.update`` over a link; what it
measures beyond the wire time is compute. This script times the compute
parts of the default exchange (:func:`jaxcomp.exchange.allgather.exchange`) for one
float32 tensor of ``--n`` values, each jitted alone, in one process and with
no collective: ``agree`` (the local part of a pre-exchange agreement, e.g.
TernGrad's max), ``encode``, ``decode`` of the worker's own payload (error
feedback's residual), ``aggregate`` of ``--workers`` gathered payloads
(decode every one and average) and, where the compressor has a
variable-length encoding, ``encoded_bytes`` (its exact size, a metric).
With ``--one-core`` the process is pinned to one CPU (Linux), as each of two
processes sharing a 2-core machine effectively is.

Usage::

  python -m benchmarks.exchange_parts --n 8000000 --workers 2 --one-core \
      --methods terngrad,threelc,threelc:sparsity=1.75:capacity=0.5,onebit,qsgd,int8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _time(fn, *args, calls: int = 7) -> float:
  import jax  # pylint: disable=g-import-not-at-top
  fn = jax.jit(fn)
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(calls):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def parts(method: str, n: int, workers: int) -> dict[str, float]:
  """Median seconds of each part of ``method``'s exchange of ``n`` values."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from benchmarks import link  # pylint: disable=g-import-not-at-top
  name, kwargs = link.method_spec(method)
  kwargs.pop("exchange", None)
  c = link.bench_compressor(name, kwargs)
  x = jnp.asarray(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
  key = jax.random.PRNGKey(0)
  agreed = c.agree(x)
  payload = jax.jit(lambda x: c.encode(x, key, agreed))(x)
  gathered = jax.tree.map(lambda a: jnp.stack([a] * workers), payload)
  out = {"agree": _time(c.agree, x) if agreed is not None else 0.0,
         "encode": _time(lambda x: c.encode(x, key, agreed), x),
         "decode": _time(lambda p: c.decode(p, x.shape), payload),
         "aggregate": _time(lambda g: c.aggregate(g, x.shape), gathered)}
  if c.encoded_bytes(payload, x.shape) is not None:
    out["encoded_bytes"] = _time(lambda p: c.encoded_bytes(p, x.shape), payload)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.exchange_parts", description=__doc__.split("\n")[0])
  p.add_argument("--n", type=int, default=8_000_000)
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--methods", default="terngrad,threelc,onebit,qsgd,int8")
  p.add_argument("--one-core", action="store_true", help="pin this process to CPU 0 (Linux)")
  args = p.parse_args(argv)
  if args.one_core:
    os.sched_setaffinity(0, {0})
  print(f"n = {args.n:,}, {args.workers} payloads aggregated, "
        f"{'one core' if args.one_core else f'{os.cpu_count()} cores'}; median ms of 7 calls")
  print("| method | agree | encode | decode own | aggregate | encoded size | total |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for method in args.methods.split(","):
    r = parts(method, args.n, args.workers)
    cells = [r["agree"], r["encode"], r["decode"], r["aggregate"], r.get("encoded_bytes")]
    print(f"| `{method}` | " + " | ".join("—" if v is None else f"{1e3 * v:.1f}" for v in cells)
          + f" | {1e3 * sum(v for v in cells if v):.1f} |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
