"""Encode + decode throughput of one compressor, timed beside a float32 copy.

What ``benchmarks.compressors`` (every registered compressor) and
``experiments.zoo`` (the zoo's throughput step) both measure:
:func:`compressor_of` builds the ``Compressor`` a registry factory wraps,
:func:`bench_one` times its encode and decode against a jitted float32 copy,
and :func:`parse_size` / :func:`size_label` read and write tensor sizes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable
from unittest import mock

import jax

import jaxcomp
from jaxcomp import core
from jaxcomp import transforms
from jaxcomp.exchange import transport


def compressor_of(name: str, **kwargs: Any) -> core.Compressor:
  """The Compressor a registry factory builds (every factory calls ``transforms.compress``)."""
  captured = []
  real = transforms.compress

  def capture(compressor, **kw):
    captured.append(compressor)
    return real(compressor, **kw)

  with mock.patch.object(transforms, "compress", capture):
    jaxcomp.REGISTRY[name](**kwargs)
  if not captured or captured[-1] is None:
    raise LookupError(f"{name!r} builds no compressor")
  return captured[-1]


def parse_size(s: str) -> int:
  """``"4M"`` -> 4 * 2**20 (``K``, ``M``, ``G``: powers of 1024)."""
  s = s.strip().upper()
  mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(s[-1:], 1)
  return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def _block(tree):
  for leaf in jax.tree.leaves(tree):
    leaf.block_until_ready()
  return tree


def _once(fn: Callable[[], Any]) -> float:
  t0 = time.perf_counter()
  _block(fn())
  return time.perf_counter() - t0


def bench_one(comp: core.Compressor, x: jax.Array, key: jax.Array, copy: Callable, repeats: int) -> dict[str, float]:
  """Median times of encode, decode and the copy, and the median of the per-repeat ratios.

  Every repeat times the copy, the encode and the decode back to back, so a
  ratio compares calls made within milliseconds of each other (the machine is
  shared: its speed drifts between repeats).
  """
  shape = x.shape
  if comp.custom_exchange:
    state = comp.init_state(shape, jax.random.PRNGKey(1))
    # The payload is an output too, so XLA cannot drop the encoding work the mean does not need.
    ex = jax.jit(lambda x, k, s: (lambda e: (e.mean, e.payload, e.state))(transport.run(comp.exchange(x, k, None, s), None)))
    steps = {"total_s": lambda: ex(x, key, state)}
    payload_bytes = float("nan")
  else:
    enc = jax.jit(lambda x, k: comp.encode(x, k, comp.agree(x)))
    dec = jax.jit(lambda p: comp.decode(p, shape))
    payload = _block(enc(x, key))
    steps = {"encode_s": lambda: enc(x, key), "decode_s": lambda: dec(payload)}
    payload_bytes = core.tree_nbytes(payload)
  for fn in list(steps.values()) * 2 + [lambda: copy(x)] * 2:  # warm-up (compiles)
    _block(fn())
  samples = {k: [] for k in steps}
  copies, ratios = [], []
  for _ in range(repeats):
    t_copy = _once(lambda: copy(x))
    ts = {k: _once(fn) for k, fn in steps.items()}
    for k, t in ts.items():
      samples[k].append(t)
    copies.append(t_copy)
    ratios.append(t_copy / sum(ts.values()))
  out = {k: statistics.median(v) for k, v in samples.items()}
  if "total_s" not in out:
    out["total_s"] = statistics.median([e + d for e, d in zip(samples["encode_s"], samples["decode_s"])])
  out.update(copy_s=statistics.median(copies), vs_copy=statistics.median(ratios), payload_bytes=payload_bytes)
  return out


def size_label(n: int) -> str:
  """``1M``, ``4M + 3``: sizes as the tables write them."""
  base = n // 2**20
  return f"{base}M" if n == base * 2**20 else (f"{base}M + {n - base * 2**20}" if base else f"{n:,}")
