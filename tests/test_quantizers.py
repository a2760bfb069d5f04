"""QSGD, 3LC, int8, block int4, stochastic ternary, signSGD, EF-SignSGD: shared requirements, then their decisions.

Shared requirements (every compressor here): jit-able, any float dtype and
shape (scalars, size 0, sizes off the packing group), zeros in -> zeros out,
the shared non-finite policy, the same numbers under vmap / pmap / shard_map /
shard_map+vmap, conservation with error feedback, exact bytes on the wire.
Then each paper's own properties, with fixed keys and stated tolerances.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import core, parallel
from jaxcomp.codecs import base243, zerorun
from jaxcomp.compressors.qsgd import code_width, levels_for_bits
from jaxcomp.compressors.threelc import ThreeLC, quantize_3value

from _layouts import assert_error_feedback_conserves, require_devices, run_layouts, vmap_update as _vmap_update

pytestmark = pytest.mark.accelerator

N = 8

# name -> (compressor instance, factory(**compress kwargs))
COMPRESSORS = {
    "qsgd": (jaxcomp.QSGD(), lambda **kw: jaxcomp.qsgd(**kw)),
    "qsgd_l2_whole": (jaxcomp.QSGD(levels=3, bucket_size=None, norm="l2"),
                      lambda **kw: jaxcomp.qsgd(3, None, "l2", **kw)),
    "threelc": (jaxcomp.ThreeLC(), lambda **kw: jaxcomp.threelc(**kw)),
    "threelc_capacity": (jaxcomp.ThreeLC(sparsity=1.5, capacity=0.5),
                         lambda **kw: jaxcomp.threelc(1.5, capacity=0.5, **kw)),
    "int8": (jaxcomp.Int8(), lambda **kw: jaxcomp.int8(**kw)),
    "stochastic_ternary": (jaxcomp.StochasticTernary(), lambda **kw: jaxcomp.stochastic_ternary(**kw)),
    "signsgd": (jaxcomp.SignSGD(), lambda **kw: jaxcomp.signsgd(**kw)),
    "ef_signsgd": (jaxcomp.EFSignSGD(), lambda **kw: jaxcomp.ef_signsgd(**kw)),
    "blockint4": (jaxcomp.BlockInt(bits=4, block=64), lambda **kw: jaxcomp.blockint(bits=4, block=64, **kw)),
}
EF = [k for k, (c, _) in COMPRESSORS.items() if c.error_feedback]
# One QSGD config suffices (compile time); block int4's layouts are the golden digests' (tests/_golden.py).
LAYOUTS = [k for k in COMPRESSORS if k not in ("qsgd_l2_whole", "blockint4")]




def _roundtrip(comp, x, key):
  return comp.decode(comp.encode(x, key, comp.agree(x)), x.shape)


# -- shared requirements --------------------------------------------------------


def _layout_grads(step):
  k1, k2 = jax.random.split(jax.random.PRNGKey(100 + step))
  conv = jax.random.normal(k1, (N, 5, 5, 3, 8))
  return {
      # sparse at step 0 (the zero-run stream fits), dense at step 1 (it does not)
      "conv": conv * (jnp.abs(conv) > (1.2 if step == 0 else 0.0)),
      "scalar": jax.random.normal(k2, (N,)),
  }


@pytest.mark.parametrize("name", LAYOUTS)
def test_layouts_agree(name):
  """vmap, pmap, shard_map and shard_map+vmap give the same updates and metrics."""
  require_devices(N)
  factory = COMPRESSORS[name][1]
  make_tx = lambda axis: factory(axis_name=axis)
  params = jax.tree.map(lambda g: g[0], _layout_grads(0))
  results = run_layouts(make_tx, params, _layout_grads, N)
  assert set(results) == {"vmap", "pmap", "shard_map", "shard_map+vmap"}
  ref_outs, ref_metrics, ref_state = results["vmap"]
  close = lambda layout: lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, err_msg=layout)
  for layout, (outs, m, state) in results.items():
    for a, b in zip(ref_outs, outs):
      jax.tree.map(close(layout), a, b)
    jax.tree.map(close(layout), ref_state.local.residual, state.local.residual)
    for k in ref_metrics:
      assert float(ref_metrics[k]) == float(m[k]), (layout, k)
  for upd in ref_outs:
    assert all(np.all(np.isfinite(np.asarray(u))) for u in jax.tree.leaves(upd))


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_dtypes_shapes_zeros_scalars_jit(name):
  tx = COMPRESSORS[name][1]()
  params = {
      "zero": jnp.zeros((7, 3)),
      "scalar": jnp.array(2.0),
      "empty": jnp.zeros((0, 4)),
      "bf16": jnp.zeros((33,), jnp.bfloat16),
      "f16": jnp.zeros((5, 5), jnp.float16),
      "odd": jnp.zeros((1001,)),
  }
  grads = dict(
      params,
      scalar=jnp.array(-3.0),
      bf16=jnp.linspace(-1, 1, 33).astype(jnp.bfloat16),
      f16=jnp.linspace(-2, 2, 25).reshape(5, 5).astype(jnp.float16),
      odd=jax.random.normal(jax.random.PRNGKey(0), (1001,)),
  )
  update = jax.jit(tx.update)
  out, state = update(grads, tx.init(params))
  out, state = update(grads, state)  # a second step, with whatever residual the first left
  for k in grads:
    assert out[k].dtype == grads[k].dtype and out[k].shape == grads[k].shape, k
    assert np.all(np.isfinite(np.asarray(out[k], np.float32))), k
  assert np.all(np.asarray(out["zero"]) == 0), "an all-zero tensor must decode to zeros"
  assert out["empty"].shape == (0, 4)
  # A scalar keeps its sign (every compressor here sends a one-element tensor's sign).
  assert float(out["scalar"]) < 0
  # The bf16/f16 inputs went through the compressor: the output correlates with them.
  for k in ("bf16", "f16", "odd"):
    a, b = np.asarray(out[k], np.float32).ravel(), np.asarray(grads[k], np.float32).ravel()
    assert np.dot(a, b) > 0.3 * np.linalg.norm(a) * np.linalg.norm(b), k


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_nonfinite_policies(name):
  """The shared policy: 'propagate' -> all-NaN mean, residual kept; 'zero' -> that worker sends zeros."""
  factory = COMPRESSORS[name][1]
  comp = COMPRESSORS[name][0]
  g = jax.random.normal(jax.random.PRNGKey(0), (2, 40))
  bad = g.at[1, 3].set(jnp.nan)
  for policy in ("propagate", "zero"):
    tx = factory(axis_name="w", nonfinite=policy)
    state = parallel.replicate_workers(tx.init(jnp.zeros(40)), 2)
    _, state = _vmap_update(tx, g, state)  # a first step, so residuals are nonzero
    upd, state2 = _vmap_update(tx, bad, state)
    m = jaxcomp.metrics(state2)
    assert float(m["nonfinite_tensors"]) == 1  # one tensor on one of two workers (a sum over workers)
    if comp.error_feedback:
      np.testing.assert_array_equal(state2.local.residual[1], state.local.residual[1])
    if policy == "propagate":
      assert np.all(np.isnan(np.asarray(upd)))
    else:
      assert np.all(np.isfinite(np.asarray(upd)))
      # Worker 1 sent zeros: the same as a step whose input x = g + r is exactly 0 on worker 1.
      cancel = -state.local.residual[1] if comp.error_feedback else jnp.zeros(40)
      ref, _ = _vmap_update(tx, jnp.stack([g[0], cancel]), state)
      np.testing.assert_allclose(upd, ref, atol=1e-6)


@pytest.mark.parametrize("name", EF)
def test_error_feedback_conservation(name):
  """Per worker: sum of own decodes + final residual == sum of inputs; the update is their mean."""
  T = 12
  comp = COMPRESSORS[name][0]
  state = assert_error_feedback_conserves(COMPRESSORS[name][1](axis_name="w"), steps=T)
  assert float(jnp.max(jnp.abs(state.local.residual))) > 0  # not vacuous
  # Single worker: sum(decoded) + residual == sum(inputs), exactly up to float error.
  tx1 = COMPRESSORS[name][1]()
  st = tx1.init(jnp.zeros(50))
  tin, tout = jnp.zeros(50), jnp.zeros(50)
  for t in range(T):
    g = jax.random.normal(jax.random.PRNGKey(50 + t), (50,))
    out, st = jax.jit(tx1.update)(g, st)
    tin, tout = tin + g, tout + out
  np.testing.assert_allclose(tout + st.local.residual, tin, atol=2e-5)
  assert comp.error_feedback


def _bytes(comp, n):
  x = jnp.linspace(-1.0, 1.0, n)
  p = jax.eval_shape(lambda x, k: comp.encode(x, k, comp.agree(x)), x, jax.random.PRNGKey(0))  # shapes only
  leaves = jax.tree.leaves(p)
  for leaf in leaves:  # the wire is packed integers plus float32 scales
    assert leaf.dtype in (jnp.uint8, jnp.int8, jnp.int32, jnp.float32), leaf.dtype
    assert leaf.dtype != jnp.float32 or leaf.size <= -(-n // 64) + 1, "floats only as scales"
  return core.tree_nbytes(p)


def test_exact_bytes_on_wire():
  n = 1001
  assert _bytes(jaxcomp.QSGD(levels=7, bucket_size=512), n) == math.ceil(n * 4 / 8) + 4 * 2
  assert _bytes(jaxcomp.QSGD(levels=1, bucket_size=128), n) == math.ceil(n * 2 / 8) + 4 * 8
  assert _bytes(jaxcomp.QSGD(levels=127, bucket_size=None), n) == n + 4
  assert _bytes(jaxcomp.QSGD(levels=16), n) == math.ceil(n * 6 / 8) + 8  # 33 levels: 6 bits
  assert _bytes(jaxcomp.ThreeLC(), n) == math.ceil(n / 5) + 4
  assert _bytes(jaxcomp.ThreeLC(capacity=0.5), n) == math.ceil(0.5 * math.ceil(n / 5)) + 4 + 4
  assert _bytes(jaxcomp.Int8(), n) == n + 4
  assert _bytes(jaxcomp.StochasticTernary(), n) == math.ceil(n / 5) + 4
  assert _bytes(jaxcomp.SignSGD(), n) == math.ceil(n / 8) + 1
  assert _bytes(jaxcomp.EFSignSGD(), n) == math.ceil(n / 8) + 4
  assert _bytes(jaxcomp.BlockInt(bits=4, block=64), n) == math.ceil(n * 4 / 8) + 4 * math.ceil(n / 64)
  assert _bytes(jaxcomp.BlockInt(bits=8, block=64), n) == n + 4 * math.ceil(n / 64)


def test_registry_and_validation():
  for name in ("qsgd", "threelc", "int8", "stochastic_ternary", "signsgd", "ef_signsgd"):
    assert name in jaxcomp.REGISTRY
    tx = jaxcomp.get_transform(name, axis_name=None, seed=3)
    params = {"w": jnp.ones((10,))}
    chain = optax.chain(tx, optax.sgd(0.1))
    jax.jit(chain.update)({"w": jnp.ones((10,))}, chain.init(params), params)  # one program, not eager ops
  with pytest.raises(ValueError, match="sparsity"):
    jaxcomp.threelc(sparsity=2.0)
  with pytest.raises(ValueError, match="sparsity"):
    jaxcomp.threelc(sparsity=0.99)
  with pytest.raises(ValueError, match="capacity"):
    jaxcomp.threelc(capacity=1.5)
  with pytest.raises(ValueError, match="zero_run"):
    jaxcomp.threelc(zero_run=False, capacity=0.5)
  with pytest.raises(ValueError, match="levels"):
    jaxcomp.qsgd(levels=0)
  with pytest.raises(ValueError, match="norm"):
    jaxcomp.qsgd(norm="l1")
  with pytest.raises(ValueError, match="both"):
    jaxcomp.qsgd(levels=7, bits_per_value=4)
  with pytest.raises(ValueError, match="bucket_size"):
    jaxcomp.qsgd(bucket_size=0)


# -- QSGD -------------------------------------------------------------------------


def test_qsgd_levels_for_bits():
  """b bits per value, sign included, carry s = 2**(b-1) - 1 levels; the wire uses exactly b bits."""
  assert [levels_for_bits(b) for b in (2, 3, 4, 8)] == [1, 3, 7, 127]
  for b in (2, 3, 4, 8, 12):
    assert code_width(levels_for_bits(b)) == b
    assert code_width(levels_for_bits(b) + 1) == b + 1  # one more level needs a bit more
  # The factory's default is 4-bit: s = 7.
  tx = jaxcomp.qsgd()
  st = tx.init(jnp.zeros(64))
  out, _ = jax.jit(tx.update)(jnp.linspace(-1, 1, 64), st)
  levels = np.asarray(out) * 7  # max-norm 1: values are l/7
  np.testing.assert_allclose(levels, np.round(levels), atol=1e-5)
  assert np.abs(np.round(levels)).max() <= 7
  with pytest.raises(ValueError):
    levels_for_bits(1)


def _qsgd_draws(comp, v, K, seed):
  keys = jax.random.split(jax.random.PRNGKey(seed), K)
  return np.asarray(jax.jit(jax.vmap(lambda k: _roundtrip(comp, v, k)))(keys), np.float64)


def _qsgd_exact(v, s, d, norm):
  """Per-element std and per-bucket expected squared error of Eq. 4 (float64)."""
  vb = np.pad(v, (0, -len(v) % d)).reshape(-1, d)
  M = np.abs(vb).max(1) if norm == "max" else np.sqrt((vb**2).sum(1))
  x = np.abs(vb) * (s / np.where(M > 0, M, 1))[:, None]
  p = x - np.floor(x)
  var = (M[:, None] / s) ** 2 * p * (1 - p)
  return np.sqrt(var).reshape(-1)[: len(v)], var.sum(1), M, vb


@pytest.mark.parametrize("norm,levels", [("max", 1), ("max", 7), ("l2", 3)])
def test_qsgd_unbiased_and_variance_bound(norm, levels):
  """Lemma 3.1 per bucket: E[Q(v)] = v and E||Q(v)-v||^2 within the bound.

  K = 4000 draws with fixed keys. Unbiasedness: every element's mean within
  5 standard errors (exact per-element std from Eq. 4), elements on a level
  exactly. Variance: each bucket's empirical E||Q-v||^2 within 5 standard
  errors of the exact value sum (M/s)^2 p(1-p), and below the bound:
  L2 norm min(d/s^2, sqrt(d)/s)||v||^2 (Lemma 3.1 (ii)); max norm
  min(d/(4s^2), sqrt(d)/s)||v||^2 (derived in the module docstring).
  """
  d, s, K = 64, levels, 4000
  comp = jaxcomp.QSGD(levels=s, bucket_size=d, norm=norm)
  v = np.asarray(jax.random.normal(jax.random.PRNGKey(7), (200,)) * jnp.repeat(jnp.array([0.01, 1.0, 30.0, 2.0]), 50))
  draws = _qsgd_draws(comp, jnp.asarray(v, jnp.float32), K, seed=11)
  v32 = np.asarray(jnp.asarray(v, jnp.float32), np.float64)
  std, bucket_var, M, vb = _qsgd_exact(v32, s, d, norm)
  mean = draws.mean(0)
  exact = std < 1e-6
  np.testing.assert_allclose(mean[exact], v32[exact], rtol=1e-5, atol=1e-6)
  z = np.abs(mean[~exact] - v32[~exact]) / (std[~exact] / math.sqrt(K))
  assert z.max() < 5.0, z.max()
  assert abs(float(np.mean(z**2)) - 1.0) < 0.3

  sq = ((np.pad(draws, ((0, 0), (0, -draws.shape[1] % d))) - np.pad(v32, (0, -len(v32) % d))) ** 2)
  sq = sq.reshape(K, -1, d).sum(2)  # (K, buckets): squared error per bucket per draw
  emp = sq.mean(0)
  se = sq.std(0) / math.sqrt(K)
  assert np.all(np.abs(emp - bucket_var) <= 5 * se + 1e-9), (emp, bucket_var, se)
  norm2 = (vb**2).sum(1)
  if norm == "l2":
    bound = min(d / s**2, math.sqrt(d) / s) * norm2
  else:
    bound = min(d / (4 * s**2), math.sqrt(d) / s) * norm2
    assert np.all(emp <= d * M**2 / (4 * s**2) * (1 + 1e-6) + 5 * se)  # the sharper per-bucket form
  assert np.all(emp <= bound), (emp, bound)


def test_qsgd_buckets_padding_and_zero_bucket():
  """Buckets are d consecutive values with their own norm; a zero bucket decodes to zeros."""
  comp = jaxcomp.QSGD(levels=1, bucket_size=4)
  x = jnp.array([0.0, 0.0, 0.0, 0.0, 3.0, -3.0, 3.0, -3.0, 0.5])  # last bucket padded
  p = jax.jit(comp.encode)(x, jax.random.PRNGKey(0), None)  # one program, not eager ops
  np.testing.assert_array_equal(np.asarray(p.norms), [0.0, 3.0, 0.5])
  out = np.asarray(jax.jit(comp.decode, static_argnums=1)(p, x.shape))
  np.testing.assert_array_equal(out, [0, 0, 0, 0, 3, -3, 3, -3, 0.5])  # |v| = max: exact
  assert p.codes.shape == (math.ceil(9 * 2 / 8),)


@pytest.mark.parametrize("levels,bucket", [(7, 16), (3, 5), (7, None), (127, 24)])
def test_qsgd_exact_on_levels_both_packings(levels, bucket):
  """Values on the grid l/s*M decode exactly, whether buckets are packed per row (d*b % 8 == 0) or not."""
  n = 203
  rs = np.random.RandomState(levels)
  lv = rs.randint(-levels, levels + 1, size=n).astype(np.float32)
  d = n if bucket is None else bucket
  for start in range(0, n, d):  # every bucket holds its max-norm level, so M = 3 exactly
    lv[start] = levels
  x = jnp.asarray(lv * (3.0 / levels))
  comp = jaxcomp.QSGD(levels=levels, bucket_size=bucket)
  p = jax.jit(comp.encode)(x, jax.random.PRNGKey(0), None)  # one program, not eager ops
  assert p.codes.shape == (math.ceil(n * code_width(levels) / 8),)
  decoded = jax.jit(comp.decode, static_argnums=1)(p, x.shape)
  np.testing.assert_allclose(np.asarray(decoded), np.asarray(x), rtol=1e-6, atol=1e-6)


# -- 3LC --------------------------------------------------------------------------


@pytest.mark.parametrize("sparsity", [1.0, 1.9])
def test_threelc_error_bound_and_residual(sparsity):
  """§3.1: |T_in - T_out| <= m/2 every step, and the residual is exactly T_in - T_out."""
  tx = jaxcomp.threelc(sparsity)
  st = tx.init(jnp.zeros(300))
  r_prev = jnp.zeros(300)
  update = jax.jit(tx.update)
  nonzero = 0
  for t in range(6):
    g = jax.random.normal(jax.random.PRNGKey(t), (300,)) * jnp.linspace(0.01, 3, 300)
    out, st = update(g, st)
    t_in = g + r_prev
    m = float(jnp.max(jnp.abs(t_in))) * sparsity
    err = np.abs(np.asarray(t_in - out))
    assert err.max() <= m / 2 * (1 + 1e-6), (err.max(), m / 2)
    assert m / 2 < float(jnp.max(jnp.abs(t_in))) + 1e-6  # and m/2 < max|T_in| (s < 2)
    # Outputs are ternary multiples of m.
    lv = np.asarray(out) / m
    np.testing.assert_allclose(lv, np.round(lv), atol=1e-5)
    assert set(np.unique(np.round(lv))) <= {-1.0, 0.0, 1.0}
    np.testing.assert_allclose(st.local.residual, t_in - out, atol=1e-6)
    nonzero += int(np.sum(np.round(lv) != 0))
    r_prev = st.local.residual
  assert nonzero > 0


def test_threelc_ties_round_half_to_even():
  """Decision: values at exactly +-m/2 round to 0 (round half to even, as tf.round)."""
  x = jnp.array([4.0, 2.0, -2.0, 2.0000005, -1.9999995, 0.0, -4.0])  # m = 4, m/2 = 2
  q, m = quantize_3value(x, 1.0)
  assert float(m) == 4.0
  np.testing.assert_array_equal(np.asarray(q), [1, 0, 0, 1, 0, 0, -1])
  q, m = quantize_3value(jnp.array([1.0, 0.75, -0.75, 0.74]), 1.5)  # m = 1.5: ties at 0.75
  np.testing.assert_array_equal(np.asarray(q), [1, 0, 0, 0])
  q, m = quantize_3value(jnp.zeros(5), 1.0)
  assert float(m) == 0 and np.all(np.asarray(q) == 0)


def test_threelc_sparsity_makes_more_zeros_and_encoded_bytes_is_exact_zero_run():
  g = jax.random.normal(jax.random.PRNGKey(0), (5000,))
  zeros, enc = [], []
  for s in (1.0, 1.5, 1.9):
    comp = ThreeLC(sparsity=s)
    p = jax.jit(comp.encode)(g, None, None)  # one program, not eager ops
    q = np.asarray(jax.jit(base243.base243_decode, static_argnums=1)(p.codes, g.size))
    zeros.append(np.mean(q == 0))
    e = int(comp.encoded_bytes(p, g.shape))
    assert e == len(zerorun.zero_run_encode(np.asarray(p.codes))) + 4  # exact, against the host codec
    enc.append(e)
  assert zeros[0] < zeros[1] < zeros[2]
  assert enc[0] > enc[1] > enc[2]
  assert enc[2] < (math.ceil(5000 / 5) + 4) / 3  # s=1.9 on a Gaussian: mostly zero runs
  assert ThreeLC(zero_run=False).encoded_bytes(None, g.shape) is None


def test_threelc_capacity_fallback_is_counted_and_lossless():
  """capacity: the zero-run buffer is the wire; on overflow a plain round runs; numbers never change."""
  W = 4
  g = jax.random.normal(jax.random.PRNGKey(0), (W, 2000))
  sparse = g * (jnp.abs(g) > 2.0)  # fits in 0.5 of the base-3^5 size
  dense = sparse.at[2].set(g[2])  # worker 2 dense: does not fit
  plain = jaxcomp.threelc(1.0, axis_name="w")
  capped = jaxcomp.threelc(1.0, capacity=0.5, axis_name="w")
  L = math.ceil(2000 / 5)
  C = math.ceil(0.5 * L)
  for grads, overflow in ((sparse, [0, 0, 0, 0]), (dense, [0, 0, 1, 0])):
    s1 = parallel.replicate_workers(plain.init(jnp.zeros(2000)), W)
    s2 = parallel.replicate_workers(capped.init(jnp.zeros(2000)), W)
    u1, s1 = _vmap_update(plain, grads, s1)
    u2, s2 = _vmap_update(capped, grads, s2)
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(s1.local.residual, s2.local.residual)
    np.testing.assert_array_equal(s2.local.metrics["zero_run_fallbacks"], overflow)
    np.testing.assert_array_equal(s2.local.metrics["zero_run_fallback_rounds"], [int(any(overflow))] * W)
    # encoded_bytes is the exact zero-run size in both modes.
    np.testing.assert_array_equal(s1.local.metrics["encoded_bytes"], s2.local.metrics["encoded_bytes"])
    wire = C + 8 + (L if any(overflow) else 0) + 1  # + 1 byte: the shared non-finite flag
    np.testing.assert_array_equal(s2.local.metrics["bytes_on_wire"], [wire] * W)
    assert int(s1.local.metrics["bytes_on_wire"][0]) == L + 4 + 1
  # Single worker, no axis: same accounting.
  tx = jaxcomp.threelc(capacity=0.5)
  out, st = jax.jit(tx.update)(jnp.sign(g[0]), tx.init(jnp.zeros(2000)))  # no zeros: no runs
  assert int(st.local.metrics["zero_run_fallbacks"]) == 1
  assert int(st.local.metrics["zero_run_fallback_rounds"]) == 1
  assert int(st.local.metrics["bytes_on_wire"]) == C + 8 + L


# -- int8 ---------------------------------------------------------------------------


def test_int8_levels_and_rounding():
  """255 levels in [-127, 127], -128 never produced, error <= scale/2, ties to even."""
  comp = jaxcomp.Int8()
  x = jnp.concatenate([jnp.array([-127.0, 127.0, 0.5, 1.5, -2.5, 126.5]),
                       jax.random.normal(jax.random.PRNGKey(0), (500,)) * 40])
  x = jnp.clip(x, -127, 127)
  encode, decode = jax.jit(comp.encode), jax.jit(comp.decode, static_argnums=1)  # one program each
  p = encode(x, None, None)
  assert p.codes.dtype == jnp.int8 and float(p.scale) == 1.0
  codes = np.asarray(p.codes)
  assert codes.min() == -127 and codes.max() == 127
  np.testing.assert_array_equal(codes[:6], [-127, 127, 0, 2, -2, 126])  # half to even
  out = np.asarray(decode(p, x.shape))
  assert np.abs(out - np.asarray(x)).max() <= 0.5
  # A general scale: error bounded by scale/2; never -128 even at -max.
  y = -jnp.abs(jax.random.normal(jax.random.PRNGKey(1), (1000,))) * 1e-3
  p = encode(y, None, None)
  assert int(np.asarray(p.codes).min()) == -127
  assert float(np.max(np.abs(np.asarray(decode(p, y.shape)) - np.asarray(y)))) <= float(p.scale) / 2 * (1 + 1e-5)


# -- stochastic ternary ---------------------------------------------------------------


def test_stochastic_ternary_is_terngrad_without_clipping_on_base243():
  """Same quantizer as TernGrad(clip_sigma=None) for the same key; base-3^5 wire; unbiased."""
  st = jaxcomp.StochasticTernary()
  tg = jaxcomp.TernGrad(clip_sigma=None, scalar_sharing=False)
  g = jax.random.normal(jax.random.PRNGKey(0), (257,)) * jnp.linspace(0.1, 2.0, 257)
  k = jax.random.PRNGKey(5)
  roundtrip = jax.jit(_roundtrip, static_argnums=0)  # one program per compressor, not eager ops
  np.testing.assert_array_equal(roundtrip(st, g, k), roundtrip(tg, g, k))
  p = jax.jit(lambda g, k: st.encode(g, k, st.agree(g)))(g, k)
  assert p.codes.dtype == jnp.uint8 and p.codes.shape == (math.ceil(257 / 5),)
  assert st.agree(g) is None and not st.error_feedback and st.unbiased
  K = 4000
  draws = np.asarray(jax.jit(jax.vmap(lambda kk: _roundtrip(st, g, kk)))(jax.random.split(k, K)))
  s = float(jnp.max(jnp.abs(g)))
  g = np.asarray(g)
  top = np.abs(g) == s
  std = np.sqrt(s * np.abs(g[~top]) - g[~top] ** 2)
  z = np.abs(draws.mean(0)[~top] - g[~top]) / (std / math.sqrt(K))
  assert z.max() < 5.0


def test_stochastic_ternary_scalar_sharing_option():
  W = 4
  xs = jax.random.normal(jax.random.PRNGKey(0), (W, 100)) * jnp.arange(1, W + 1)[:, None]
  tx = jaxcomp.stochastic_ternary(scalar_sharing=True, axis_name="w")
  upd, st = _vmap_update(tx, xs, parallel.replicate_workers(tx.init(jnp.zeros(100)), W))
  s = float(jnp.max(jnp.abs(xs)))
  levels = np.asarray(upd) / (s / W)
  np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)
  # Without sharing each worker has its own scale, and the wire has no agreement round.
  tx = jaxcomp.stochastic_ternary(axis_name="w")
  _, st2 = _vmap_update(tx, xs, parallel.replicate_workers(tx.init(jnp.zeros(100)), W))
  assert int(st.local.metrics["bytes_on_wire"][0]) == int(st2.local.metrics["bytes_on_wire"][0]) + 4


# -- signSGD / EF-SignSGD --------------------------------------------------------------


def test_signsgd_majority_vote_and_ties():
  """Update = sign(sum of votes); ties -> 0; sign(0) = +1; an all-zero worker abstains."""
  votes = jnp.array([
      [1.0, -1.0, 2.0, 0.0, -3.0, 0.0],
      [1.0, -1.0, -2.0, 0.0, 3.0, 0.0],
      [1.0, 1.0, -2.0, -0.5, -3.0, 0.0],
      [-1.0, 1.0, 2.0, -0.5, 3.0, 0.0],
  ])
  tx = jaxcomp.signsgd(axis_name="w")
  st = parallel.replicate_workers(tx.init({"a": jnp.zeros(6), "z": jnp.zeros(3)}), 4)
  grads = {"a": votes, "z": jnp.zeros((4, 3)).at[0].set(jnp.array([1.0, -1.0, 0.0]))}
  upd, st = _vmap_update(tx, grads, st)
  # col0: 3 vs 1 -> +1; col1: 2-2 tie -> 0; col2: tie -> 0; col3: zeros vote +1 twice, -1 twice -> 0;
  # col4: tie -> 0; col5: all zeros vote +1 -> +1.
  np.testing.assert_array_equal(upd["a"], [1, 0, 0, 0, 0, 1])
  # Tensor "z": only worker 0 is nonzero, the others abstain: its vote wins, sign(0) = +1.
  np.testing.assert_array_equal(upd["z"], [1, -1, 1])
  assert int(st.local.metrics["bytes_on_wire"][0]) == (1 + 1) + (1 + 1) + 2  # bits + flag per tensor, + nonfinite flags
  # One worker: sign(g).
  one = jaxcomp.signsgd()
  out, _ = jax.jit(one.update)(jnp.array([0.3, -2.0, 0.0, -0.0]), one.init(jnp.zeros(4)))
  np.testing.assert_array_equal(out, [1, -1, 1, 1])


def test_ef_signsgd_scale_and_wire():
  """Delta = (||p||_1 / d) sign(p), one bit per element plus one float32."""
  comp = jaxcomp.EFSignSGD()
  x = jnp.array([1.0, -3.0, 0.0, 2.0, -0.5])
  p = comp.encode(x, None, None)
  assert float(p.scale) == pytest.approx(6.5 / 5)
  np.testing.assert_allclose(comp.decode(p, x.shape), np.array([1, -1, 1, 1, -1]) * 1.3, rtol=1e-6)
  assert p.signs.dtype == jnp.uint8 and p.signs.shape == (1,)
  # The sign bits are the one shared packer.
  from jaxcomp.codecs import bits
  np.testing.assert_array_equal(p.signs, bits.pack_bits(x >= 0))
  np.testing.assert_array_equal(jaxcomp.SignSGD().encode(x, None, None).signs, p.signs)
