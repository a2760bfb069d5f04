"""DeMo (arXiv:2411.19870, Alg. 1): the chunked DCT against its definition and scipy, the top-k wire and
its exact bytes, the momentum subtraction as error feedback, the sign update, every layout."""

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel

from _layouts import run_layouts, vmap_update

demo_lib = importlib.import_module("jaxcomp.compressors.demo")  # the package exports the function

pytestmark = pytest.mark.accelerator

W = 3
SHAPES = {"w": (12, 20), "b": (20,), "s": ()}


def _dct_by_definition(x):
  """The 2-D orthonormal DCT-II of one chunk, summed term by term from the definition."""
  r, c = x.shape
  scale = lambda u, n: math.sqrt((1 if u else 0.5) * 2.0 / n)
  out = np.zeros((r, c))
  for u in range(r):
    for v in range(c):
      out[u, v] = scale(u, r) * scale(v, c) * sum(
          x[i, j] * math.cos(math.pi * (2 * i + 1) * u / (2 * r)) * math.cos(math.pi * (2 * j + 1) * v / (2 * c))
          for i in range(r) for j in range(c))
  return out


def test_dct_matrix_is_orthonormal_and_matches_the_definition():
  for n in (1, 2, 5, 8):
    d = demo_lib.dct_matrix(n)
    np.testing.assert_allclose(d @ d.T, np.eye(n), atol=1e-12)
  x = np.random.default_rng(0).standard_normal((6, 10))
  c = demo_lib.Chunks.of((6, 10), 5)  # chunks of 3 x 5: the largest divisors <= 5
  assert (c.cr, c.cc, c.count) == (3, 5, 4)
  got = np.asarray(demo_lib.dct(jnp.asarray(x, jnp.float32), c))
  for a in range(2):
    for b in range(2):
      want = _dct_by_definition(x[3 * a:3 * a + 3, 5 * b:5 * b + 5])
      np.testing.assert_allclose(got[2 * a + b].reshape(3, 5), want, atol=1e-5)


def test_dct_matches_scipy_and_inverts():
  fft = pytest.importorskip("scipy.fft")
  x = np.random.default_rng(1).standard_normal((8, 12)).astype(np.float32)
  c = demo_lib.Chunks.of((8, 12), 4)
  y = demo_lib.dct(jnp.asarray(x), c)
  blocks = x.reshape(2, 4, 3, 4).transpose(0, 2, 1, 3).reshape(6, 4, 4)
  want = np.stack([fft.dctn(b.astype(np.float64), norm="ortho") for b in blocks]).reshape(6, 16)
  np.testing.assert_allclose(np.asarray(y), want, atol=1e-5)
  np.testing.assert_allclose(np.asarray(demo_lib.idct(y, c, (8, 12))), x, atol=1e-5)


def test_chunks_of_every_shape():
  assert demo_lib.Chunks.of((768, 3072), 64)[2:] == (64, 64)
  assert demo_lib.Chunks.of((127,), 64) == demo_lib.Chunks(1, 127, 1, 1)  # a prime side: chunks of 1
  assert demo_lib.Chunks.of((4, 3, 5), 64) == demo_lib.Chunks(4, 15, 4, 15)  # (shape[0], rest)
  assert demo_lib.Chunks.of((), 64).count == 1 and demo_lib.Chunks.of((0,), 64).count == 0


def test_encode_keeps_the_largest_coefficients_and_decodes_them():
  comp = jaxcomp.DCTTopK(k=3, chunk=4)
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 8))
  p = comp.encode(x, None, None)
  assert p.values.shape == (4, 3) and p.indices.dtype == jnp.uint16
  c = demo_lib.Chunks.of((8, 8), 4)
  y = np.asarray(demo_lib.dct(x.reshape(-1), c))
  kept = np.zeros_like(y)
  for row, chunk in enumerate(y):
    top = np.argsort(-np.abs(chunk), kind="stable")[:3]
    kept[row, top] = chunk[top]
    np.testing.assert_array_equal(np.sort(np.asarray(p.indices[row])), np.sort(top))
  want = np.asarray(demo_lib.idct(jnp.asarray(kept), c, (8, 8)))
  np.testing.assert_allclose(np.asarray(comp.decode(p, (8, 8))), want, atol=1e-6)
  for shape in ((), (0,), (5,)):  # scalars, empty and zero tensors
    z = comp.decode(comp.encode(jnp.zeros(shape), None, None), shape)
    assert z.shape == shape and not np.asarray(z).any()


def _grads(t):
  keys = jax.random.split(jax.random.PRNGKey(t), len(SHAPES))
  return {k: jax.random.normal(key, (W,) + s) for key, (k, s) in zip(keys, SHAPES.items())}


def _params():
  return {k: jnp.zeros(s) for k, s in SHAPES.items()}


def test_momentum_loses_what_was_sent_and_the_bytes_are_the_messages():
  """Per worker, in the DCT domain: momentum after = β·momentum before + g, with the sent coefficients
  removed (exactly 0 where sent, unchanged elsewhere); bytes: chunks·k·(4 + 2) per tensor, and the
  non-finite flag byte each tensor's all-gather carries."""
  k, chunk, beta = 4, 4, 0.9
  tx = demo_lib.scale_by_demo(beta, k, chunk, axis_name="w")
  state = parallel.replicate_workers(tx.init(_params()), W)
  for t in range(3):
    before = state.exchange.local.residual
    _, state = vmap_update(tx, _grads(t), state)
    after = state.exchange.local.residual
    for name, shape in SHAPES.items():
      c = demo_lib.Chunks.of(shape, chunk)
      for i in range(W):
        full = np.asarray(demo_lib.dct((beta * before[name][i] + _grads(t)[name][i]).reshape(-1), c))
        left = np.asarray(demo_lib.dct(after[name][i].reshape(-1), c))
        sent = np.abs(left) < 1e-5 * (1 + np.abs(full))
        assert sent.sum() >= c.count * min(k, c.size)  # every chunk's k coefficients left the momentum
        np.testing.assert_allclose(left[~sent], full[~sent], rtol=1e-4, atol=1e-5)
  m = jaxcomp.metrics(state)
  coefficients = sum(demo_lib.Chunks.of(s, chunk).count * min(k, demo_lib.Chunks.of(s, chunk).size)
                     for s in SHAPES.values())
  assert int(m["bytes_on_wire"]) == coefficients * (4 + 2) + len(SHAPES)


def test_update_is_the_sign_of_the_mean_of_the_sent_components():
  k, chunk, lr = 2, 4, 0.01
  tx = jaxcomp.demo(lr, 0.5, k, chunk, axis_name="w")
  state = parallel.replicate_workers(tx.init(_params()), W)
  g = _grads(0)
  updates, _ = vmap_update(tx, g, state)
  plain = demo_lib.scale_by_demo(0.5, k, chunk, sign=False, axis_name="w")
  direction, _ = vmap_update(plain, g, parallel.replicate_workers(plain.init(_params()), W))
  comp = jaxcomp.DCTTopK(k=k, chunk=chunk)
  for name, shape in SHAPES.items():  # first step: momentum = g, so Q is the mean of the workers' q
    q = np.mean([np.asarray(comp.decode(comp.encode(g[name][i], None, None), shape)) for i in range(W)], axis=0)
    np.testing.assert_allclose(np.asarray(direction[name]), q, atol=1e-6)  # sign=False: Alg. 1's Q
    nonzero = np.abs(q) > 1e-6
    np.testing.assert_array_equal(np.asarray(updates[name])[nonzero], -lr * np.sign(q[nonzero]))


def test_every_layout_agrees():
  def make_tx(axis):
    return jaxcomp.demo(0.01, 0.9, 4, 4, axis_name=axis, sign=False)

  params = {"w": jnp.zeros((8, 12)), "b": jnp.zeros((12,))}
  grads = lambda t: {"w": jax.random.normal(jax.random.PRNGKey(t), (4, 8, 12)),
                     "b": jax.random.normal(jax.random.PRNGKey(9 + t), (4, 12))}
  results = run_layouts(make_tx, params, grads, 4, steps=3)
  ref_updates, ref_metrics, ref_state = results.pop("vmap")
  for layout, (updates, metrics, state) in results.items():
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, err_msg=layout), updates, ref_updates)
    assert metrics == ref_metrics, layout
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, err_msg=layout), state, ref_state)


def test_from_a_config_and_bad_arguments():
  tx = jaxcomp.make_optimizer("demo", optax.sgd(0.1), axis_name=None, k=2, chunk=4)
  params = {"w": jnp.ones((4, 4))}
  updates, _ = jax.jit(tx.update)({"w": jnp.ones((4, 4))}, tx.init(params), params)
  assert float(jnp.abs(updates["w"]).max()) <= 0.1 + 1e-7
  with pytest.raises(ValueError, match="demo is the optimizer"):
    jaxcomp.make_optimizer("demo", optax.adam(0.1)).init(params)
  with pytest.raises(ValueError, match="decay"):
    jaxcomp.demo(0.1, decay=1.0)
  with pytest.raises(ValueError, match="error_feedback"):
    jaxcomp.demo(0.1, error_feedback=False)
  with pytest.raises(ValueError, match="k must"):
    jaxcomp.DCTTopK(k=0)
