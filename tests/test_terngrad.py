"""TernGrad (Wen et al., NeurIPS 2017, arXiv:1705.07878, §3): the quantizer, clipping, scalar sharing, wire."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp.compressors.terngrad import TernGrad, clip_by_sigma

pytestmark = pytest.mark.accelerator


def _roundtrip(comp, x, key):
  agreed = comp.agree(x)
  return comp.decode(comp.encode(x, key, agreed), x.shape)


@pytest.mark.parametrize("impl", ["hash", "threefry"])
def test_unbiased_without_clipping(impl):
  """Eq. 10: E[decode(encode(g))] = g. K draws with fixed keys; |mean - g| <= 5 std errors."""
  comp = TernGrad(clip_sigma=None, rng=impl)
  g = jax.random.normal(jax.random.PRNGKey(0), (257,)) * jnp.linspace(0.1, 2.0, 257)
  K = 4000
  keys = jax.random.split(jax.random.PRNGKey(1), K)
  draws = jax.jit(jax.vmap(lambda k: _roundtrip(comp, g, k)))(keys)
  mean = np.asarray(draws.mean(0))
  s = float(jnp.max(jnp.abs(g)))
  g = np.asarray(g)
  top = np.abs(g) == s  # sent as +-s with probability 1: no variance
  np.testing.assert_allclose(mean[top], g[top], rtol=1e-6)
  std = np.sqrt(s * np.abs(g[~top]) - g[~top] ** 2)
  z = np.abs(mean[~top] - g[~top]) / (std / math.sqrt(K))
  assert z.max() < 5.0, z.max()
  # The whole vector: the mean error's squared norm is near its expectation.
  assert abs(float(np.mean(z**2)) - 1.0) < 0.25


def test_values_are_ternary_per_leaf():
  """Layer-wise ternarizing (§3.3): each leaf has its own scalar s, values in {-s, 0, s}."""
  params = {"w": jnp.zeros((30, 20)), "b": jnp.zeros((20,))}
  grads = {
      "w": jax.random.normal(jax.random.PRNGKey(0), (30, 20)) * 3.0,
      "b": jax.random.normal(jax.random.PRNGKey(1), (20,)) * 0.01,
  }
  tx = jaxcomp.terngrad(clip_sigma=2.5)
  out, _ = jax.jit(tx.update)(grads, tx.init(params))
  for name in grads:
    g = grads[name]
    s = float(jnp.max(jnp.abs(clip_by_sigma(g.reshape(-1), 2.5))))
    vals = np.unique(np.asarray(out[name]))
    assert set(np.round(vals / s, 6)) <= {-1.0, 0.0, 1.0}, (name, vals, s)
  assert float(jnp.max(jnp.abs(out["b"]))) < 0.05  # the bias kept its own, small scalar


def test_clipping_on_gaussian_matches_section_3_3():
  """§3.3: c = 2.5 changes the length of g by 1.0%-1.5% and its direction by 2-3 degrees."""
  g = jax.random.normal(jax.random.PRNGKey(3), (1_000_000,))
  f = clip_by_sigma(g, 2.5)
  shrink = 1.0 - float(jnp.linalg.norm(f) / jnp.linalg.norm(g))
  angle = math.degrees(math.acos(float(jnp.dot(f, g) / (jnp.linalg.norm(f) * jnp.linalg.norm(g)))))
  assert 0.010 <= shrink <= 0.015, shrink
  assert 2.0 <= angle <= 3.0, angle
  # And clipping bounds the scalar: s = max|f(g)| = 2.5 sigma.
  assert float(jnp.max(jnp.abs(f))) == pytest.approx(2.5 * float(jnp.std(g)), rel=1e-5)


def test_scale_is_eq2_max_of_clipped():
  """Decision: s = max|f(g)| (Eq. 2), which is below c*sigma when nothing is clipped."""
  comp = TernGrad(clip_sigma=100.0)
  g = jnp.array([0.5, -0.25, 0.1, 0.0])
  assert float(comp.agree(g)) == pytest.approx(0.5)
  # The largest element has probability 1 of being sent: deterministic +-s.
  for k in range(20):
    out = _roundtrip(comp, g, jax.random.PRNGKey(k))
    assert float(out[0]) == pytest.approx(0.5)


def test_scalar_sharing_under_vmap():
  """Eq. 4: with N workers every decoded value is a multiple of s/N, s = max_i s_i."""
  N = 4
  comp = TernGrad(clip_sigma=None)
  xs = jax.random.normal(jax.random.PRNGKey(0), (N, 100)) * jnp.arange(1, N + 1)[:, None]
  tx = jaxcomp.compress(comp, axis_name="w")
  state = tx.init(jnp.zeros(100))
  mean, _ = jax.jit(jax.vmap(tx.update, in_axes=(0, None), out_axes=(None, jaxcomp.parallel.worker_axes(state)),
                             axis_name="w"))(xs, state)
  s = float(jnp.max(jnp.abs(xs)))
  levels = np.asarray(mean) / (s / N)
  np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)
  assert np.abs(np.round(levels)).max() <= N


def test_all_zero_scalar_and_dtypes():
  tx = jaxcomp.terngrad()
  params = {
      "zero": jnp.zeros((7, 3)),
      "scalar": jnp.array(2.0),
      "empty": jnp.zeros((0, 4)),
      "bf16": jnp.ones((33,), jnp.bfloat16),
      "f16": jnp.ones((5, 5), jnp.float16),
  }
  grads = dict(params, scalar=jnp.array(-3.0))
  out, state = jax.jit(tx.update)(grads, tx.init(params))
  assert np.all(np.asarray(out["zero"]) == 0)
  assert float(out["scalar"]) == -3.0  # one element: |g| = s, sent deterministically
  assert out["empty"].shape == (0, 4)
  for k in grads:
    assert out[k].dtype == grads[k].dtype and out[k].shape == grads[k].shape
    assert np.all(np.isfinite(np.asarray(out[k], np.float32)))
  # Decision (clip_by_sigma): sigma = 0 means no clipping, so constant tensors survive.
  np.testing.assert_array_equal(np.asarray(out["bf16"], np.float32), 1.0)
  np.testing.assert_array_equal(np.asarray(out["f16"], np.float32), 1.0)
  assert state.count == 1


def test_wire_is_packed_2bit():
  """The payload is uint8 codes, 4 per byte, plus one float32 scalar."""
  comp = TernGrad()
  x = jax.random.normal(jax.random.PRNGKey(0), (1001,))
  p = comp.encode(x, jax.random.PRNGKey(1), comp.agree(x))
  assert p.codes.dtype == jnp.uint8 and p.codes.shape == (251,)
  assert p.scale.dtype == jnp.float32 and p.scale.shape == ()


def test_bytes_on_wire_lenet_sized():
  """At most 1/15 of float32 over the compressed tensors (the foundation target)."""
  params = {"conv1": jnp.zeros((5, 5, 1, 20)), "fc1": jnp.zeros((800, 500)), "logits": jnp.zeros((500, 10))}
  tx = jaxcomp.terngrad(axis_name="w", skip=jaxcomp.skip_by_path(lambda p: "logits" in p))
  state = tx.init(params)
  grads = jax.tree.map(lambda p: jnp.ones((2,) + p.shape), params)
  _, st = jax.jit(jax.vmap(tx.update, in_axes=(0, None), out_axes=(None, jaxcomp.parallel.worker_axes(state)),
                           axis_name="w"))(grads, state)
  m = jaxcomp.metrics(st)
  n_c = 5 * 5 * 20 + 800 * 500
  assert float(m["compressed_float32_bytes"]) == 4 * n_c
  # ceil(n/4) code bytes + 4 (scale in payload) + 4 (pmax agreement) + 1 (non-finite flag) per tensor.
  expected = math.ceil(500 / 4) + math.ceil(400000 / 4) + 2 * 8 + 2
  assert float(m["compressed_bytes_on_wire"]) == expected
  assert float(m["compressed_bytes_on_wire"]) <= float(m["compressed_float32_bytes"]) / 15
  assert float(m["float_bytes"]) == 4 * 5000
  assert float(m["bytes_on_wire"]) == expected + 4 * 5000


def test_chain_with_sgd_and_bad_arguments():
  tx = optax.chain(jaxcomp.terngrad(), optax.sgd(0.1))
  params = {"w": jnp.ones((10,))}
  updates, _ = tx.update({"w": jnp.ones((10,))}, tx.init(params), params)
  assert updates["w"].shape == (10,)
  with pytest.raises(ValueError, match="clip_sigma"):
    jaxcomp.terngrad(clip_sigma=-1.0)
  with pytest.raises(ValueError, match="rng"):
    jaxcomp.terngrad(rng="mersenne")


@pytest.mark.parametrize("workers,n", [(1, 5), (3, 7), (8, 400), (130, 9), (1100, 9)])  # 1100: a scan, then the rest
def test_aggregate_sums_packed_codes_exactly(workers, n):
  """The mean sums the codes on the packed bytes; it equals decoding every worker and averaging."""
  comp = TernGrad(clip_sigma=None)
  xs = jax.random.normal(jax.random.PRNGKey(workers), (workers, n))
  s = jnp.max(jnp.abs(xs))
  keys = jax.random.split(jax.random.PRNGKey(1), workers)
  gathered = jax.jit(jax.vmap(lambda x, k: comp.encode(x, k, s)))(xs, keys)
  decode = jax.jit(comp.decode, static_argnums=1)  # one program for every worker, not eager ops
  t = np.stack([np.asarray(decode(jax.tree.map(lambda a: a[i], gathered), (n,))) / float(s)
                for i in range(workers)]).round().astype(np.int64)
  expected = (t.sum(0).astype(np.float32) * np.float32(s / workers)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(comp.aggregate(gathered, (n,))), expected)
