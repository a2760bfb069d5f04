r"""Does the runtime run compute beside a collective? Three ways of putting them together, at P processes.

Every process holds ``--n`` float32 values to sum across the processes (``psum``, the
exchange) and a 512 x 512 matrix for ``--matmuls`` matrix products (the compute, which does not
depend on the exchange). Rank 0 traces three calls of each way (after one untimed call) and
reads from its trace (:func:`benchmarks.timeline.beside`) how long each psum ran and how long a
kernel ran beside it:

* ``together``: one program, the psum and the compute both at its top level;
* ``cond``: the same with the psum inside a ``lax.cond`` (as DiLoCo's exchanges are);
* ``two_programs``: the psum and the compute as two programs, the second called before the first
  has finished (JAX's asynchronous dispatch).

Usage::

  sudo .venv/bin/python -m benchmarks.overlap --link 10mbit --n 33536 --matmuls 60 --json out.json
  XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false sudo -E .venv/bin/python -m benchmarks.overlap ...
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from benchmarks import link
from benchmarks import timeline

WAYS = ("together", "cond", "two_programs")


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m benchmarks.overlap", description=__doc__.split("\n")[0])
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--link", default=None, help="RATE[,DELAY] for experiments.launch --link")
  p.add_argument("--n", type=int, default=33_536, help="float32 values in the psum")
  p.add_argument("--matmuls", type=int, default=60, help="512 x 512 matrix products in the compute")
  p.add_argument("--json", default=None)
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if min(args.processes, args.n, args.matmuls) < 1:
    p.error("--processes, --n and --matmuls must be at least 1")
  return args


def programs(mesh, matmuls: int) -> dict:
  """Each way's calls: ``way -> f(x, y)`` that runs the psum of ``x`` and the compute on ``y``."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxcomp import parallel  # pylint: disable=g-import-not-at-top
  axis = mesh.axis_names[0]

  def exchange(x):
    return jax.lax.psum(x, axis)

  def compute(y):
    for _ in range(matmuls):
      y = jnp.tanh(y @ y) * 0.5
    return y

  def compiled(f, outputs):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(axis), P(axis)), out_specs=(P(axis),) * outputs))

  exchanged = compiled(lambda x, y: (exchange(x),), 1)
  computed = compiled(lambda x, y: (compute(y),), 1)
  return {
      "together": compiled(lambda x, y: (exchange(x), compute(y)), 2),
      "cond": compiled(lambda x, y: (parallel.replicated_cond(jnp.sum(x) > -jnp.inf, exchange, lambda v: v, x),
                                     compute(y)), 2),
      "two_programs": lambda x, y: (exchanged(x, y), computed(x, y)),  # the second called before the first ends
  }


def trace_way(f, x, y, path: str, tracing: bool) -> list[tuple[float, float]]:
  """Three traced calls of ``f`` after an untimed one: each psum's (seconds, seconds beside it)."""
  import glob  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(f(x, y))
  if tracing:
    jax.profiler.start_trace(path)
  for _ in range(3):
    jax.block_until_ready(f(x, y))
  if not tracing:
    return []
  jax.profiler.stop_trace()
  files = sorted(glob.glob(os.path.join(path, "**", "*.xplane.pb"), recursive=True))
  return timeline.beside(timeline.read(files[-1]), timeline.re.compile("psum"))


def worker(args) -> int:
  """One process: every way's traced calls; rank 0 prints the JSON document."""
  from experiments import distributed  # pylint: disable=g-import-not-at-top
  if not distributed.initialize_from_env():
    raise SystemExit("benchmarks.overlap --worker runs under experiments.launch")
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  put = lambda a: jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), a)
  x = put(np.ones((1, args.n), np.float32))
  y = put(np.random.default_rng(jax.process_index()).standard_normal((1, 512, 512)).astype(np.float32) * 0.05)
  results = []
  with tempfile.TemporaryDirectory() as d:
    for way, f in programs(mesh, args.matmuls).items():
      psums = trace_way(f, x, y, os.path.join(d, way), jax.process_index() == 0)
      results.append({"way": way, "psum_s": [s for s, _ in psums], "beside_s": [b for _, b in psums]})
  return link.finish("overlap", results, args.json, n=args.n, matmuls=args.matmuls,
                     xla_flags=os.environ.get("XLA_FLAGS", ""))


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = _parse(argv)
  return worker(args) if args.worker else link.launch_self(args, argv, "benchmarks.overlap")


if __name__ == "__main__":
  sys.exit(main())
