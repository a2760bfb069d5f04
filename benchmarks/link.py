r"""Exchange time over emulated links: one jitted ``shard_map``'d ``tx.update`` at P processes.

Every process (one CPU device each) holds one worker's gradient, a float32
vector of ``--n`` values (normal, seeded by rank), and calls the jitted
exchange ``tx.update`` of each method: quantize, the collective across the
processes (gloo over TCP), decode, average, residual update. With
``--link RATE`` the processes run in their own network namespaces joined by
links shaped to RATE (``experiments.launch``), so the collective's bytes cross
a real, rate-limited network stack instead of shared memory.

Usage::

  sudo .venv/bin/python -m benchmarks.link --processes 2 --link 100mbit \
      --n 8000000 --methods none,terngrad,threelc --trials 5 [--json out.json]

Without ``--link`` the processes talk over loopback (no root needed). The
command re-runs itself under ``experiments.launch``; rank 0 prints one JSON
document: per method the median and minimum of ``--trials`` timed calls (after
``--warmup`` untimed ones, the first of which compiles) and
``bytes_on_wire`` per worker per step (``jaxcomp.metrics``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m benchmarks.link", description=__doc__.split("\n")[0])
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--link", default=None, help="RATE[,DELAY] for experiments.launch --link")
  p.add_argument("--n", type=int, default=8_000_000, help="float32 values per worker")
  p.add_argument("--methods", default="none,terngrad,threelc",
                 help="comma-separated jaxcomp compressor names (none: float pmean)")
  p.add_argument("--trials", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--json", default=None, help="also write the document here (rank 0)")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.n < 1 or args.trials < 1 or args.warmup < 1 or args.processes < 1:
    p.error("--n, --trials, --warmup (it compiles) and --processes must be at least 1")
  return args


def launch_self(args, argv) -> int:
  """Parent mode: runs this module under experiments.launch, one CPU device per process."""
  from experiments import launch  # pylint: disable=g-import-not-at-top
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  own = ["--processes", str(args.processes)] + (["--link", args.link] if args.link else [])
  return launch.main(own + ["--", "-m", "benchmarks.link", "--worker"] + list(argv))


def _build(method, n, mesh):
  """``(step, state)``: the jitted exchange of ``method`` over the mesh and its initial state."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  import jaxcomp  # pylint: disable=g-import-not-at-top
  from jaxcomp import parallel  # pylint: disable=g-import-not-at-top

  nproc = mesh.devices.size
  tx = jaxcomp.get_transform(method, axis_name="d")
  state = parallel.replicate_workers(tx.init({"g": jnp.zeros((n,), jnp.float32)}), nproc)
  specs = parallel.worker_specs(state, "d")

  def per_device(g, s):  # one worker per device: drop its worker axis of size 1, then restore it
    upd, s2 = tx.update({"g": g[0]}, parallel.worker_slice(s, 0))
    wire = jaxcomp.metrics(s2)["bytes_on_wire"].traced()  # this worker's, per step, exact
    return upd["g"], jnp.stack([wire.hi, wire.lo])[None], parallel.expand_workers(s2)

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("d"), specs),
                               out_specs=(P(), P("d"), specs)), donate_argnums=(1,))
  state = jax.tree.map(
      lambda a, sp: jax.make_array_from_callback(a.shape, jax.sharding.NamedSharding(mesh, sp),
                                                 lambda idx: a[idx]), state, specs)
  return step, state


def _words_to_int(words) -> int:
  """The exact count from a Count's (hi, lo) uint32 words."""
  hi, lo = (int(w) for w in words)
  return hi * 2**32 + lo


def worker(args) -> int:
  """One process: time each method's exchange; rank 0 prints the JSON document."""
  from experiments import distributed  # pylint: disable=g-import-not-at-top
  if not distributed.initialize_from_env():
    raise SystemExit("benchmarks.link --worker runs under experiments.launch")
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  if jax.local_device_count() != 1:
    raise SystemExit(f"one CPU device per process expected, got {jax.local_device_count()} "
                     "(XLA_FLAGS)")
  rank = jax.process_index()
  mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  local = np.random.default_rng(rank).standard_normal((1, args.n), dtype=np.float32)
  g = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
  results = []
  for method in args.methods.split(","):
    step, state = _build(method, args.n, mesh)
    for _ in range(args.warmup):
      upd, wire, state = step(g, state)
      jax.block_until_ready(upd)
    times = []
    for _ in range(args.trials):
      t0 = time.perf_counter()
      upd, wire, state = step(g, state)
      jax.block_until_ready(upd)
      times.append(time.perf_counter() - t0)
    results.append({"method": method, "median_s": statistics.median(times), "min_s": min(times),
                    "times_s": times,
                    "bytes_on_wire": _words_to_int(np.asarray(wire.addressable_data(0))[0])})
    if rank == 0:
      print(f"{method}: median {results[-1]['median_s']:.3f} s over {args.trials} calls, "
            f"{results[-1]['bytes_on_wire']:,} bytes on the wire per worker", flush=True)
  if rank == 0:
    doc = {"benchmark": "link", "processes": jax.process_count(),
           "link": os.environ.get("JAXCOMP_LINK", "loopback (not shaped)"), "n": args.n,
           "trials": args.trials, "warmup": args.warmup, "jax": jax.__version__,
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "results": results}
    text = json.dumps(doc, indent=1)
    print(text, flush=True)
    if args.json:
      with open(args.json, "w") as f:
        f.write(text + "\n")
  jax.distributed.shutdown()
  return 0


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = _parse(argv)
  return worker(args) if args.worker else launch_self(args, argv)


if __name__ == "__main__":
  sys.exit(main())
