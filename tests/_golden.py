"""Golden numbers of the exchange: digests of every transform's updates, final state and metrics.

A redesign of the exchange core (the plan, the transport, the compressor protocol) must keep
what every registered compressor and wrapper computes bit for bit. This module runs each case
(a transform and a layout: vmap-simulated workers with the default buckets, without buckets,
``exchange="two_phase"`` and ``"auto"``; ``shard_map`` with one worker per device; the hierarchy
``within=``; ``per_shard`` on a model-sharded mesh) for :data:`STEPS` steps on a tree of many
tensors and reduces what it produced to a record: a SHA-256 of each step's updates, one of the
final state (every leaf, residuals and keys included) and the metrics as numbers.
``tests/golden/exchange.json`` holds the records of the code they were taken from; the test
(``tests/test_golden_*.py``) compares. To take them anew, after a change that is meant to move
them (say which and why in the commit)::

  JAXCOMP_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_vmap.py tests/test_golden_devices.py

The records are XLA:CPU's under the suite's flags (``tests/conftest.py``), taken in the
pytest process itself so that the flags are the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel

from _layouts import per_shard_step

PATH = pathlib.Path(__file__).parent / "golden" / "exchange.json"
WRITE = os.environ.get("JAXCOMP_WRITE_GOLDEN") == "1"
WORKERS = 4
STEPS = 3
# Many tensors of mixed sizes (the default bucket holds them all; bucket_bytes=0 sends each alone):
# a 4-d kernel, matrices, biases, sizes that are not multiples of 5 or 128, and a scalar.
SHAPES = {
    "conv": (3, 3, 4, 8),
    "conv_bias": (8,),
    "dense": (72, 33),
    "dense_bias": (33,),
    "head": (33, 10),
    "head_bias": (10,),
    "scale": (),
}
# Settings that make a compressor act within three steps (DGC's warm-up would hide its sparsity), or on
# these small tensors (blockint's default block of 2,560 values would hold each whole).
KWARGS = {"dgc": {"warmup_steps": 0}, "blockint": {"bits": 4, "block": 64}}
# Layouts under vmap: the keyword arguments each adds to the factory.
VMAP_LAYOUTS = {
    "vmap": {},
    "vmap_bucket0": {"bucket_bytes": 0},
    "vmap_two_phase": {"exchange": "two_phase"},
    "vmap_auto": {"exchange": "auto"},
}


def names() -> list[str]:
  return sorted(jaxcomp.REGISTRY)


def accepts(name: str, layout: str) -> bool:
  """Whether ``name``'s factory accepts ``layout``'s options (PowerSGD refuses the two-phase exchange)."""
  try:
    jaxcomp.get_transform(name, axis_name="w", **KWARGS.get(name, {}), **VMAP_LAYOUTS.get(layout, {}))
  except ValueError:
    return False
  return True


def params() -> dict[str, jax.Array]:
  return {k: jnp.zeros(s, jnp.float32) for k, s in SHAPES.items()}


def grads(step: int, workers: int = WORKERS) -> dict[str, np.ndarray]:
  """Each worker's gradients at ``step``: Gaussian, of a scale that grows with the step and the tensor."""
  rng = np.random.default_rng(1000 + step)
  return {k: (rng.standard_normal((workers,) + s) * (1 + step) * 10.0 ** -(i % 3)).astype(np.float32)
          for i, (k, s) in enumerate(SHAPES.items())}


# -- transforms: a compressor's update, or a wrapper around an optimizer ------------------------


def compressor_case(name: str, layout: str) -> Callable[[Any], optax.GradientTransformation]:
  """``make_tx(axis_name)`` for registered compressor ``name`` in a vmap ``layout``."""
  return lambda axis, **more: jaxcomp.get_transform(
      name, axis_name=axis, **KWARGS.get(name, {}), **VMAP_LAYOUTS.get(layout, {}), **more)


WRAPPERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "local_steps": lambda axis: jaxcomp.local_steps(optax.sgd(0.1, momentum=0.9), k=2, axis_name=axis),
    "diloco": lambda axis: jaxcomp.diloco(optax.adamw(0.01), inner_steps=2, axis_name=axis),
    "diloco_int8": lambda axis: jaxcomp.diloco(optax.adamw(0.01), inner_steps=2, axis_name=axis, exchange="int8"),
    "diloco_streaming": lambda axis: jaxcomp.diloco(optax.adamw(0.01), inner_steps=2, fragments=2, delay=1,
                                                    axis_name=axis, exchange="fp4"),
    "onebit_adam": lambda axis: jaxcomp.onebit_adam(0.01, freeze_step=1, axis_name=axis),
    "demo": lambda axis: jaxcomp.demo(0.01, k=4, chunk=4, axis_name=axis),
    "multi_steps": lambda axis: jaxcomp.multi_steps(
        optax.chain(jaxcomp.terngrad(axis_name=axis), optax.sgd(0.1)), every_k_schedule=2),
    "apply_if_finite": lambda axis: jaxcomp.apply_if_finite(
        optax.chain(jaxcomp.int8(axis_name=axis), optax.sgd(0.1)), 3, axis_name=axis),
}


# -- running a case ------------------------------------------------------------------------------


def _step(tx):
  """One worker's step: ``(grads, state, params) -> (updates, state, params)``."""

  def step(g, s, p):
    u, s = tx.update(g, s, p)
    return u, s, optax.apply_updates(p, u)

  return step


def run_vmap(make_tx, workers: int = WORKERS) -> tuple[list, Any]:
  """:data:`STEPS` steps of ``workers`` simulated workers: (each step's updates, final state)."""
  tx = make_tx("w")
  state = parallel.replicate_workers(tx.init(params()), workers)
  p = jax.tree.map(lambda a: jnp.stack([a] * workers), params())
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(_step(tx), in_axes=(0, axes, 0), out_axes=(0, axes, 0), axis_name="w"))
  outs = []
  for t in range(STEPS):
    u, state, p = step(grads(t, workers), state, p)
    outs.append(jax.device_get(u))
  return outs, jax.device_get(state)


def _per_device(tx):
  """``_step(tx)`` on one device's worker under shard_map: the local worker axis of 1 dropped and put back."""
  step = _step(tx)

  def per_device(g, s, p):
    drop = lambda t: jax.tree.map(lambda a: a[0], t)
    u, s, p = step(drop(g), parallel.worker_slice(s, 0), drop(p))
    add = lambda t: jax.tree.map(lambda a: a[None], t)
    return add(u), parallel.expand_workers(s), add(p)

  return per_device


def run_mesh(tx, mesh, axes, workers: int) -> tuple[list, Any]:
  """:data:`STEPS` steps under ``jit(shard_map)`` with one worker per device of ``mesh`` over ``axes``."""
  state = parallel.replicate_workers(tx.init(params()), workers)
  specs = parallel.worker_specs(state, axes)
  state = jax.device_put(state, parallel.worker_shardings(state, mesh, axes))
  # Laid out as the step returns them, as the state: one compile, not a second one for the steps after the first.
  p = jax.device_put(jax.tree.map(lambda a: jnp.stack([a] * workers), params()), NamedSharding(mesh, P(axes)))
  step = jax.jit(jax.shard_map(_per_device(tx), mesh=mesh, in_specs=(P(axes), specs, P(axes)),
                               out_specs=(P(axes), specs, P(axes))))
  outs = []
  for t in range(STEPS):
    u, state, p = step(grads(t, workers), state, p)
    jax.block_until_ready((u, state, p))  # one cross-device program at a time (docs/design.md, "Host devices")
    outs.append(jax.device_get(u))
  return outs, jax.device_get(state)


def device_mesh() -> jax.sharding.Mesh:
  return jax.make_mesh((WORKERS,), ("d",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:WORKERS])


def host_mesh() -> jax.sharding.Mesh:
  """2 hosts of 2 devices."""
  return jax.make_mesh((2, 2), ("hosts", "local"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:4])


# -- per_shard: a (data x model) mesh, parameters split over "model" ----------------------------

SHARDED = {"conv": P(None, None, None, "model"), "dense": P("model", None), "dense_bias": P(None)}


def run_per_shard(name: str) -> tuple[list, Any]:
  """:data:`STEPS` steps of ``per_shard(name)`` over 2 data workers x 2 model shards."""
  mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:4])
  shapes = {k: SHAPES[k] for k in SHARDED}
  specs = {k: SHARDED[k] for k in shapes}
  with jax.set_mesh(mesh):
    p0 = jax.device_put({k: jnp.zeros(s) for k, s in shapes.items()},
                        {k: NamedSharding(mesh, s) for k, s in specs.items()})
    tx = jaxcomp.per_shard(jaxcomp.get_transform(name, axis_name="data", **KWARGS.get(name, {})), "model")
    step, state = per_shard_step(tx, p0, mesh)
    gspecs = {k: NamedSharding(mesh, P("data", *s)) for k, s in specs.items()}
    outs = []
    for t in range(STEPS):
      g = {k: v for k, v in grads(t, 2).items() if k in shapes}
      u, state = step(jax.device_put(g, gspecs), state)
      jax.block_until_ready((u, state))
      outs.append(jax.device_get(u))
  return outs, jax.device_get(state)


# -- records -------------------------------------------------------------------------------------


def digest(tree: Any) -> str:
  """SHA-256 of every leaf's dtype, shape and bytes, in the tree's order (paths included)."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = np.asarray(jax.random.key_data(leaf) if jnp.issubdtype(getattr(leaf, "dtype", np.float32),
                                                                 jax.dtypes.prng_key) else leaf)
    h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def record(outs: list, state: Any) -> dict[str, Any]:
  """What a case is compared on: each step's updates and the final state as digests, the metrics as numbers."""
  try:
    metrics = {k: float(v) for k, v in sorted(jaxcomp.metrics(state).items())}
  except ValueError:  # a state without a compressor's counters (a plain optimizer around none)
    metrics = {}
  return {"updates": [digest(u) for u in outs], "state": digest(state), "metrics": metrics}


def load() -> dict[str, Any]:
  return json.loads(PATH.read_text())["cases"] if PATH.exists() else {}


def check(case: str, got: dict[str, Any], store: dict[str, Any]) -> None:
  """Compares ``got`` with the committed record of ``case`` (or keeps it in ``store`` to be written)."""
  if WRITE:
    store[case] = got
    return
  want = load().get(case)
  assert want is not None, f"no golden record for {case!r}: take them with JAXCOMP_WRITE_GOLDEN=1 (tests/_golden.py)"
  assert got["metrics"] == want["metrics"], (
      f"{case}: metrics moved: " + ", ".join(f"{k}: {want['metrics'].get(k)} -> {v}"
                                            for k, v in got["metrics"].items() if want["metrics"].get(k) != v)
      + f"; missing: {sorted(set(want['metrics']) - set(got['metrics']))}")
  moved = [t for t, (a, b) in enumerate(zip(got["updates"], want["updates"])) if a != b]
  assert not moved, f"{case}: the updates of steps {moved} are no longer bit for bit the golden ones"
  assert got["state"] == want["state"], f"{case}: the final state is no longer bit for bit the golden one"


def write(store: dict[str, Any]) -> None:
  """Merges ``store`` into the committed file (each test module writes its own cases)."""
  if not WRITE or not store:
    return
  cases = {**load(), **store}
  PATH.parent.mkdir(exist_ok=True)
  PATH.write_text(json.dumps({
      "about": "tests/_golden.py: digests of updates and final states, metrics as numbers",
      "taken_on": {"jax": jax.__version__, "machine": platform.machine(),
                   "xla_flags": os.environ.get("XLA_FLAGS", "")},
      "cases": dict(sorted(cases.items())),
  }, indent=1, sort_keys=False) + "\n")
