"""Bytes a device moves in a ZeRO-3 step on hosts of several devices: flat, two hops, one copy a host.

Builds the project's GPT (``benchmarks.zero_memory.gpt``) and runs one
``jaxcomp.data_parallel`` step over a mesh of ``H × L`` host devices
(``("hosts", "local")``), AdamW, in four layouts:

* ``float``: ZeRO-3 in float32 over all ``H·L`` devices (the baseline);
* ``flat``: the same with ZeRO++'s quantizers, qwZ (the weights' all-gather
  in int8 blocks) and qgZ (the gradient's reduce-scatter in int4 blocks),
  each one collective over all devices;
* ``two hops``: qgZ's reduce-scatter in two hops, inside the host then
  between hosts (the compressor's ``within="local"``);
* ``one copy a host``: the state and parameters cut over a host's devices
  only (``shard_optimizer(..., within="local")``): the weights' gather stays
  inside the host and only the compressed gradient crosses hosts.

Per device it prints what the transport counted (``jaxcomp.metrics``, the
step's own messages): ``bytes_on_wire`` and ``received_bytes``, the bytes
handed to and received from collectives that span hosts, and
``local_bytes``, those of collectives inside the host; and the parameters
and optimizer state a device holds between steps.

Usage::

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.zero_hosts --hosts 2 --local 4 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from benchmarks import train_memory  # first: it asks for 8 host devices before JAX starts
from benchmarks import zero_memory

import jax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-order
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxcomp  # noqa: E402

AXES = ("hosts", "local")
LAYOUTS = ("float", "flat", "two hops", "one copy a host")


def chain(layout: str, hosts: int, local: int) -> Any:
  """AdamW after the layout's gradient compressor, sharded as the layout says (ZeRO-3)."""
  hops = layout in ("two hops", "one copy a host")
  name, kwargs = ("none", {}) if layout == "float" else ("blockint", {"bits": 4})
  head = jaxcomp.get_transform(name, axis_name="hosts" if hops else AXES, within="local" if hops else None, **kwargs)
  cut = {"within": "local", "host_devices": local} if layout == "one copy a host" else {}
  return jaxcomp.shard_optimizer(
      optax.chain(head, optax.adamw(1e-3, weight_decay=0.1)), axis_name=AXES, num_workers=hosts * local,
      shard_params=True, param_gather=None if layout == "float" else jaxcomp.BlockInt(bits=8), **cut)


def measure(model, params, layout: str, hosts: int, local: int, batch: int) -> dict[str, Any]:
  """One step of ``layout``: the transport's counts and the bytes a device holds, per device."""
  mesh = jax.make_mesh((hosts, local), AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)
  tx = chain(layout, hosts, local)
  step = jaxcomp.data_parallel(zero_memory.worker_step(model, tx, AXES), tx, mesh=mesh)
  print(f"[zero_hosts] {layout}: compiling and running one step", file=sys.stderr, flush=True)
  shards, state = step.init(jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), params))
  held = train_memory.per_device_bytes((shards, state))
  tokens = jax.random.randint(jax.random.PRNGKey(0), (hosts * local, batch, model.context + 1), 0, zero_memory.VOCAB)
  shards, state, _ = step(shards, state, tokens)
  m = jaxcomp.metrics(state)
  counts = {k: int(m[k]) if k in m else 0 for k in ("bytes_on_wire", "received_bytes", "local_bytes", "gather_bytes")}
  return {"layout": layout, **counts, "held_bytes": held}


def report(results: list[dict[str, Any]]) -> str:
  base = results[0]
  lines = ["| layout | between hosts: sent / received | ÷ float | inside a host: sent | params + state held |",
           "|---|---:|---:|---:|---:|"]
  for r in results:
    lines.append(f"| {r['layout']} | {r['bytes_on_wire']:,} / {r['received_bytes']:,} | "
                 f"{r['bytes_on_wire'] / base['bytes_on_wire']:.3f} / {r['received_bytes'] / base['received_bytes']:.3f} | "
                 f"{r['local_bytes']:,} | {r['held_bytes'] / 1e6:.1f} MB |")
  return "\n".join(lines)


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  zero_memory.gpt_arguments(parser, width=256, depth=4, context=64, batch=1)
  parser.add_argument("--hosts", type=int, default=2)
  parser.add_argument("--local", type=int, default=4, help="devices per host")
  parser.add_argument("--json", default=None, help="also write the JSON to this file")
  args = parser.parse_args(argv)
  model, params = zero_memory.gpt(args.width, args.depth, args.context)
  n = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
  results = [measure(model, params, layout, args.hosts, args.local, args.batch) for layout in LAYOUTS]
  out = {"parameters": n, "hosts": args.hosts, "local": args.local, "results": results}
  print(f"GPT width {args.width}, depth {args.depth}: {n:,} parameters; {args.hosts} hosts of {args.local} devices; "
        "bytes a device, one step")
  print(report(results))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
