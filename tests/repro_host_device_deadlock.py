"""Reproduces XLA:CPU's deadlock of eager cross-device programs on host devices (docs/design.md).

    python tests/repro_host_device_deadlock.py [--busy 3] [--eager | --compiled] [--timeout 10]

Starts ``--busy`` busy loops (the load of a second pytest worker and a CPU
hog), then per iteration dispatches ten pairs of all-reduces over 8 host
devices and adds their results, without waiting. ``--eager`` (the default)
aborts with SIGABRT after XLA's rendezvous termination timeout, its log naming
an all-reduce that only some of the 8 participants joined; ``--compiled`` runs
the same arithmetic as one program a call and finishes. Exit status: XLA's
(134 for SIGABRT), or 0.
"""

import argparse
import os
import subprocess
import sys
import time

# A busy loop that ends with its parent (which may die by SIGABRT, running no clean-up).
BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n  pass\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--busy", type=int, default=3, help="busy loops beside the run")
  parser.add_argument("--compiled", action="store_true", help="one compiled program a call")
  parser.add_argument("--eager", dest="compiled", action="store_false")
  parser.add_argument("--timeout", type=int, default=10, help="XLA's rendezvous termination timeout, seconds")
  parser.add_argument("--iterations", type=int, default=200)
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                             f"--xla_cpu_collective_call_terminate_timeout_seconds={args.timeout} "
                             "--xla_cpu_collective_call_warn_stuck_timeout_seconds=1")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  for _ in range(args.busy):
    subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((8,), ("w",))
  x = jax.device_put(jnp.arange(32, dtype=jnp.uint32).reshape(8, 4), NamedSharding(mesh, P("w")))

  def pairs(x):
    return [jnp.sum(x, dtype=jnp.uint32) + jnp.sum(x >> k, dtype=jnp.uint32) for k in range(10)]

  step = jax.jit(pairs) if args.compiled else pairs
  start = time.monotonic()
  for i in range(args.iterations):
    jax.block_until_ready(step(x))
    if i % 50 == 0:
      print(f"iteration {i}, {time.monotonic() - start:.1f} s", flush=True)
  print(f"{'compiled' if args.compiled else 'eager'}: {args.iterations} iterations, no deadlock")
  return 0


if __name__ == "__main__":
  sys.exit(main())
