r"""DR-F2: all-reduce time vs square matrix size, over real collectives (Dryden et al. §4.2, Fig. 2).

The paper's synthetic benchmark: every worker holds its own square matrix of
"uniformly random 32-bit floats centered on 0" and the workers all-reduce
them, for sizes 64² to 16384², twenty trials each, for MPI_Allreduce
("normal"), one-bit, threshold (τ = 3.875, "chosen to leave 1/32 of the
data") and adaptive (π = 64) quantization. Its result: MPI_Allreduce wins at
small sizes; at 16384², adaptive is 1.76× faster than MPI_Allreduce; one-bit
and threshold never beat it (128 nodes × 2 processes, InfiniBand QDR).

Here, with the same input (the paper's own synthetic input, not gradients):

* **Workers**: ``--devices`` (default 8) XLA host CPU devices
  (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set by this script
  when absent), one worker per device, under ``jax.shard_map``. Every method
  is a ``jaxcomp`` transform with ``axis_name`` (``jaxcomp.compress(None)``: a float
  ``lax.pmean``; the compressors: encode → ``lax.all_gather`` of the packed
  payload → decode and average, with error feedback), so what is timed is
  one whole ``tx.update``: quantization, the collective, dequantization, the
  mean and the residual update.
* **Data**: worker ``i``'s matrix is uniform on ``[-4, 4)`` (seeded per size
  and worker). Uniform on ``[-a, a)`` leaves ``(a − τ)/a`` of the entries
  above τ in magnitude, so ``a = 4`` is the range for which the paper's τ =
  3.875 leaves 1/32 of the data. The same matrix is reduced in every trial,
  as the paper's repeated trials; the error-feedback residual carries over
  between trials (the paper: threshold's residual "builds up" and more is
  sent in later trials).
* **Settings**: one-bit and adaptive with 128-entry column samples (LBANN's
  ``NUM_ONEBIT_SAMPLES`` / ``NUM_PTA_SAMPLES``; §4.2 "Sampling is crucial");
  threshold and adaptive with word slots for 1/32 of the entries (of each
  column for adaptive), the bytes of one-bit's bits. One-bit runs no AdaGrad
  step inside the exchange (§4.2 disables it for fairness too).
* **Timing**: ``--trials`` (default 20, the paper's) timed calls after
  ``--warmup`` untimed ones; the median is reported (and the mean, the
  paper's statistic). ``bytes_on_wire`` is what one worker hands to the
  collective per all-reduce (``jaxcomp.metrics``); ``encoded_bytes`` the exact
  size of the variable-length stream the paper sends (threshold, adaptive);
  ``overflow`` the entries over τ (or over the sampled thresholds) that did
  not fit the slots in the last trial and stayed in the residual.

The "network" of host devices is shared memory, so compression can only cost
time here: the paper's crossover, where fewer bytes beat MPI_Allreduce on a
real network, is not expected to reproduce. And ``jaxcomp`` exchanges by
all-gather (every worker receives all ``N`` payloads, ``N·n/r`` bytes), not
the paper's reduce-scatter → re-quantize → all-gather (§3.4, about ``2n/r``).

Usage::

    python -m benchmarks.allreduce [--sizes 64,128,...,4096] [--trials 20] [--devices 8]
        [--methods normal,onebit,threshold,adaptive] [--json out.json]
        [--run_dir runs/DR-F2/uniform_synthetic/host_cpu_8dev]

Prints a table and a JSON document (to stdout, or to ``--json``). With
``--run_dir`` it also writes the document as that directory's
``summary.json``, beside ``config.json`` (the arguments) and ``command.txt``,
the layout of a training run, so ``python -m experiments.report`` finds it
(``runs/DR-F2/<input>/<setup>``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

if "jax" not in sys.modules and "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  _n = 8
  for _i, _a in enumerate(sys.argv):
    if _a.startswith("--devices="):
      _n = int(_a.split("=", 1)[1])
    elif _a == "--devices" and _i + 1 < len(sys.argv):
      _n = int(sys.argv[_i + 1])
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_n}").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcomp  # noqa: E402
from jaxcomp import parallel  # noqa: E402

AXIS = "workers"
TAU = 3.875  # Fig. 2: "Threshold used τ = 3.875 (chosen to leave 1/32 of the data)"
RANGE = 4.0  # uniform on [-RANGE, RANGE): (RANGE - TAU) / RANGE = 1/32 of the entries exceed τ
SAMPLES = 128  # LBANN's NUM_ONEBIT_SAMPLES and NUM_PTA_SAMPLES
PAPER = {
    "source": "Dryden et al. 2016, §4.2, Figure 2 (128 nodes x 2 processes, InfiniBand QDR)",
    "sizes": "64^2 to 16384^2",
    "trials": 20,
    "statistic": "mean of 20 trials",
    "largest_size_speedup_adaptive_vs_normal": 1.76,
    "claims": [
        "MPI_Allreduce (normal) is faster at small sizes",
        "at 16384^2 adaptive quantization is 1.76x faster than MPI_Allreduce",
        "one-bit and threshold are not faster than MPI_Allreduce at any size",
    ],
}


def make_tx(method: str, axis_name):
  """The ``jaxcomp`` transform of one method of Fig. 2."""
  if method == "normal":
    return jaxcomp.compress(None, axis_name=axis_name)
  if method == "onebit":
    return jaxcomp.onebit(sample=SAMPLES, axis_name=axis_name)
  if method == "threshold":
    return jaxcomp.threshold(tau=TAU, capacity=1 / 32, axis_name=axis_name)
  if method == "adaptive":
    return jaxcomp.adaptive(1 / 64, sample=SAMPLES, capacity=1 / 32, axis_name=axis_name)
  raise ValueError(f"unknown method {method!r}")


METHODS = ("normal", "onebit", "threshold", "adaptive")


def build(method: str, size: int, mesh) -> tuple[Any, Any, Any]:
  """``(step, x, state)``: a jitted all-reduce over the mesh, the workers' matrices and the initial state."""
  n = mesh.devices.size
  tx = make_tx(method, AXIS)
  params = {"w": jnp.zeros((size, size), jnp.float32)}
  state = parallel.replicate_workers(tx.init(params), n)
  specs = parallel.worker_specs(state, AXIS)

  def per_device(x, s):  # one worker per device: drop its local worker axis of size 1, then restore it
    upd, s2 = tx.update({"w": x[0]}, parallel.worker_slice(s, 0))
    return upd["w"], parallel.expand_workers(s2)

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(AXIS), specs), out_specs=(P(), specs)),
                 donate_argnums=(1,))
  shard = NamedSharding(mesh, P(AXIS))

  @jax.jit
  def make_x(key):
    keys = jax.random.split(key, n)
    return jax.vmap(lambda k: jax.random.uniform(k, (size, size), jnp.float32, -RANGE, RANGE))(keys)

  x = jax.device_put(make_x(jax.random.PRNGKey(size)), shard)
  state = jax.device_put(state, jax.tree.map(lambda sp: NamedSharding(mesh, sp), specs))
  return step, x, state


def bench(method: str, size: int, mesh, trials: int, warmup: int) -> dict[str, Any]:
  step, x, state = build(method, size, mesh)
  t0 = time.perf_counter()
  out, state = step(x, state)
  jax.block_until_ready(out)
  compile_s = time.perf_counter() - t0
  for _ in range(max(0, warmup - 1)):
    out, state = step(x, state)
    jax.block_until_ready(out)
  times = []
  for _ in range(trials):
    t0 = time.perf_counter()
    out, state = step(x, state)
    jax.block_until_ready(out)
    times.append(time.perf_counter() - t0)
  m = {k: float(v[0]) if np.ndim(v) else float(v) for k, v in jax.device_get(jaxcomp.metrics(state)).items()}
  n = mesh.devices.size
  err = float(jnp.sqrt(jnp.mean((out - jnp.mean(x, axis=0)) ** 2)))
  return {
      "method": method,
      "size": size,
      "elements": size * size,
      "workers": n,
      "median_s": statistics.median(times),
      "mean_s": statistics.fmean(times),
      "min_s": min(times),
      "max_s": max(times),
      "times_s": times,
      "first_call_s": compile_s,
      "bytes_on_wire": m["bytes_on_wire"],
      "float32_bytes": m["float32_bytes"],
      "compression_ratio": m["float32_bytes"] / m["bytes_on_wire"],
      "encoded_bytes": m["encoded_bytes"],
      "overflow": m.get("overflow"),
      # Model, not measured: bytes one worker receives. all_gather: the other N-1 payloads;
      # a ring all-reduce of the float32 matrix: 2 (N-1)/N of it.
      "received_bytes_model": (2 * (n - 1) / n * m["float32_bytes"] if method == "normal"
                               else (n - 1) * m["bytes_on_wire"]),
      "rms_error_vs_exact_mean": err,
  }


def table(results: list[dict]) -> str:
  lines = [
      "| size | method | median ms | mean ms | speedup vs normal | bytes on wire / worker | ratio | encoded bytes | overflow |",
      "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  normal = {r["size"]: r["median_s"] for r in results if r["method"] == "normal"}
  for r in results:
    vs = normal.get(r["size"])
    speed = "—" if vs is None else f"{vs / r['median_s']:.2f}×"
    overflow = "—" if r["overflow"] is None else f"{r['overflow']:,.0f}"
    lines.append(
        f"| {r['size']}² | {r['method']} | {1e3 * r['median_s']:.2f} | {1e3 * r['mean_s']:.2f} | "
        f"{speed} | {r['bytes_on_wire']:,.0f} | {r['compression_ratio']:.1f} | "
        f"{r['encoded_bytes']:,.0f} | {overflow} |")
  return "\n".join(lines)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", default="64,128,256,512,1024,2048,4096",
                      help="comma-separated matrix heights (square matrices)")
  parser.add_argument("--methods", default=",".join(METHODS))
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--json", default="", help="write the JSON document here")
  parser.add_argument("--run_dir", default="", help="also write config.json, summary.json, command.txt here")
  args = parser.parse_args(argv)
  if jax.device_count() < args.devices:
    raise SystemExit(f"{args.devices} devices requested but JAX sees {jax.device_count()}; set "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={args.devices} before importing jax.")
  mesh = jax.make_mesh((args.devices,), (AXIS,), axis_types=(jax.sharding.AxisType.Explicit,),
                       devices=jax.devices()[:args.devices])
  sizes = [int(s) for s in args.sizes.split(",") if s]
  methods = [m for m in args.methods.split(",") if m]
  results = []
  for size in sizes:
    for method in methods:
      r = bench(method, size, mesh, args.trials, args.warmup)
      results.append(r)
      print(f"{size:6d}² {method:10s} median {1e3 * r['median_s']:9.2f} ms  mean {1e3 * r['mean_s']:9.2f} ms  "
            f"wire {r['bytes_on_wire']:>13,.0f} B  overflow {r['overflow']}", file=sys.stderr, flush=True)
  command = "python -m benchmarks.allreduce " + " ".join(sys.argv[1:] if argv is None else argv)
  doc = {
      "benchmark": "DR-F2 all-reduce time vs square matrix size",
      "experiment": "DR-F2",
      "command": command,
      "data": (f"synthetic, as the paper's benchmark: each worker's matrix uniform on [-{RANGE}, {RANGE}), "
               f"tau = {TAU} leaves 1/32 of the entries"),
      "collectives": f"jax.shard_map over {args.devices} XLA host CPU devices (shared memory, no network)",
      "trials": args.trials,
      "warmup": args.warmup,
      "paper": PAPER,
      "jax_version": jax.__version__,
      "backend": jax.default_backend(),
      "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                  "loadavg_at_end": os.getloadavg()},
      "results": results,
  }
  print(table(results))
  text = json.dumps(doc, indent=1)
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      f.write(text + "\n")
  elif not args.run_dir:
    print(text)
  if args.run_dir:
    os.makedirs(args.run_dir, exist_ok=True)
    with open(os.path.join(args.run_dir, "config.json"), "w") as f:
      json.dump(dict(vars(args), experiment="DR-F2"), f, indent=2)
    with open(os.path.join(args.run_dir, "summary.json"), "w") as f:
      f.write(text + "\n")
    with open(os.path.join(args.run_dir, "command.txt"), "w") as f:
      f.write(command + "\n")
  return doc


if __name__ == "__main__":
  main()
