"""half (bf16/fp16 all-reduce), randomk (shared random-k) and natural (C_nat).

For each: the same numbers under vmap, pmap, shard_map and shard_map+vmap,
exact bytes on the wire (also for billion-element tensors, shapes only), clear
errors for bad arguments; then each one's own properties with fixed keys and
stated tolerances: half's division before the cast, its all-reduce and its
error feedback; randomk's distinct shared indices with inclusion probability
exactly k/n, unbiasedness with ``scale=True`` and conservation with error
feedback; natural's unbiasedness, its variance bound t²/8 and the handling of
values outside the packed exponent range.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import core, parallel
from jaxcomp.compressors.natural import NaturalPayload
from jaxcomp.compressors.randomk import affine_indices, affine_map
from jaxcomp.exchange import transport
from jaxcomp.exchange import plan

from _layouts import assert_error_feedback_conserves, run_layouts, vmap_update as _vmap_update

N = 8
KEY = jax.random.PRNGKey(0)

FACTORIES = {
    "half": lambda **kw: jaxcomp.half(**kw),
    "half_ef_fp16": lambda **kw: jaxcomp.half("float16", error_feedback=True, **kw),
    "randomk": lambda **kw: jaxcomp.randomk(0.2, **kw),
    "randomk_scaled": lambda **kw: jaxcomp.randomk(0.2, scale=True, **kw),
    "natural": lambda **kw: jaxcomp.natural(**kw),
}



# -- the same numbers under every layout ---------------------------------------------


def _layout_grads(step):
  k1, k2 = jax.random.split(jax.random.PRNGKey(100 + step))
  # "w": multiples of 1/2 in [-4, 4]. Then x/8 and every partial sum of 8 of them are exact in
  # bfloat16 (at most 7 significant bits), so the order in which the half all-reduce sums
  # (a ring, a tree, pairwise halving) cannot change a bit there. "b" is arbitrary.
  return {"w": jnp.clip(jnp.round(jax.random.normal(k1, (N, 6, 5)) * 2) / 2, -4, 4),
          "b": jax.random.normal(k2, (N, 3))}


def _half_order_bound(step):
  """How far two orders of summing the 8 bfloat16 halves x/8 can differ: 2·7 roundings of 2^-9·Σ|x/8|."""
  return 2 * 7 * 2.0**-9 * np.abs(np.asarray(_layout_grads(step)["b"]) / N).sum(0)


@pytest.mark.parametrize("name", ["half", "randomk", "natural"])
def test_layouts_agree(name):
  """vmap, pmap, shard_map and shard_map+vmap give the same updates, residuals, states and metrics.

  half's "b" is the exception that proves the rule: its all-reduce sums in bfloat16, and the
  layouts sum in different orders (lax.psum over devices, pairwise halving over vmapped
  workers), so there the updates agree up to the rounding of the partial sums.
  """
  assert len(jax.devices()) >= N, "tests/conftest.py should give 8 host devices"
  make_tx = lambda axis: FACTORIES[name](axis_name=axis)
  params = jax.tree.map(lambda g: g[0], _layout_grads(0))
  results = run_layouts(make_tx, params, _layout_grads, N)
  assert set(results) == {"vmap", "pmap", "shard_map", "shard_map+vmap"}
  ref_outs, ref_metrics, ref_state = results["vmap"]
  for layout, (outs, m, state) in results.items():
    close = lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, err_msg=layout)
    for step, (a, b) in enumerate(zip(ref_outs, outs)):
      if name == "half":
        close(a["w"], b["w"])
        assert np.all(np.abs(np.asarray(a["b"]) - np.asarray(b["b"])) <= _half_order_bound(step)), layout
      else:
        jax.tree.map(close, a, b)
    jax.tree.map(close, ref_state.local.residual, state.local.residual)
    jax.tree.map(np.testing.assert_array_equal, ref_state.inner, state.inner)  # randomk's shared key
    for k in ref_metrics:
      assert float(ref_metrics[k]) == float(m[k]), (layout, k)
  for upd in ref_outs:
    assert all(np.all(np.isfinite(np.asarray(u))) for u in jax.tree.leaves(upd))
  # The bytes of a real step: 30 + 3 values, one non-finite flag byte per tensor.
  wire = {"half": 2 * 33, "randomk": 4 * (6 + 1), "natural": (30 + 1) + (3 + 1)}[name]
  assert float(ref_metrics["bytes_on_wire"]) == wire + 2
  # Not vacuous: the two steps differ, and the compressor changed the mean (it is not the float pmean).
  assert not np.array_equal(ref_outs[0]["b"], ref_outs[1]["b"])
  exact = _layout_grads(1)["b"].mean(0)
  assert not np.allclose(ref_outs[1]["b"], exact, atol=1e-6)


# -- bytes on the wire ---------------------------------------------------------------


def _static_bytes(name, params, **kwargs):
  """The per-step byte counts, as the state holds them from init on (static for these compressors).

  That they are what a step really hands over is checked after two real steps in
  test_layouts_agree.
  """
  m = jaxcomp.metrics(FACTORIES[name](axis_name="w", **kwargs).init(params))
  return {k: float(v) for k, v in m.items()}


def test_exact_bytes_on_wire():
  params = {"w": jnp.zeros((7, 13)), "b": jnp.zeros(5)}  # 91 and 5 values
  flags = 2  # one non-finite flag byte per compressed tensor (nonfinite="propagate")
  m = {name: _static_bytes(name, params) for name in ("half", "randomk", "natural")}
  assert m["half"]["bytes_on_wire"] == 2 * (91 + 5) + flags
  # k = ceil(0.2·n) float32 values, no index
  assert m["randomk"]["bytes_on_wire"] == 4 * (math.ceil(0.2 * 91) + math.ceil(0.2 * 5)) + flags == 4 * (19 + 1) + 2
  # one byte a value plus one byte of base per tensor
  assert m["natural"]["bytes_on_wire"] == (91 + 1) + (5 + 1) + flags
  for name in m:
    assert m[name]["encoded_bytes"] == m[name]["bytes_on_wire"] and m[name]["float32_bytes"] == 4 * 96


def test_received_bytes_of_the_all_reduces():
  """half and randomk all-reduce: each worker receives a ring's 2(N − 1)/N of what it hands."""
  for comp, wire in ((jaxcomp.Half(), 200), (jaxcomp.RandomK(0.2), 4 * 20)):
    assert plan.choose(comp, 100, 4, "auto") == "all_gather"  # i.e. its own exchange
    state = comp.init_state((100,), KEY)
    counted = lambda x, comp=comp, state=state: transport.counted(comp.exchange(x, KEY, "w", state), "w")[1]
    traffic = jax.eval_shape(jax.vmap(counted, axis_name="w", out_axes=None), jnp.zeros((4, 100)))
    assert (traffic.sent.static, traffic.received.static) == (wire, math.ceil(2 * 3 * wire / 4))


@pytest.mark.parametrize("name", ["half", "randomk", "natural"])
def test_byte_counts_of_billion_element_tensors(name):
  """Shapes only (jax.eval_shape): the counts are exact Python ints past 2**32."""
  n = 2**31 - 1  # randomk's largest tensor (int32 indices)
  tx = FACTORIES[name]()
  state = jax.eval_shape(tx.init, {"w": jax.ShapeDtypeStruct((n,), jnp.float32)})
  m = state.local.metrics
  expected = {"half": 2 * n, "randomk": 4 * math.ceil(0.2 * n), "natural": n + 1}[name]
  assert m["bytes_on_wire"].is_static and m["bytes_on_wire"].static == expected
  assert m["float32_bytes"].static == 4 * n > 2**32


@pytest.mark.parametrize("name", ["half", "randomk", "natural"])
def test_dtypes_zeros_scalars_and_nonfinite(name):
  """Any float dtype in, the same out; zeros in, zeros out; a NaN makes that tensor's mean NaN (one program)."""
  tx = FACTORIES[name]()
  params = {"zero": jnp.zeros((7, 3)), "scalar": jnp.array(0.0), "bf16": jnp.zeros((33,), jnp.bfloat16),
            "f16": jnp.zeros((5, 5), jnp.float16)}
  grads = dict(params, scalar=jnp.array(-3.0), bf16=jnp.linspace(-1, 1, 33).astype(jnp.bfloat16),
               f16=jnp.linspace(-2, 2, 25).reshape(5, 5).astype(jnp.float16))
  update = jax.jit(tx.update)
  out, state = update(grads, tx.init(params))
  for k in grads:
    assert out[k].dtype == grads[k].dtype and out[k].shape == grads[k].shape, k
    assert np.all(np.isfinite(np.asarray(out[k], np.float32))), k
  np.testing.assert_array_equal(out["zero"], 0.0)
  assert float(out["scalar"]) < 0  # a one-element tensor keeps its sign
  if name == "randomk":  # k = ceil(0.2·1) = 1: a one-element tensor is always sent
    assert float(out["scalar"]) == -3.0
  bad, state2 = update(dict(grads, f16=grads["f16"].at[1, 1].set(jnp.nan)), state)
  assert np.all(np.isnan(np.asarray(bad["f16"], np.float32)))
  assert np.all(np.isfinite(np.asarray(bad["bf16"], np.float32)))
  assert float(jaxcomp.metrics(state2)["nonfinite_tensors"]) == 1


# -- bad arguments -------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors():
  with pytest.raises(ValueError, match="dtype must be one of 'bfloat16', 'float16'"):
    jaxcomp.half("float32")
  with pytest.raises(ValueError, match="dtype must be one of"):
    jaxcomp.Half(dtype="fp8")
  for bad in (0.0, 1.5, -0.1):
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
      jaxcomp.randomk(bad)
  for bad in ("0.1", True, None):
    with pytest.raises(TypeError, match="fraction must be a float"):
      jaxcomp.RandomK(fraction=bad)
  with pytest.raises(TypeError, match="scale must be a bool"):
    jaxcomp.randomk(0.1, scale="yes")
  with pytest.raises(ValueError, match="too large"):
    jaxcomp.RandomK().validate((2**16, 2**15), jnp.float32)
  with pytest.raises(ValueError, match="Unknown rng"):
    jaxcomp.natural(rng="mt19937")
  for name in ("half", "randomk"):  # their own all-reduce cannot be split into chunks
    with pytest.raises(ValueError, match="runs its own exchange"):
      jaxcomp.get_transform(name, exchange="two_phase")


# -- half ----------------------------------------------------------------------------


def test_half_divides_by_n_before_the_cast():
  """float16: a worker's 98304 (> 65504) fits once divided by 4; casting first (DDP's order) gives inf."""
  x = jnp.array([[98304.0], [8192.0], [8192.0], [8192.0]])  # x/4: 24576 and 2048, exact in float16
  tx = jaxcomp.half("float16", axis_name="w")
  upd, _ = _vmap_update(tx, x, parallel.replicate_workers(tx.init(jnp.zeros(1)), 4))
  np.testing.assert_array_equal(upd, [30720.0])  # the exact mean, exact in float16
  assert np.isinf(np.asarray(jnp.float32(98304.0).astype(jnp.float16)))  # cast first, then divide: inf / 4 = inf
  # No division at all (a plain half all-reduce of the sum) would overflow where the mean does not.
  y = jnp.full((4, 1), 60000.0)
  upd, _ = _vmap_update(tx, y, parallel.replicate_workers(tx.init(jnp.zeros(1)), 4))
  np.testing.assert_array_equal(upd, [60000.0])
  assert np.isinf(np.asarray(y.astype(jnp.float16).sum(0)))[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_moves_16_bit_values(dtype):
  """Under shard_map every collective of the compiled exchange moves 16-bit values, none float32.

  (XLA:CPU promotes a bfloat16 all-reduce to float32; jaxcomp.parallel.psum then reduces the
  bfloat16 bits with an all-to-all and an all-gather instead, the bytes of a ring all-reduce.)
  """
  comp = jaxcomp.Half(dtype)
  mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
  f = jax.shard_map(lambda x: transport.run(comp.exchange(x[0], KEY, "d", None), "d").mean, mesh=mesh, in_specs=P("d"), out_specs=P())
  hlo = jax.jit(f).lower(jnp.ones((4, 64))).compile().as_text()
  collectives = [line for line in hlo.splitlines()
                 if re.search(r"\b(all-reduce|all-to-all|all-gather|reduce-scatter)(-start)?\(", line)]
  assert collectives, hlo
  for line in collectives:
    shapes = line.split("=", 1)[1].split("all-", 1)[0]
    assert "f32" not in shapes and re.search(r"\b(bf16|f16|u16)\[", shapes), line
  if dtype == "float16" or jax.default_backend() != "cpu":
    assert any("all-reduce" in line for line in collectives)
  x = jax.random.normal(KEY, (4, 64))
  mean = jax.jit(f)(x)
  ref = (x / 4).astype(comp.dtype).astype(jnp.float32).sum(0)
  # The sum is rounded to the half dtype: at most 3 roundings (relative 2^-9 for bfloat16,
  # 2^-12 for float16) of partial sums of |x|/4.
  unit = 2.0**-9 if dtype == "bfloat16" else 2.0**-12
  bound = 3 * unit * np.asarray(jnp.abs(x / 4).sum(0)) + 1e-7
  assert np.all(np.abs(np.asarray(mean) - np.asarray(ref)) <= bound)


def test_half_one_worker_is_the_cast():
  x = jax.random.normal(KEY, (50,))
  for dtype in ("bfloat16", "float16"):
    ex, traffic = transport.counted(jaxcomp.Half(dtype).exchange(x, KEY, None, None), None)
    np.testing.assert_array_equal(ex.mean, x.astype(dtype).astype(jnp.float32))
    assert ex.payload.values.dtype == dtype and traffic.sent == 100 and traffic.received == 0


def test_half_error_feedback_conservation():
  """Off by default (as DDP). With it: per worker Σ own + r = Σ x exactly, the mean up to the half sum's rounding."""
  assert not jaxcomp.Half.error_feedback
  assert jax.tree.leaves(jaxcomp.half(axis_name="w").init(jnp.zeros(4)).local.residual) == []
  W, T = 4, 10
  tx = jaxcomp.half("bfloat16", axis_name="w", error_feedback=True)
  state = parallel.replicate_workers(tx.init(jnp.zeros(40)), W)
  total_in, total_upd, total_own, bound = jnp.zeros((W, 40)), jnp.zeros(40), jnp.zeros((W, 40)), 0.0
  for t in range(T):
    g = jax.random.normal(jax.random.PRNGKey(t), (W, 40))
    x = g + state.local.residual
    own = (x / W).astype(jnp.bfloat16).astype(jnp.float32) * W  # what each worker handed, scaled back
    upd, state = _vmap_update(tx, g, state)
    total_in, total_upd, total_own = total_in + g, total_upd + upd, total_own + own
    # The all-reduce sums W bfloat16 values in bfloat16: W − 1 roundings of at most 2^-9 of Σ|h|.
    bound = bound + (W - 1) * 2.0**-9 * jnp.abs(own / W).sum(0)
  r = state.local.residual
  np.testing.assert_allclose(total_own + r, total_in, atol=2e-5)  # per worker, exact up to float32
  assert float(jnp.max(jnp.abs(r))) > 1e-4  # not vacuous: the residuals hold the cast's rounding
  err = np.abs(np.asarray(total_upd - (total_in - r).mean(0)))
  assert np.all(err <= np.asarray(bound) + 2e-5)
  # One worker: no sum, so exact: Σ updates + r = Σ inputs.
  tx1 = jaxcomp.half(error_feedback=True)
  st = tx1.init(jnp.zeros(40))
  tin, tout = jnp.zeros(40), jnp.zeros(40)
  for t in range(T):
    g = jax.random.normal(jax.random.PRNGKey(50 + t), (40,))
    out, st = jax.jit(tx1.update)(g, st)
    tin, tout = tin + g, tout + out
  np.testing.assert_allclose(tout + st.local.residual, tin, atol=2e-5)


# -- randomk -------------------------------------------------------------------------


_affine_map = jax.jit(affine_map, static_argnums=1)
_affine_shifts = jax.jit(jax.vmap(affine_indices, in_axes=(None, 0, None, None)), static_argnums=(2, 3))


def test_randomk_indices_distinct_with_inclusion_probability_exactly_k_over_n():
  """For any unit a, index j is among (a·i + b) mod n, i < k, for exactly k of the n shifts b."""
  for n, k in [(60, 7), (64, 13), (61, 61), (1, 1)]:
    units = set()
    for s in range(3):
      a, _ = _affine_map(jax.random.PRNGKey(s), n)
      assert math.gcd(int(a), n) == 1 and 1 <= int(a) < max(n, 2)
      units.add(int(a))
    assert n < 60 or len(units) > 1  # a is random too
    hits = np.zeros(n, int)
    for a in units:
      idx = np.asarray(_affine_shifts(jnp.int32(a), jnp.arange(n), n, k))
      assert all(len(set(row)) == k for row in idx), (n, k)  # without replacement
      np.testing.assert_array_equal(idx, [(a * np.arange(k) + b) % n for b in range(n)])
      hits += np.bincount(idx.ravel(), minlength=n)
    np.testing.assert_array_equal(hits, k * len(units))


def test_randomk_affine_indices_exact_for_large_n():
  """(a·i + b) mod n with 32-bit arithmetic only, checked against Python integers near n = 2**31."""
  n, k = 2**31 - 1, 5000
  a, b = _affine_map(KEY, n)
  idx = np.asarray(affine_indices(a, b, n, k))
  np.testing.assert_array_equal(idx, [(int(a) * i + int(b)) % n for i in range(k)])
  assert len(set(idx.tolist())) == k
  # The multiplier is a unit also for n with many prime factors (2·3·7·11·31·151·331).
  for s in range(4):
    a, _ = _affine_map(jax.random.PRNGKey(s), 2**31 - 2)
    assert math.gcd(int(a), 2**31 - 2) == 1


RANDOMK_TX = jaxcomp.randomk(0.2, axis_name="w")  # shared by two tests: one compiled update
RANDOMK_SHAPE = (6, 9)


def test_randomk_every_worker_sends_the_same_indices():
  W = 4
  k = math.ceil(0.2 * 54)
  state = parallel.replicate_workers(RANDOMK_TX.init(jnp.zeros(RANDOMK_SHAPE)), W)
  supports = []
  for t in range(2):
    g = jax.random.normal(jax.random.PRNGKey(t), (W,) + RANDOMK_SHAPE) + 3.0  # no zeros
    upd, new = _vmap_update(RANDOMK_TX, g, state)
    x = g + state.local.residual
    sent = np.asarray(new.local.residual == 0)  # r = x − own is exactly 0 where the value was sent
    assert all(sent[w].sum() == k for w in range(W))
    for w in range(1, W):
      np.testing.assert_array_equal(sent[w], sent[0])
    np.testing.assert_allclose(np.asarray(upd)[sent[0]], np.asarray(x.mean(0))[sent[0]], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(upd)[~sent[0]], 0.0)
    supports.append(sent[0])
    state = new
  assert not np.array_equal(supports[0], supports[1])  # the shared key advanced: a new draw


def test_randomk_scaled_is_unbiased():
  """E[(n/k)·x ⊙ 1_S] = x; over K draws of the shared key, within 5 standard errors (σ² = (n/k − 1)·x²)."""
  n, K = 20, 4000
  comp = jaxcomp.RandomK(fraction=0.25, scale=True)  # k = 5
  x = jax.random.normal(KEY, (n,)) + 0.5
  keys = jax.random.split(jax.random.PRNGKey(7), K)
  means = jax.jit(jax.vmap(lambda s: transport.run(comp.exchange(x, KEY, None, s), None).mean))(keys)
  sd = np.abs(np.asarray(x)) * math.sqrt(n / 5 - 1) / math.sqrt(K)
  assert np.all(np.abs(np.asarray(means.mean(0) - x)) <= 5 * sd)
  np.testing.assert_allclose(np.asarray((means != 0).mean(0)), 5 / n, atol=5 * math.sqrt(0.25 * 0.75 / K))
  # scale=True is meant without error feedback: off unless asked for.
  assert jax.tree.leaves(jaxcomp.randomk(0.25, scale=True).init(x).local.residual) == []
  assert jax.tree.leaves(jaxcomp.randomk(0.25, scale=True, error_feedback=True).init(x).local.residual)
  assert comp.unbiased and not jaxcomp.RandomK().unbiased


def test_randomk_error_feedback_conservation():
  """Per worker: Σ own decodes + final residual = Σ inputs; the update is their mean."""
  state = assert_error_feedback_conserves(RANDOMK_TX, shape=RANDOMK_SHAPE)
  assert float(jnp.max(jnp.abs(state.local.residual))) > 0.1  # not vacuous


# -- natural -------------------------------------------------------------------------


NATURAL_LEN = 28  # every natural test pads its values to this length with zeros: one compiled program


@jax.jit
def _encode_decode_natural(keys, x):
  comp = jaxcomp.Natural()

  def one(key):
    p = comp.encode(x, key, None)
    return p, comp.decode(p, x.shape)

  return jax.vmap(one)(keys)


def _natural_draws(x, K, seed=1):
  """K encodings of ``x`` (zero-padded to NATURAL_LEN; zeros leave the base unchanged) and their decodes."""
  x = jnp.asarray(x, jnp.float32)
  padded = jnp.zeros(NATURAL_LEN, jnp.float32).at[:x.shape[0]].set(x)
  p, d = _encode_decode_natural(jax.random.split(jax.random.PRNGKey(seed), K), padded)
  m = x.shape[0]
  return p._replace(codes=p.codes[:, :m]), d[:, :m]


def test_natural_unbiased_with_variance_at_most_an_eighth():
  """Each value rounds to a neighbouring power of two; mean within 5 s.e.; variance (|t|−2^e)(2^(e+1)−|t|) ≤ t²/8."""
  e = jnp.array([-20.0, -7.0, -1.0, 0.0, 3.0, 11.0, 19.0])
  x = jnp.concatenate([2.0**e * 4 / 3, -(2.0**e) * 1.1, 2.0**e * 1.9, -(2.0**e)])  # 4/3: the worst case
  K = 4000
  _, d = _natural_draws(x, K)
  d, xs = np.asarray(d, np.float64), np.asarray(x, np.float64)
  lo = 2.0 ** np.floor(np.log2(np.abs(xs)))
  assert np.all((np.abs(d) == lo) | (np.abs(d) == 2 * lo)) and np.all(np.sign(d) == np.sign(xs))
  var = (np.abs(xs) - lo) * (2 * lo - np.abs(xs))
  assert np.all(var <= xs**2 / 8 * (1 + 1e-6))
  np.testing.assert_allclose(var[:7], xs[:7] ** 2 / 8, rtol=1e-6)  # attained at 4/3·2^e
  assert np.all(np.abs(d.mean(0) - xs) <= 5 * np.sqrt(var / K))
  emp = d.var(0)
  assert np.all(np.abs(emp - var) <= 0.15 * var + 1e-300)  # relative s.e. of a variance ≈ sqrt(2/K) = 2.2%
  np.testing.assert_array_equal(d[:, 21:], np.broadcast_to(xs[21:], (K, 7)))  # powers of two are exact


def test_natural_out_of_range_values():
  """Zeros, values below the lowest level L (including subnormals) and |t| ≥ 2^127, as the docstring says."""
  K = 4000
  # A tensor whose largest value is 2^100: base = 228 − 126 = 102, L = 2^(102 − 127) = 2^-25.
  L = 2.0**-25
  x = jnp.array([2.0**100, 0.375 * L, -0.75 * L, 2.0**-140, 0.0, -0.0], jnp.float32)
  p, d = _natural_draws(x, K)
  assert np.all(np.asarray(p.base) == 102)
  d = np.asarray(d, np.float64)
  for i, prob in ((1, 0.375), (2, 0.75)):
    assert set(np.unique(np.abs(d[:, i]))) <= {0.0, L}
    freq = np.mean(d[:, i] != 0)
    assert abs(freq - prob) <= 5 * math.sqrt(prob * (1 - prob) / K)  # unbiased: E = prob·L = |t|
  # 2^-140 < 2^-24·L: floor(2^24·|t|/L) = 0, always sent as 0, a bias below the stated 2^-24·L.
  np.testing.assert_array_equal(d[:, 3], 0.0)
  assert 2.0**-140 < 2.0**-24 * L
  np.testing.assert_array_equal(d[:, 4:], 0.0)
  np.testing.assert_array_equal(np.asarray(p.codes)[:, 4:] & 0x7F, 0)
  # Subnormals in a tensor of small values: base = 1, L = 2^-126, the smallest normal. The
  # probability comes from the bits (the platform may flush subnormals in arithmetic), so
  # the codes are counted, not the decoded floats.
  sub = np.float32(2.0**-128)  # a subnormal: 0.25·2^-126
  assert 0 < sub < np.finfo(np.float32).tiny
  y = jnp.asarray(np.array([0.5, sub, -3 * sub], np.float32))
  p, d = _natural_draws(y, K, seed=2)
  assert np.all(np.asarray(p.base) == 1)
  codes = np.asarray(p.codes)
  for i, prob in ((1, 0.25), (2, 0.75)):
    freq = np.mean(codes[:, i] & 0x7F == 1)
    assert abs(freq - prob) <= 5 * math.sqrt(prob * (1 - prob) / K)
    assert set(np.unique(codes[:, i] & 0x7F)) <= {0, 1}
  assert np.all(codes[:, 2] >> 7 == 1)  # the sign is kept
  decoded_level = np.asarray(jaxcomp.Natural().decode(
      NaturalPayload(codes=jnp.array([1], jnp.uint8), base=jnp.uint8(1)), (1,)))
  assert decoded_level[0] == np.float32(2.0**-126)
  # |t| ≥ 2^127 cannot round up (no 2^128 in float32): sent as 2^127.
  big = jnp.array([1.5 * 2.0**127, -(2.0**127)], jnp.float32)
  _, d = _natural_draws(big, K)
  np.testing.assert_array_equal(np.asarray(d), np.broadcast_to(np.float32([2.0**127, -(2.0**127)]), (K, 2)))


def test_natural_codes_are_one_byte():
  p = jax.eval_shape(lambda x: jaxcomp.Natural().encode(x, KEY, None), jax.ShapeDtypeStruct((1001,), jnp.float32))
  assert p.codes.dtype == jnp.uint8 and p.codes.shape == (1001,) and p.base.dtype == jnp.uint8
  assert core.tree_nbytes(p) == 1001 + 1
  x = jax.random.normal(KEY, (NATURAL_LEN,)) * 10
  _, d = _natural_draws(x, 16)
  r = np.abs(np.asarray(d)) / np.abs(np.asarray(x))
  assert np.all((r > 0.5) & (r < 2.0)) and np.all(np.sign(d) == np.sign(np.asarray(x)))
