"""What donating the state to the training step does to its memory (XLA's own figures).

``experiments/step.py``'s ``make_train_step`` jits the step with
``donate_argnums=(0,)``: the parameters, optimizer state, batch-norm
statistics and EMA it replaces are written into the buffers of the state
passed in, instead of beside them. This script builds a config's run with
``experiments.build.build`` (the model, optimizer chain, mesh and abstract
state exactly as training makes them), then lowers and compiles two steps on
the abstract state and batch: the one ``build`` made (donated) and
``make_train_step(..., donate=False)``. Nothing is trained and no array is allocated beyond the
model's initial variables.

For each it reports ``compiled.memory_analysis()``, per device (the step is one
SPMD program over the mesh): argument, output, temp (XLA's scratch) and alias
bytes (outputs written into donated arguments), and the peak estimate
``argument + output + temp - alias``. These are XLA's compile-time figures, not
measurements of a running process, and they are deterministic for a given JAX
version, backend and device count (8 host CPU devices unless ``XLA_FLAGS`` says
otherwise).

Usage::

  python -m benchmarks.train_memory [--configs cifarnet_terngrad_n2,cifarnet_onebit_n8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from typing import Any, Callable

# 8 host CPU devices (as the tests have), unless the caller chose otherwise before JAX started.
if "jax" not in sys.modules and "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import ml_collections  # noqa: E402

from configs import terngrad_cifarnet  # noqa: E402
from experiments import build  # noqa: E402
from experiments import optimizers  # noqa: E402
from experiments import step as step_lib  # noqa: E402
from experiments import validation  # noqa: E402


def _cifarnet_terngrad_n2() -> ml_collections.ConfigDict:
  """TG-T1's runlocal config: CifarNet, 2 workers x 64, TernGrad, Adam, EMA."""
  return terngrad_cifarnet.get_config("runlocal")


def _cifarnet_onebit_n8() -> ml_collections.ConfigDict:
  """The same CifarNet run with 8 workers x 64 and 1-bit SGD (a residual per worker)."""
  c = terngrad_cifarnet.get_config("runlocal")
  c.workers = 8
  c.batch_size = 8 * 64
  c.compressor = "onebit"
  c.compressor_kwargs = ml_collections.ConfigDict()
  return c


CONFIGS: dict[str, Callable[[], ml_collections.ConfigDict]] = {
    "cifarnet_terngrad_n2": _cifarnet_terngrad_n2,
    "cifarnet_onebit_n8": _cifarnet_onebit_n8,
}
SMALLEST = "cifarnet_terngrad_n2"


def per_device_bytes(tree) -> int:
  """Bytes one device holds of an abstract (``ShapeDtypeStruct`` with sharding) pytree."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def abstract_batch(run: build.Run) -> tuple[Any, Any, Any]:
  """Shapes of one step's ``images, labels, key`` as ``experiments.loop.loop`` passes them."""
  c = run.config
  sharding = NamedSharding(run.mesh, P(run.mesh.axis_names))
  b = c.batch_size // c.workers
  images = jax.ShapeDtypeStruct((c.workers, b) + run.image_shape, jnp.float32, sharding=sharding)
  labels = jax.ShapeDtypeStruct((c.workers, b), jnp.int32, sharding=sharding)
  key = jax.eval_shape(lambda: jax.random.fold_in(run.step_root, 1))  # a host uint32[2]
  return images, labels, key


def memory_figures(compiled) -> dict[str, int]:
  """``compiled.memory_analysis()`` as a dict, with the peak estimate (the program's code not in it)."""
  m = compiled.memory_analysis()
  out = {
      "argument_bytes": int(m.argument_size_in_bytes),
      "output_bytes": int(m.output_size_in_bytes),
      "temp_bytes": int(m.temp_size_in_bytes),
      "alias_bytes": int(m.alias_size_in_bytes),
      "generated_code_bytes": int(m.generated_code_size_in_bytes),
  }
  out["peak_bytes"] = (out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"]
                       - out["alias_bytes"])
  return out


def undonated_step(run: build.Run):
  """``run.train_step`` as ``build.build`` makes it, but without donation."""
  c = run.config
  return step_lib.make_train_step(c, run.model, optimizers.make_tx(c, step_lib.worker_axes(run.mesh)), run.mesh,
                                  run.spec.num_classes, run.state.batch_stats, donate=False)


def measure(name: str, config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Compiles the donated and the undonated step of ``config``; returns both memory analyses."""
  config = ml_collections.ConfigDict(config)
  validation.validate_config(config)
  with tempfile.TemporaryDirectory() as workdir:
    run = build.build(config, workdir)
  args = (run.state,) + abstract_batch(run)
  steps = {"donated": run.train_step, "undonated": undonated_step(run)}
  result: dict[str, Any] = {
      "config": name, "model": config.model, "dataset": config.dataset,
      "compressor": config.compressor, "workers": config.workers, "devices": run.mesh.size,
      "batch_size": config.batch_size,
      "state_bytes_per_device": {
          "params": per_device_bytes(run.state.params),
          "opt_state": per_device_bytes(run.state.opt_state),
          "batch_stats": per_device_bytes(run.state.batch_stats),
          "ema_params": per_device_bytes(run.state.ema_params),
          "total": per_device_bytes(run.state),
      },
  }
  for label, step in steps.items():
    print(f"[train_memory] {name}: compiling the {label} step", file=sys.stderr, flush=True)
    result[label] = memory_figures(step.lower(*args).compile())
  result["difference"] = {k: result["undonated"][k] - result["donated"][k]
                          for k in result["donated"]}
  return result


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help=f"comma-separated, from: {', '.join(CONFIGS)}")
  parser.add_argument("--json", default=None, help="also write the JSON to this file")
  args = parser.parse_args(argv)
  names = [n for n in args.configs.split(",") if n]
  unknown = [n for n in names if n not in CONFIGS]
  if unknown or not names:
    parser.error(f"unknown or no configs {unknown}; known: {', '.join(CONFIGS)}")
  doc = {
      "jax_version": jax.__version__, "backend": jax.default_backend(),
      "per": "device (one SPMD program over the mesh)",
      "results": [measure(n, CONFIGS[n]()) for n in names],
  }
  return emit(doc, args.json)


def emit(doc: dict[str, Any], path: str | None) -> dict[str, Any]:
  """Prints ``doc`` as JSON, and writes it to ``path`` too if given; returns it."""
  text = json.dumps(doc, indent=2)
  print(text)
  if path:
    with open(path, "w") as f:
      f.write(text + "\n")
  return doc


if __name__ == "__main__":
  main()
