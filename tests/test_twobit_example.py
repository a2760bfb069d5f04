"""The 2-bit quantizer of docs/compressors.md (``examples/twobit.py``) in every layout jaxcomp offers.

The file is run as written, and must be the doc's block word for word. Every check computes what
it expects on its own (numpy, and ``jax.eval_shape`` of the file's ``encode``): the payload's
bytes, the levels, unbiasedness over many keys, and through ``jaxcomp.compress`` with 4 simulated
workers (the all-gather with and without buckets, the two-phase exchange, ``"auto"``), the
hierarchy (``within=``) and ``jaxcomp.per_shard`` on a 2 x 2 mesh: the update is a mean of the
workers' stochastic roundings and the counted bytes are exactly the payloads'.
"""

import functools
import itertools
import math
import pathlib
import re
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel

from _layouts import per_shard_step, require_devices

pytestmark = pytest.mark.accelerator

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "twobit.py"
DOC = ROOT / "docs" / "compressors.md"
NS = runpy.run_path(str(EXAMPLE))
TwoBit = NS["TwoBit"]

N = 4  # simulated workers
FLAG = 1  # the non-finite flag: one uint8 per compressed tensor with more than one worker ("propagate")
# Sizes that are no multiple of 4, a scalar-like tensor, and one (260 >= N * 40 values) that the
# two-phase exchange splits into N chunks; the others stay on the all-gather there.
SHAPES = {"a": (3, 5), "b": (37,), "c": (8, 8), "d": (1,), "e": (20, 13)}
SCALES = np.array([1.0, 2.0, 0.5, 3.0], np.float32)  # each worker's gradients: distinct maxima


def payload_bytes(n: int) -> int:
  """Bytes of a tensor of ``n`` values, from the file's own encode (shapes only)."""
  x = jax.ShapeDtypeStruct((n,), jnp.float32)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)
  payload = jax.eval_shape(TwoBit().encode, x, key, None)
  return sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(payload))


def grads(step: int, workers: int = N, shapes=SHAPES) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(7 + step)
  scale = lambda s: SCALES[:workers].reshape((workers,) + (1,) * len(s))
  return {k: (rng.standard_normal((workers,) + s) * scale(s)).astype(np.float32) for k, s in shapes.items()}


def assert_mean_of_roundings(update, xs, scales, what):
  """``update`` is the mean over workers of one stochastic rounding of each ``xs[w]`` on its grid of
  ``scales[w]`` (per element): some choice of the two neighbouring levels per worker sums to it."""
  xs, scales = np.asarray(xs, np.float32), np.asarray(scales, np.float32)
  u = (xs / np.where(scales > 0, scales, 1) + 1) * np.float32(1.5)
  low = np.clip(np.floor(u), 0, 2)
  levels = [(low * 2 / 3 - 1) * scales, ((low + 1) * 2 / 3 - 1) * scales]  # each (workers, ...)
  workers = xs.shape[0]
  best = np.full(np.shape(update), np.inf)
  for choice in itertools.product((0, 1), repeat=workers):
    total = sum(levels[c][w] for w, c in enumerate(choice))
    best = np.minimum(best, np.abs(total - workers * np.asarray(update)))
  np.testing.assert_array_less(best, 1e-5 * scales.sum(0) + 1e-7, err_msg=what)


# -- the file --------------------------------------------------------------------------------------


def test_the_file_is_the_docs_walkthrough_and_uses_only_the_protocol():
  text = EXAMPLE.read_text()
  assert len(text.splitlines()) <= 60
  section = DOC.read_text().split("## Write your own compressor", 1)[1].split("\n## ", 1)[0]
  walkthrough = section.split("### A 2-bit stochastic quantizer", 1)[1]
  assert re.search(r"```python\n(.*?)```", walkthrough, re.S).group(1) == text
  assert issubclass(TwoBit, jaxcomp.core.Compressor) and TwoBit.__dataclass_params__.frozen
  methods = {k for k, v in vars(TwoBit).items() if callable(v) and not k.startswith("__")}
  assert methods == {"encode", "decode"}
  assert TwoBit.unbiased and not TwoBit.error_feedback and not TwoBit.bucket_encode


@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (4,), (5,), (7,), (8,), (127,), (1000,), (3, 5)])
def test_round_trip_lands_on_the_four_levels(shape):
  n = math.prod(shape)
  x = jax.random.normal(jax.random.PRNGKey(n), shape) * 3.0
  comp = TwoBit()
  payload = comp.encode(x, jax.random.PRNGKey(1), None)
  assert payload.codes.shape == (-(-n // 4),) and payload.codes.dtype == jnp.uint8
  assert payload.scale.shape == () and payload.scale.dtype == jnp.float32
  assert jaxcomp.core.tree_nbytes(payload) == payload_bytes(n) == -(-n // 4) + 4
  y = np.asarray(comp.decode(payload, shape))
  assert y.shape == shape and y.dtype == np.float32
  x = np.asarray(x)
  m = np.abs(x).max()
  assert float(payload.scale) == m
  np.testing.assert_allclose(np.abs(y), np.where(np.abs(y) > m / 2, m, m / 3), rtol=1e-6)  # {±m, ±m/3}
  # Stochastic rounding: one of the two levels around x, 2m/3 apart; the extremes are exact.
  assert np.all(np.abs(y - x) <= 2 * m / 3 * (1 + 1e-6))
  np.testing.assert_allclose(y[np.abs(x) == m], x[np.abs(x) == m], rtol=1e-6)
  assert_mean_of_roundings(y, x[None], np.full((1,) + shape, m), f"shape {shape}")


def test_zeros_decode_to_zeros():
  comp = TwoBit()
  y = comp.decode(comp.encode(jnp.zeros((6,)), jax.random.PRNGKey(0), None), (6,))
  np.testing.assert_array_equal(y, np.zeros(6, np.float32))


def test_the_mean_over_keys_is_x():
  """Unbiased: the mean of K decodes is within 5 standard errors of x, element by element and in sum.

  A rounding between levels a < b with P(b) = (x − a)/(b − a) has variance (b − x)(x − a) exactly.
  (A variant that rounds up with probability 0.9·(x − a)/(b − a) fails both bounds.)
  """
  comp, k, n = TwoBit(), 4000, 1000
  x = jax.random.normal(jax.random.PRNGKey(0), (n,)) * 2.0
  m = float(jnp.max(jnp.abs(x)))
  x = x.at[:4].set(jnp.array([m / 3, -m / 3, 0.0, -m]))  # on a level, and between two
  ys = jax.jit(jax.vmap(lambda key: comp.decode(comp.encode(x, key, None), x.shape)))(
      jax.random.split(jax.random.PRNGKey(1), k))
  mean, x = np.asarray(ys, np.float64).mean(0), np.asarray(x, np.float64)
  frac = (x / m + 1) * 1.5 - np.clip(np.floor((x / m + 1) * 1.5), 0, 2)
  var = frac * (1 - frac) * (2 * m / 3) ** 2
  np.testing.assert_array_less(np.abs(mean - x), 5 * np.sqrt(var / k) + 1e-5 * m)
  assert abs(np.sum(mean - x)) < 5 * np.sqrt(var.sum() / k)


# -- through jaxcomp.compress: 4 workers simulated with vmap ---------------------------------------

LAYOUTS = {
    "all_gather": {},
    "all_gather_bucket0": {"bucket_bytes": 0},
    "two_phase": {"exchange": "two_phase"},
    "auto": {"exchange": "auto"},
}


def _chunk(n: int) -> int | None:
  """The two-phase chunk of a tensor of ``n`` values over N workers (40-value aligned), or None:
  too small (fewer than N aligned blocks), it stays on the all-gather."""
  if n < N * 40:
    return None
  return -(-(-(-n // N)) // 40) * 40


def _routes(layout: str) -> dict[str, str]:
  """Each tensor's exchange: the two-phase one where it splits and (``"auto"``) receives fewer bytes."""
  out = {}
  for k, s in SHAPES.items():
    n, c = math.prod(s), _chunk(math.prod(s))
    two_phase = c is not None and (
        layout == "two_phase"
        or layout == "auto" and (N - 1) * 2 * payload_bytes(c) < (N - 1) * payload_bytes(n))
    out[k] = "two_phase" if two_phase else "all_gather"
  return out


@functools.lru_cache(maxsize=None)
def _vmap_run(layout: str):
  """Two steps of ``layout``: (each step's gradients and updates, the metrics after the second)."""
  tx = jaxcomp.compress(TwoBit(), axis_name="w", **LAYOUTS[layout])
  params = {k: jnp.zeros(s) for k, s in SHAPES.items()}
  state = parallel.replicate_workers(tx.init(params), N)
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w"))
  steps = []
  for t in range(2):
    g = grads(t)
    u, state = step(g, state)
    steps.append((g, jax.device_get(u)))
  return steps, {k: int(v) for k, v in jaxcomp.metrics(state).items() if "ratio" not in k}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_vmap_workers_send_exactly_the_payloads(layout):
  """compressed_bytes_on_wire: every tensor's payload, ceil(n/4) + 4 on the all-gather and N chunk
  payloads (phase 1, all-to-all) plus one shard payload (phase 2, all-gather) on the two-phase
  exchange, and a flag byte per tensor; received_bytes: (N − 1) of every payload gathered or
  scattered to this worker, and of every flag: a tensor's flag rides its all-gather (on the
  two-phase exchange, its shards'), so N − 1 bytes of it arrive."""
  _, m = _vmap_run(layout)
  routes = _routes(layout)
  handed = received = 0
  for k, s in SHAPES.items():
    n = math.prod(s)
    if routes[k] == "all_gather":
      handed += payload_bytes(n)
      received += (N - 1) * (payload_bytes(n) + FLAG)
    else:
      p1 = p2 = payload_bytes(_chunk(n))  # a chunk, and the re-encoded shard of one chunk's length
      handed += N * p1 + p2
      received += (N - 1) * (p1 + p2 + FLAG)
  flags = FLAG * len(SHAPES)
  assert m["compressed_bytes_on_wire"] == m["bytes_on_wire"] == m["encoded_bytes"] == handed + flags
  assert m["float_bytes"] == 0 and m["float32_bytes"] == 4 * sum(math.prod(s) for s in SHAPES.values())
  if layout.startswith("all_gather"):
    assert "received_bytes" not in m
    assert handed == sum(-(-math.prod(s) // 4) + 4 for s in SHAPES.values())
  else:
    assert m["two_phase_tensors"] == list(routes.values()).count("two_phase") == 1
    assert m["received_bytes"] == received


@pytest.mark.parametrize("layout", LAYOUTS)
def test_vmap_update_is_a_mean_of_the_workers_roundings(layout):
  """On the all-gather, the mean of one rounding per worker on its own grid (m = max|g_w|); on the
  two-phase exchange, each chunk's shard re-quantized: four levels ±s, ±s/3 per chunk."""
  steps, _ = _vmap_run(layout)
  routes = _routes(layout)
  for t, (g, u) in enumerate(steps):
    for k, s in SHAPES.items():
      assert u[k].shape == s and u[k].dtype == np.float32 and np.all(np.isfinite(u[k])), (layout, t, k)
      if routes[k] == "all_gather":
        scales = np.broadcast_to(np.abs(g[k]).reshape(N, -1).max(1).reshape((N,) + (1,) * len(s)), g[k].shape)
        assert_mean_of_roundings(u[k], g[k], scales, f"{layout} step {t} {k}")
      else:
        c = _chunk(math.prod(s))
        flat = np.pad(u[k].reshape(-1), (0, N * c - u[k].size))
        for j in range(N):
          real = flat[j * c:min((j + 1) * c, u[k].size)]
          top = np.abs(real).max()
          np.testing.assert_allclose(np.abs(real), np.where(np.abs(real) > top / 2, top, top / 3), rtol=1e-6)


def test_buckets_change_how_the_payloads_travel_not_what_they_are():
  for (_, a), (_, b) in zip(_vmap_run("all_gather")[0], _vmap_run("all_gather_bucket0")[0]):
    for k in SHAPES:
      np.testing.assert_array_equal(a[k], b[k])
  for (_, a), (_, b) in zip(_vmap_run("two_phase")[0], _vmap_run("auto")[0]):  # the same routes here
    for k in SHAPES:
      np.testing.assert_array_equal(a[k], b[k])


def test_the_two_phase_update_is_unbiased_over_keys():
  """E[update] = the workers' mean on both exchanges (phase 2 re-quantizes with a fresh key).

  The variance of an element is at most Σ_w (m_w/3)²/N² (phase 1, or the all-gather) plus
  (max_w m_w/3)² (phase 2: the shard's maximum is at most max_w m_w)."""
  k = 1000
  tx = jaxcomp.compress(TwoBit(), axis_name="w", exchange="two_phase")
  params = {key: jnp.zeros(s) for key, s in SHAPES.items()}
  state = parallel.replicate_workers(tx.init(params), N)
  axes = parallel.worker_axes(state)
  update = jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w")
  g = grads(0)
  means = jax.jit(jax.vmap(lambda key: update(g, state._replace(key=key))[0]))(
      jax.random.split(jax.random.PRNGKey(5), k))
  for name, s in SHAPES.items():
    m_w = np.abs(g[name]).reshape(N, -1).max(1).astype(np.float64)
    var = (m_w / 3) ** 2 @ np.ones(N) / N ** 2 + (m_w.max() / 3) ** 2 * (_routes("two_phase")[name] == "two_phase")
    mean = np.asarray(means[name], np.float64).mean(0)
    np.testing.assert_array_less(np.abs(mean - g[name].mean(0)), 5 * np.sqrt(var / k), err_msg=name)


# -- meshes of 2 x 2 CPU devices -------------------------------------------------------------------


def _mesh(axes):
  require_devices(4)  # skipped on an accelerator of fewer devices (benchmarks.accelerator)
  return jax.make_mesh((2, 2), axes, axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:4])


def _last_even_axis(shape):
  """The axis the hierarchy splits a tensor along over a host of 2 devices: the last one 2 divides."""
  return next((a for a in reversed(range(len(shape))) if shape[a] % 2 == 0), None)


@pytest.fixture(scope="module")
def hierarchy_run():
  """One step of compress(axis_name="hosts", within="local") on 2 hosts x 2 devices: (grads, each
  device's updates, metrics)."""
  axes = ("hosts", "local")
  mesh = _mesh(axes)
  tx = jaxcomp.compress(TwoBit(), axis_name="hosts", within="local")
  state = parallel.replicate_workers(tx.init({k: jnp.zeros(s) for k, s in SHAPES.items()}), 4)
  specs = parallel.worker_specs(state, axes)
  state = jax.device_put(state, parallel.worker_shardings(state, mesh, axes))

  def per_device(g, s):
    u, s = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    return jax.tree.map(lambda a: a[None], u), parallel.expand_workers(s)

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(axes), specs), out_specs=(P(axes), specs)))
  g = grads(0)  # device h·2 + l: host h, local device l
  u, state = step(g, state)
  jax.block_until_ready((u, state))
  return g, jax.device_get(u), {k: int(v) for k, v in jaxcomp.metrics(state).items() if "ratio" not in k}


def test_hierarchy_sends_each_devices_slices(hierarchy_run):
  """Per device, over "hosts": the payloads of its slices (a tensor split along the last axis 2
  divides, whole if none does), and one flag each."""
  _, u, m = hierarchy_run
  want = 0
  for s in SHAPES.values():
    axis = _last_even_axis(s)
    want += payload_bytes(math.prod(s) // (1 if axis is None else 2)) + FLAG
  assert want == (8 + 1) + (14 + 1) + (12 + 1) + (5 + 1) + (37 + 1)
  assert m["compressed_bytes_on_wire"] == m["bytes_on_wire"] == want
  assert m["local_bytes"] > 0


def test_hierarchy_update_is_the_same_everywhere_and_a_mean_of_the_hosts_roundings(hierarchy_run):
  g, u, _ = hierarchy_run
  for k, s in SHAPES.items():
    assert np.all(np.isfinite(u[k])), k
    for d in range(1, 4):
      np.testing.assert_array_equal(u[k][d], u[k][0], err_msg=f"{k} device {d}")
    host = (g[k][0::2] + g[k][1::2]) / np.float32(2)  # host h's mean over its 2 devices (float32)
    axis = _last_even_axis(s)
    if axis is None:
      scales = np.abs(host).reshape(2, -1).max(1).reshape((2,) + (1,) * len(s))
    else:  # each device's slice has its own scale
      halves = np.split(host, 2, axis=axis + 1)
      scales = np.concatenate([np.broadcast_to(np.abs(h).reshape(2, -1).max(1).reshape((2,) + (1,) * len(s)), h.shape)
                               for h in halves], axis=axis + 1)
    assert_mean_of_roundings(u[k][0], host, np.broadcast_to(scales, host.shape), f"hierarchy {k}")


# -- per_shard: 2 data workers x 2 model shards ----------------------------------------------------

SHARDED = {"a": P(), "b": P(), "c": P("model", None), "d": P(), "e": P("model", None)}


@pytest.fixture(scope="module")
def per_shard_run():
  mesh = _mesh(("data", "model"))
  with jax.set_mesh(mesh):
    params = jax.device_put({k: jnp.zeros(s) for k, s in SHAPES.items()},
                            {k: NamedSharding(mesh, SHARDED[k]) for k in SHAPES})
    step, state = per_shard_step(jaxcomp.per_shard(jaxcomp.compress(TwoBit(), axis_name="data"), "model"),
                                 params, mesh)
    g = grads(0, workers=2)
    u, state = step(jax.device_put(g, {k: NamedSharding(mesh, P("data", *SHARDED[k])) for k in SHAPES}), state)
    jax.block_until_ready((u, state))
    return g, jax.device_get(u), {k: int(v) for k, v in jaxcomp.metrics(state).items() if "ratio" not in k}


def test_per_shard_sends_each_shards_payload(per_shard_run):
  """Per device: the payload of its shard of every tensor (rows split over "model"), one flag each."""
  _, _, m = per_shard_run
  want = sum(payload_bytes(math.prod(s) // (2 if SHARDED[k] != P() else 1)) + FLAG for k, s in SHAPES.items())
  assert want == 81
  assert m["compressed_bytes_on_wire"] == m["bytes_on_wire"] == want


def test_per_shard_update_is_a_mean_of_the_workers_roundings_per_shard(per_shard_run):
  g, u, _ = per_shard_run
  for k, s in SHAPES.items():
    assert u[k].shape == s and np.all(np.isfinite(u[k])), k
    parts = np.split(g[k], 2, axis=1) if SHARDED[k] != P() else [g[k]]  # each model shard's rows
    scales = np.concatenate([np.broadcast_to(np.abs(p).reshape(2, -1).max(1).reshape((2,) + (1,) * len(s)), p.shape)
                             for p in parts], axis=1)
    assert_mean_of_roundings(u[k], g[k], scales, f"per_shard {k}")
