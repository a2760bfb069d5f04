"""The column-view compressors: 1-bit SGD, threshold and adaptive quantization, top-k.

Each works on a tensor's matrix view (jaxcomp.compressors._select). First the
shared requirements, for these and for PowerSGD and local steps (whose own
decisions are tested in tests/test_powersgd.py and tests/test_local_steps.py):
the same numbers under vmap, pmap, shard_map and shard_map+vmap;
error-feedback conservation; any float dtype and shape; zeros stay zeros; the
shared non-finite policy. Then each compressor's own decisions (see its module
docstring).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel
from jaxcomp.codecs import bits
from jaxcomp.compressors import _select
from jaxcomp.codecs import sparse
from jaxcomp.compressors.adaptive import Adaptive
from jaxcomp.compressors.onebit import OneBit
from jaxcomp.compressors.threshold import Threshold
from jaxcomp.compressors.topk import TopK

from _layouts import init_state, make_runners
from _layouts import vmap_update as _vmap_update

N = 8
KEY = jax.random.PRNGKey(0)


@functools.partial(jax.jit, static_argnums=0)
def _code(comp, x, key=KEY):
  """(payload, encoder metrics, decoded) of one tensor, jitted (compressors are hashable)."""
  payload, metrics = comp.encode_with_metrics(x, key, None)
  return payload, metrics, comp.decode(payload, x.shape)


def _grads(step, n=N):
  k1, k2 = jax.random.split(jax.random.PRNGKey(100 + step))
  # Columns of different scales, so that per-column statistics matter.
  scale = jnp.linspace(0.2, 3.0, 4)
  return {"conv": jax.random.normal(k1, (n, 3, 3, 2, 4)) * scale, "bias": jax.random.normal(k2, (n, 6)) * 0.1}


# Every compressor of this file, as make_tx(axis_name) -> optax transform.
FACTORIES = {
    "onebit_sampled": lambda a: jaxcomp.onebit(sample=5, axis_name=a),
    "topk_bitmap": lambda a: jaxcomp.topk(0.2, sample=12, axis_name=a),
    "topk_index": lambda a: jaxcomp.topk(0.2, "index", sample=None, axis_name=a),
    "powersgd": lambda a: jaxcomp.powersgd(rank=2, axis_name=a),
    "threshold": lambda a: jaxcomp.threshold(tau=0.5, capacity=0.25, axis_name=a),
    "adaptive_sampled": lambda a: jaxcomp.adaptive(0.1, sample=6, axis_name=a),
    "local_steps": lambda a: jaxcomp.local_steps(
        optax.sgd(0.1, momentum=0.9), k=2, axis_name=a, exchange="topk", fraction=0.2, wire="index", sample=None
    ),
}
# The optax transforms that feed residuals (error feedback) through jaxcomp.compress.
EF_FACTORIES = {k: v for k, v in FACTORIES.items() if k != "local_steps"}


# -- shared requirements -------------------------------------------------------


# topk_index is covered by local_steps' exchange (the index wire's own aggregate).
@pytest.mark.parametrize("name", sorted(set(FACTORIES) - {"topk_index"}))
def test_layouts_agree(name):
  """vmap, pmap, shard_map and shard_map+vmap give the same updates and metrics."""
  assert len(jax.devices()) >= N
  make_tx = FACTORIES[name]
  params = jax.tree.map(lambda g: g[0], _grads(0))
  results = {}
  for layout, run in make_runners(make_tx, N).items():
    # Host copies between steps: a device-sharded state would be a new input
    # signature for jit/pmap and compile every layout twice.
    state = jax.device_get(init_state(make_tx, params, N))
    outs = []
    for step in range(2):
      upd, state = run(_grads(step), state)
      state = jax.device_get(state)
      outs.append(upd)
    results[layout] = (outs, jaxcomp.metrics(state))
  assert set(results) == {"vmap", "pmap", "shard_map", "shard_map+vmap"}
  ref_outs, ref_metrics = results["vmap"]
  # PowerSGD's float all-reduces may sum in another order on devices.
  atol = 2e-6 if name == "powersgd" else 1e-7
  for layout, (outs, m) in results.items():
    for a, b in zip(ref_outs, outs):
      jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=0, err_msg=layout), a, b)
    assert {k: float(v) for k, v in m.items()} == {k: float(v) for k, v in ref_metrics.items()}, layout
  # Not vacuous: the update moved, and something crossed the wire.
  assert any(float(jnp.max(jnp.abs(u))) > 0 for u in jax.tree.leaves(ref_outs))
  assert float(ref_metrics["bytes_on_wire"]) > 0


@pytest.mark.parametrize("name", sorted(EF_FACTORIES))
def test_error_feedback_conservation(name):
  """Per worker: sum of own decodes + final residual == sum of inputs; the update is their mean."""
  W, T = 4, 6
  tx = EF_FACTORIES[name]("w")
  params = jax.tree.map(lambda g: g[0], _grads(0, W))
  state = parallel.replicate_workers(tx.init(params), W)
  step = jax.jit(lambda g, s: _vmap_update(tx, g, s))
  total_in = jax.tree.map(jnp.zeros_like, _grads(0, W))
  total_upd = jax.tree.map(jnp.zeros_like, params)
  for t in range(T):
    g = _grads(t, W)
    upd, state = step(g, state)
    total_in = jax.tree.map(jnp.add, total_in, g)
    total_upd = jax.tree.map(jnp.add, total_upd, upd)
  res = state.local.residual
  for k in ("conv", "bias"):
    if isinstance(res[k], optax.MaskedNode):
      continue
    np.testing.assert_allclose(total_upd[k], (total_in[k] - res[k]).mean(0), atol=3e-5, err_msg=k)
  assert float(jnp.max(jnp.abs(res["conv"]))) > 0  # lossy, so the residual is not trivially zero


@pytest.mark.parametrize("name", sorted(EF_FACTORIES))
def test_dtypes_shapes_zeros(name):
  """Any float dtype, scalars, size 0, all-zero input (zeros out, no NaN), under jit."""
  tx = EF_FACTORIES[name](None)
  params = {
      "zero": jnp.zeros((7, 3)),
      "scalar": jnp.array(0.0),
      "empty": jnp.zeros((0, 4)),
      "bf16": jnp.zeros((4, 9), jnp.bfloat16),
      "f16": jnp.zeros((5, 5), jnp.float16),
  }
  grads = dict(
      params,
      scalar=jnp.array(-3.0),
      bf16=jnp.linspace(-1, 1, 36, dtype=jnp.bfloat16).reshape(4, 9),
      f16=jnp.linspace(-2, 1, 25, dtype=jnp.float16).reshape(5, 5),
  )
  update = jax.jit(tx.update)
  state = tx.init(params)
  for _ in range(2):
    out, state = update(grads, state)
    for k in grads:
      assert out[k].dtype == grads[k].dtype and out[k].shape == grads[k].shape, k
      assert np.all(np.isfinite(np.asarray(out[k], np.float32))), k
    assert np.all(np.asarray(out["zero"]) == 0)
    assert np.all(np.isfinite(np.asarray(state.local.residual["zero"]))) if not isinstance(
        state.local.residual["zero"], optax.MaskedNode) else True
  # A non-zero low-precision tensor does come through (over two steps, with error feedback).
  assert float(jnp.max(jnp.abs(out["bf16"].astype(jnp.float32)))) > 0


@pytest.mark.parametrize("name", sorted(EF_FACTORIES))
@pytest.mark.parametrize("policy", ["propagate", "zero"])
def test_nonfinite_policy(name, policy):
  W = 2
  tx = EF_FACTORIES[name]("w") if policy == "propagate" else _with_kwargs(name, nonfinite="zero")
  params = {"x": jnp.zeros((6, 4))}
  state = parallel.replicate_workers(tx.init(params), W)
  g = jax.random.normal(KEY, (W, 6, 4))
  g = {"x": g.at[1, 2, 3].set(jnp.nan)}
  upd, st = _vmap_update(tx, g, state)
  if policy == "propagate":
    assert np.all(np.isnan(upd["x"]))
  else:
    assert np.all(np.isfinite(upd["x"])) and float(jnp.max(jnp.abs(upd["x"]))) > 0
  assert np.all(np.isfinite(st.local.residual["x"]))
  np.testing.assert_array_equal(st.local.residual["x"][1], 0.0)  # the bad worker's residual is untouched
  assert float(jaxcomp.metrics(st)["nonfinite_tensors"]) == 1  # a sum over workers


def _with_kwargs(name, **kw):
  base = {
      "onebit_sampled": lambda: jaxcomp.onebit(sample=5, axis_name="w", **kw),
      "topk_bitmap": lambda: jaxcomp.topk(0.2, sample=12, axis_name="w", **kw),
      "topk_index": lambda: jaxcomp.topk(0.2, "index", sample=None, axis_name="w", **kw),
      "powersgd": lambda: jaxcomp.powersgd(rank=2, axis_name="w", **kw),
      "threshold": lambda: jaxcomp.threshold(tau=0.5, capacity=0.25, axis_name="w", **kw),
      "adaptive_sampled": lambda: jaxcomp.adaptive(0.1, sample=6, axis_name="w", **kw),
  }
  return base[name]()


def test_registered():
  for name in ("onebit", "topk", "powersgd", "threshold", "adaptive"):
    assert name in jaxcomp.REGISTRY
    jaxcomp.get_transform(name, axis_name="w")
  assert "local_steps" in jaxcomp.compressors.WRAPPERS and "local_steps" in jaxcomp.names()
  with pytest.raises(ValueError, match="make_optimizer"):
    jaxcomp.get_transform("local_steps")


# -- column view ----------------------------------------------------------------


def test_column_view():
  assert _select.column_shape(()) == (1, 1)
  assert _select.column_shape((7,)) == (7, 1)
  assert _select.column_shape((30, 20)) == (30, 20)  # Dense (in, out): column j = x[:, j]
  assert _select.column_shape((5, 5, 3, 8)) == (75, 8)  # HWIO: (H*W*I, O)
  x = jnp.arange(5 * 5 * 3 * 8.0).reshape(5, 5, 3, 8)
  np.testing.assert_array_equal(_select.as_columns(x)[:, 2], x[..., 2].reshape(-1))


def test_compact_first_in_row_order():
  mask = jnp.array([[1, 0], [1, 1], [0, 1], [1, 1], [1, 0]], bool)
  c = jax.jit(_select.compact_rows, static_argnums=(1, 2))(mask, 2, -1)
  np.testing.assert_array_equal(c.rows, [[0, 1], [1, 2]])
  np.testing.assert_array_equal(c.count, [2, 2])
  assert int(c.overflow) == 3  # rows 3 and 4 of column 0, row 3 of column 1
  kept = np.zeros(mask.shape, bool)  # the entries the slots hold
  for j in range(mask.shape[1]):
    kept[np.asarray(c.rows)[np.asarray(c.used)[:, j], j], j] = True
  np.testing.assert_array_equal(kept, [[1, 0], [1, 1], [0, 1], [0, 0], [0, 0]])
  c = jax.jit(_select.compact_rows, static_argnums=(1, 2))(mask[:, :1] & False, 3, -1)
  np.testing.assert_array_equal(c.rows, [[-1], [-1], [-1]])
  assert int(c.overflow) == 0


# -- 1-bit SGD --------------------------------------------------------------------


def test_onebit_quantizer_per_column():
  """x >= 0 -> 1, x < 0 -> 0; reconstruction = the column's two class means."""
  x = jax.random.normal(KEY, (30, 20)) * jnp.linspace(0.1, 5, 20)
  x = x.at[0, 0].set(0.0)  # zero belongs to the non-negative class
  comp = OneBit()
  p, _, out = _code(comp, x)
  assert p.bits.dtype == jnp.uint8 and p.bits.shape == (75,)  # 600 bits
  assert p.means.dtype == jnp.float32 and p.means.shape == (2, 20)
  np.testing.assert_array_equal(bits.unpack_bits(p.bits, 600), np.asarray(x >= 0).reshape(-1))
  xn = np.asarray(x)
  for j in range(20):
    col = xn[:, j]
    np.testing.assert_allclose(p.means[0, j], col[col >= 0].mean(), rtol=1e-6)
    np.testing.assert_allclose(p.means[1, j], col[col < 0].mean(), rtol=1e-6)
  out = np.asarray(out)
  np.testing.assert_allclose(out, np.where(xn >= 0, p.means[0], p.means[1]), rtol=1e-6)
  # The class means minimise the squared error among two-level codes on these bits.
  err = np.sum((out - xn) ** 2)
  assert err < np.sum((np.where(xn >= 0, 1.05, 0.95) * out - xn) ** 2)


def test_onebit_negative_zero_is_in_the_negative_class():
  """The class is the sign bit: -0.0 gets bit 0 and counts towards the negative mean (documented)."""
  v = jnp.array([2.0, -0.0, -3.0, 0.0, 4.0])
  p, _, out = _code(OneBit(), v)
  np.testing.assert_array_equal(bits.unpack_bits(p.bits, 5), [1, 0, 0, 1, 1])
  np.testing.assert_allclose(p.means[:, 0], [2.0, -1.5], rtol=1e-6)  # (2+0+4)/3 and (-0-3)/2
  np.testing.assert_allclose(out, [2.0, -1.5, -1.5, 2.0, 2.0], rtol=1e-6)


def test_onebit_conv_and_vector_columns():
  """HWIO kernels: one column per output channel; a vector is a single column."""
  comp = OneBit()
  k = jax.random.normal(KEY, (3, 3, 2, 4)) * jnp.array([1.0, 10.0, 100.0, 1000.0])
  p = _code(comp, k)[0]
  assert p.means.shape == (2, 4)
  kn = np.asarray(k)
  np.testing.assert_allclose(p.means[0], [float(np.mean(kn[..., j][kn[..., j] >= 0])) for j in range(4)], rtol=1e-5)
  v = jnp.array([1.0, 3.0, -2.0, -4.0, 0.0])
  pv, _, outv = _code(comp, v)
  np.testing.assert_allclose(pv.means, [[4 / 3], [-3.0]], rtol=1e-6)
  np.testing.assert_allclose(outv, [4 / 3, 4 / 3, -3, -3, 4 / 3], rtol=1e-6)
  # Scalars and one-sided columns: the empty class has mean 0, the other is exact.
  np.testing.assert_allclose(_code(comp, jnp.array(-2.5))[2], -2.5)


def test_onebit_per_tensor_means():
  """per="tensor" (3LC's MQE 1-bit): one pair of class means for the whole tensor, on the same bits."""
  k = jax.random.normal(KEY, (3, 3, 2, 4)) * jnp.array([1.0, 10.0, 100.0, 1000.0])
  p, _, out = _code(OneBit(per="tensor"), k)
  assert p.means.shape == (2, 1)
  kn = np.asarray(k).reshape(-1)
  np.testing.assert_allclose(p.means[:, 0], [kn[kn >= 0].mean(), kn[kn < 0].mean()], rtol=1e-5)
  np.testing.assert_allclose(out, np.where(np.asarray(k) >= 0, p.means[0, 0], p.means[1, 0]), rtol=1e-6)
  np.testing.assert_array_equal(p.bits, _code(OneBit(), k)[0].bits)
  params = {"fc": jnp.zeros((800, 500))}
  tx = jaxcomp.onebit(axis_name="w", per="tensor")
  _, st = _vmap_update(tx, {"fc": jnp.ones((2, 800, 500))}, parallel.replicate_workers(tx.init(params), 2))
  assert float(jaxcomp.metrics(st)["bytes_on_wire"]) == 400000 // 8 + 8 + 1  # bits + one pair + flag
  with pytest.raises(ValueError, match="per must be one of"):
    OneBit(per="row")


def test_onebit_sampled_means():
  """sample=k: the means come from k sampled entries; k >= rows is exact; EF covers the rest."""
  x = jax.random.normal(KEY, (400, 3)) + jnp.array([0.0, 1.0, -1.0])
  exact = jax.jit(OneBit().encode)(x, KEY, None).means
  np.testing.assert_array_equal(jax.jit(OneBit(sample=400).encode)(x, KEY, None).means, exact)
  keys = jax.random.split(KEY, 200)
  draws = jax.jit(jax.vmap(lambda k: OneBit(sample=16).encode(x, k, None).means))(keys)
  assert not np.allclose(draws[0], exact)  # really sampled
  # The average of sampled means is close to the exact mean (the class count varies, so not exactly).
  np.testing.assert_allclose(draws.mean(0), exact, atol=0.08)
  # The bits are not sampled.
  np.testing.assert_array_equal(
      jax.jit(OneBit(sample=16).encode)(x, KEY, None).bits, jax.jit(OneBit().encode)(x, KEY, None).bits)
  with pytest.raises(ValueError, match="sample"):
    OneBit(sample=0)


def test_onebit_wire_bytes():
  params = {"fc": jnp.zeros((800, 500)), "conv": jnp.zeros((5, 5, 1, 20))}
  tx = jaxcomp.onebit(axis_name="w")
  state = parallel.replicate_workers(tx.init(params), 2)
  _, st = _vmap_update(tx, jax.tree.map(lambda p: jnp.ones((2,) + p.shape), params), state)
  m = jaxcomp.metrics(st)
  expected = 400000 // 8 + 8 * 500 + math.ceil(500 / 8) + 8 * 20 + 2  # bits + means + 2 flag bytes
  assert float(m["bytes_on_wire"]) == expected


# -- top-k ------------------------------------------------------------------------


def test_topk_exact_selects_largest_magnitudes():
  x = jax.random.normal(KEY, (40, 25))
  for wire in ("bitmap", "index"):
    comp = TopK(fraction=0.1, wire=wire, sample=None)
    p, m, out = _code(comp, x)
    out = np.asarray(out)
    k = 100
    top = np.argsort(-np.abs(np.asarray(x)).reshape(-1))[:k]
    expect = np.zeros(1000, np.float32)
    expect[top] = np.asarray(x).reshape(-1)[top]
    np.testing.assert_array_equal(out.reshape(-1), expect)
    assert int(m["overflow"]) == 0
  assert jax.jit(TopK(wire="bitmap").encode)(x, KEY, None).bitmap.dtype == jnp.uint8
  pi = jax.jit(TopK(fraction=0.1, wire="index").encode)(x, KEY, None)
  assert pi.indices.dtype == jnp.uint32 and pi.indices.shape == (100,) and pi.values.dtype == jnp.float32


def test_topk_sampled_threshold_and_overflow():
  """A threshold from 4096 sampled values lets through about k entries; extra ones overflow to the residual."""
  n = 100_000
  x = jax.random.normal(KEY, (n,))
  comp = TopK(fraction=0.05, sample=4096)
  threshold = jax.jit(comp.threshold)  # one program, not op by op per key
  counts, overflows = [], []
  for i in range(10):
    key = jax.random.PRNGKey(i)
    t = threshold(x, key)
    counts.append(int(np.sum(np.abs(np.asarray(x)) >= np.asarray(t))))
    overflows.append(int(_code(comp, x, key)[1]["overflow"]))
  counts = np.array(counts)
  assert np.all(np.abs(counts / 5000 - 1) < 0.2), counts  # sampling error ~7% per draw
  assert len(set(counts)) > 1  # really sampled
  np.testing.assert_array_equal(overflows, np.maximum(counts - 5000, 0))
  assert np.any(np.array(overflows) > 0)
  # Over capacity, 5000 consecutive selected entries (in index order, wrapping
  # around) are sent, from a start that varies with the key.
  starts = set()
  for i in np.flatnonzero(overflows):
    key = jax.random.PRNGKey(int(i))
    out = np.asarray(_code(comp, x, key)[2])
    sel = np.flatnonzero(np.abs(np.asarray(x)) >= float(threshold(x, key)))
    sent = np.isin(sel, np.flatnonzero(out))
    assert np.all(out[sel[sent]] == np.asarray(x)[sel[sent]]) and sent.sum() == 5000
    start = (int(np.flatnonzero(sent & ~np.roll(sent, 1))[0]) if not sent.all() else 0)
    np.testing.assert_array_equal(np.roll(sent, -start), np.arange(sel.size) < 5000)
    starts.add(start)
  assert len(starts) > 1


def test_topk_bitmap_layout_marks_exactly_the_sent_entries():
  """Entry i is bit i % 8 (LSB first) of byte i // 8, set iff entry i is sent; the pad bits are 0.

  Lengths around the 8- and 32-entry boundaries, with and without overflow
  (capacity 0.01 or 0.3 of a 5% or 50% selection: the selected entries
  outside the window are not marked, whether the window wraps or not).
  """
  wrapped = 0
  code = jax.jit(_code, static_argnums=0)  # one program per case: fewer dispatches than eager
  for n in (1, 7, 8, 9, 31, 32, 33, 100, 1000, 1003, 4099):
    x = jax.random.normal(jax.random.PRNGKey(n), (n,))
    cases = [(0.05, None, 1), (0.05, 0.01, 1)] + ([(0.5, 0.3, 3)] if n in (9, 33, 100, 1003) else [])
    for fraction, capacity, seeds in cases:
      for seed in range(seeds):
        key = jax.random.PRNGKey(seed)
        comp = TopK(fraction=fraction, sample=None, capacity=capacity)
        p, _, out = code(comp, x, key)
        sent = np.asarray(out) != 0
        assert p.bitmap.shape == (-(-n // 8),)
        np.testing.assert_array_equal(np.asarray(p.bitmap), np.packbits(sent, bitorder="little"))
        assert int(sent.sum()) == min(comp.k(n), comp.slots(n))
        # The k-th value lands on the k-th marked entry: a wrong bitmap puts values in wrong places.
        np.testing.assert_array_equal(np.asarray(out)[sent], np.asarray(x)[sent])
        # A wrapped window sends the first selected entry and skips one before the last.
        sel = np.flatnonzero(np.abs(np.asarray(x)) >= np.sort(np.abs(np.asarray(x)))[-comp.k(n)])
        wrapped += bool(sent[sel[0]] and sent[sel[-1]] and not sent[sel].all())
  assert wrapped > 3


def test_topk_wire_bytes_and_capacity():
  params = {"w": jnp.zeros((1000,))}
  for wire, expected in (("bitmap", 125 + 4 * 50), ("index", 8 * 50)):
    tx = jaxcomp.topk(0.05, wire)
    _, st = jax.jit(tx.update)({"w": jnp.linspace(-1, 1, 1000)}, tx.init(params))
    assert float(jaxcomp.metrics(st)["bytes_on_wire"]) == expected
  tx = jaxcomp.topk(0.05, capacity=0.1)
  _, st = jax.jit(tx.update)({"w": jnp.linspace(-1, 1, 1000)}, tx.init(params))
  assert float(jaxcomp.metrics(st)["bytes_on_wire"]) == 125 + 4 * 100
  with pytest.raises(ValueError, match="wire"):
    jaxcomp.topk(wire="csr")
  with pytest.raises(ValueError, match="fraction"):
    jaxcomp.topk(0.0)


# -- threshold quantization ----------------------------------------------------------


def test_threshold_quantizer_and_words():
  """|x| > tau -> +-tau as 32-bit words (sign bit, 31-bit index); |x| == tau is not sent."""
  x = jnp.array([0.3, -0.05, -0.2, 0.1, 0.0, 0.1000001, -0.1, 2.0])
  comp = Threshold(tau=0.1, capacity=8)
  p, m, out = _code(comp, x)
  assert p.words.dtype == jnp.uint32 and p.words.shape == (8,)
  sent = [(0, 1), (2, 0), (5, 1), (7, 1)]
  expect = [(b << 31) | i for i, b in sent] + [0xFFFFFFFF] * 4
  np.testing.assert_array_equal(np.asarray(p.words), np.array(expect, np.uint32))
  np.testing.assert_allclose(out, [0.1, 0, -0.1, 0, 0, 0.1, 0, 0.1])
  assert int(m["overflow"]) == 0
  assert int(comp.encoded_bytes(p, x.shape)) == 16
  idx, sg = sparse.sparse_words_decode(p.words[:4])  # the codec reads them
  np.testing.assert_array_equal(idx, [0, 2, 5, 7])
  np.testing.assert_array_equal(sg, [1, -1, 1, 1])


def test_threshold_capacity_overflow_stays_in_residual():
  """Over capacity, 3 of the 6 entries over tau are sent (see test_overflow_fairness.py); the rest stay in the residual."""
  tau = 0.5
  x = jnp.array([1.0, -2.0, 0.1, 3.0, -0.7, 0.6, 0.2, -5.0])
  tx = jaxcomp.threshold(tau=tau, capacity=3)
  out, st = jax.jit(tx.update)(x, tx.init(x))
  sent = np.flatnonzero(np.asarray(out))
  assert sent.size == 3 and np.isin(sent, [0, 1, 3, 4, 5, 7]).all()
  np.testing.assert_allclose(np.asarray(out)[sent], tau * np.sign(np.asarray(x)[sent]))
  np.testing.assert_allclose(st.local.residual, x - out)
  m = jaxcomp.metrics(st)
  assert float(m["overflow"]) == 3 and float(m["bytes_on_wire"]) == 12 and float(m["encoded_bytes"]) == 12
  assert float(m["compressed_ratio"]) == pytest.approx(32 / 12)


def test_threshold_rice_size_is_exact():
  """rice=True: encoded_bytes is the length of sparse_rice_encode's message (best k)."""
  x = jax.random.normal(KEY, (5000,))
  comp = Threshold(tau=2.0, capacity=0.05, rice=True)
  p = _code(comp, x)[0]
  idx, sg = sparse.sparse_words_decode(p.words)
  used = np.asarray(p.words) != 0xFFFFFFFF
  idx, sg = np.asarray(idx)[used], np.asarray(sg)[used]
  assert 50 < idx.size < 250
  best = min(sparse.sparse_rice_bits(idx, k) for k in range(31))
  assert best <= sparse.sparse_rice_bits(idx)
  msg = sparse.sparse_rice_encode(idx, sg, k=int(np.argmin([sparse.sparse_rice_bits(idx, k) for k in range(31)])))
  assert int(comp.encoded_bytes(p, x.shape)) == len(msg.data) == math.ceil(best / 8)
  back, back_sg = sparse.sparse_rice_decode(msg.data, 5000)
  np.testing.assert_array_equal(back, idx)
  np.testing.assert_array_equal(back_sg, sg)
  assert int(Threshold(tau=2.0, capacity=0.05).encoded_bytes(p, x.shape)) == 4 * idx.size
  with pytest.raises(ValueError, match="tau"):
    jaxcomp.threshold(tau=0.0)


# -- adaptive quantization ------------------------------------------------------------


def test_adaptive_proportion_and_means_per_column():
  """Each side of each column sends ceil(pi * k+-) entries; reconstruction = means of the sent."""
  R, C, pi = 256, 5, 1 / 64
  x = jax.random.normal(KEY, (R, C)) * jnp.arange(1, C + 1) + jnp.array([0.0, 0.5, -0.5, 0.0, 0.0])
  x = x.at[:, 4].set(jnp.abs(x[:, 4]))  # a column with no negative entry
  comp = Adaptive(proportion=pi, sample=None)
  p, m, out = _code(comp, x)
  assert comp.slots(R) == 5 and p.words.shape == (5, C) and p.means.shape == (2, C)
  assert int(m["overflow"]) == 0  # exact selection never overflows
  out = np.asarray(out)
  xn = np.asarray(x)
  for j in range(C):
    col = xn[:, j]
    pos, neg = np.sort(col[col >= 0])[::-1], np.sort(col[col < 0])
    t_pos, t_neg = math.ceil(pi * pos.size), math.ceil(pi * neg.size)
    sent_pos, sent_neg = pos[:t_pos], neg[:t_neg]
    assert np.sum(out[:, j] > 0) == t_pos and np.sum(out[:, j] < 0) == t_neg
    np.testing.assert_array_equal(np.sort(np.flatnonzero(out[:, j] > 0)), np.sort(np.flatnonzero(np.isin(col, sent_pos))))
    np.testing.assert_allclose(p.means[0, j], sent_pos.mean() if t_pos else 0.0, rtol=1e-6)
    np.testing.assert_allclose(p.means[1, j], sent_neg.mean() if t_neg else 0.0, rtol=1e-6)
  assert int(comp.encoded_bytes(p, x.shape)) == 12 * C + 4 * int(np.sum(out != 0))


def test_adaptive_small_columns_zeros_and_conv():
  comp = Adaptive()
  # A column shorter than 1/pi still sends its largest entry on each side.
  v = jnp.array([0.5, -0.25, 2.0, -3.0, 0.0])
  np.testing.assert_allclose(_code(comp, v)[2], [0, 0, 2.0, -3.0, 0])
  # Zeros count in k+ but are never sent.
  z = jnp.zeros((100, 3)).at[7, 1].set(1.0)
  np.testing.assert_array_equal(_code(comp, z)[2], z)
  # HWIO: per output channel.
  k = jax.random.normal(KEY, (3, 3, 8, 4))
  p = _code(comp, k)[0]
  assert p.words.shape == (comp.slots(72), 4)


def test_adaptive_sampled_thresholds_overflow_counted():
  R = 2048
  x = jax.random.normal(KEY, (R, 4))
  comp = Adaptive(proportion=1 / 16, sample=64)
  thresholds = jax.jit(comp.thresholds)
  sent, over = [], []
  for i in range(8):
    p, m, out = _code(comp, x, jax.random.PRNGKey(i))
    n_sent = int(np.sum(np.asarray(out) != 0))
    sent.append(n_sent)
    over.append(int(m["overflow"]))
    tp, tn = (np.asarray(t) for t in thresholds(x, jax.random.PRNGKey(i)))
    xn = np.asarray(x)
    selected = int(np.sum((xn >= tp) & (xn > 0)) + np.sum((xn <= tn) & (xn < 0)))
    assert selected == n_sent + over[-1]
  assert len(set(sent)) > 1  # really sampled
  assert 0.5 < np.mean(sent) / (4 * R / 16) < 1.5
  assert max(over) > 0  # sampling error does overflow the fixed slots sometimes
  assert all(s <= 4 * comp.slots(R) for s in sent)
