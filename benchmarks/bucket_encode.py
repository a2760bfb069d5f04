r"""Encoding per tensor against per bucket: the compiled update's kernels and its time, no link.

``benchmarks/link.py`` times a model's exchange between processes; beyond the
wire, what it measures is compute, and with buckets that compute was still
one encode and one decode per tensor (ResNet-110: 329 tensors). A compressor
with ``bucket_encode`` (:class:`jaxcomp.core.BucketCompressor`) encodes,
decodes and aggregates a bucket at once. This script compiles the jitted
``shard_map``'d ``tx.update`` of each method over ``--devices`` host CPU
devices of one process (so the collectives are in-process copies) twice: as
it is (per-bucket encode) and with the compressor's ``bucket_encode`` turned
off (each tensor encoded alone; collectives fused per bucket either way). It
prints, side by side, the number of fusions and of instructions in the
compiled program's entry computation (about the kernels launched per step)
and the median time of ``--trials`` calls, the two variants' calls
interleaved so that a loaded machine slows both alike.

Usage::

  python -m benchmarks.bucket_encode --models resnet110 \
      --methods none,terngrad,qsgd,int8,threelc --trials 21 [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
import time


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m benchmarks.bucket_encode", description=__doc__.split("\n")[0])
  p.add_argument("--models", default="resnet110", help="comma-separated jaxcomp.models names")
  p.add_argument("--methods", default="none,terngrad,qsgd,int8,threelc",
                 help="comma-separated registry names with optional :key=value (as benchmarks.link)")
  p.add_argument("--devices", type=int, default=2, help="host CPU devices, one worker each")
  p.add_argument("--trials", type=int, default=21)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--json", default=None)
  return p.parse_args(argv)


def per_tensor(compressor):
  """``compressor`` with ``bucket_encode`` off: each tensor is encoded alone (the same numbers)."""
  cls = type(compressor)
  off = type(cls.__name__ + "PerTensor", (cls,), {"bucket_encode": False, "__module__": __name__})
  return off(**{f.name: getattr(compressor, f.name) for f in dataclasses.fields(compressor)})


def program_size(compiled_text: str) -> dict:
  """Fusions anywhere in a compiled HLO module, and instructions of its entry computation."""
  entry = compiled_text[compiled_text.index("\nENTRY "):]
  entry = entry[:entry.index("\n}")]
  return {"fusions": len(re.findall(r"= \S+ fusion\(", compiled_text)) or
                     len(re.findall(r" fusion\(", compiled_text)),
          "entry_ops": sum(1 for line in entry.splitlines()[1:] if " = " in line)}


def _build(compressor, shapes, mesh):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxcomp import parallel, transforms  # pylint: disable=g-import-not-at-top

  n = mesh.devices.size
  tx = transforms.compress(compressor, axis_name="d")
  state = parallel.replicate_workers(tx.init(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)), n)
  specs = parallel.worker_specs(state, "d")

  def per_device(g, s):
    upd, s2 = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    return upd, parallel.expand_workers(s2)

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs)))
  state = jax.tree.map(lambda a, sp: jax.device_put(a, NamedSharding(mesh, sp)), state, specs)
  rng = np.random.default_rng(0)
  g = jax.tree.map(lambda s: jax.device_put(rng.standard_normal((n,) + s.shape, dtype=np.float32),
                                            NamedSharding(mesh, P("d"))), shapes)
  return step, state, g


def _measure(variants, shapes, mesh, args) -> dict:
  """Compiles each variant, then times them interleaved: ``{label: {median_s, fusions, entry_ops}}``."""
  import jax  # pylint: disable=g-import-not-at-top
  built = {label: _build(c, shapes, mesh) for label, c in variants.items()}
  out = {}
  for label, (step, state, g) in built.items():
    out[label] = program_size(step.lower(g, state).compile().as_text())
    for _ in range(args.warmup):
      jax.block_until_ready(step(g, state))
    out[label]["times_s"] = []
  for _ in range(args.trials):
    for label, (step, state, g) in built.items():
      t0 = time.perf_counter()
      jax.block_until_ready(step(g, state))
      out[label]["times_s"].append(time.perf_counter() - t0)
  for r in out.values():
    r["median_s"] = statistics.median(r["times_s"])
  return out


def main(argv=None) -> int:
  args = _parse(sys.argv[1:] if argv is None else argv)
  flag = f"--xla_force_host_platform_device_count={args.devices}"
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import link  # pylint: disable=g-import-not-at-top

  mesh = jax.make_mesh((args.devices,), ("d",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:args.devices])
  rows = []
  for model in args.models.split(","):
    shapes = link.model_shapes(model)
    for method in args.methods.split(","):
      name, kwargs = link.method_spec(method)
      if name == "none":
        variants = {"float": None}
      else:
        c = link.bench_compressor(name, kwargs)
        variants = {"per bucket": c, "per tensor": per_tensor(c)} if c.bucket_encode else {"per tensor": c}
      res = _measure(variants, shapes, mesh, args)
      row = {"model": model, "method": method, "tensors": len(jax.tree.leaves(shapes)), "variants": res}
      rows.append(row)
      cells = "; ".join(f"{k}: {v['median_s'] * 1e3:.1f} ms, {v['fusions']} fusions, {v['entry_ops']} entry ops"
                        for k, v in res.items())
      ratio = ""
      if "per bucket" in res:
        ratio = f" (per bucket / per tensor: {res['per bucket']['median_s'] / res['per tensor']['median_s']:.2f})"
      print(f"{model} {method}: {cells}{ratio}", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"benchmark": "bucket_encode", "devices": args.devices, "trials": args.trials,
                 "load_average": os.getloadavg(), "results": rows}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
