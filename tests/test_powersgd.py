"""PowerSGD: Algorithm 1 across workers, warm start, uncompressed vectors, fresh Q without warm start.

The shared requirements (layouts, error feedback, dtypes, non-finite policy)
are checked for PowerSGD with the other compressors in
tests/test_column_compressors.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp
from jaxcomp import parallel
from jaxcomp.compressors.powersgd import PowerSGD, orthogonalize
from jaxcomp.exchange import transport

from _layouts import vmap_update as _vmap_update

pytestmark = pytest.mark.accelerator

KEY = jax.random.PRNGKey(0)


def test_orthogonalize():
  p = jax.random.normal(KEY, (20, 3))
  q = orthogonalize(p)
  np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-5)
  z = orthogonalize(jnp.zeros((5, 2)))
  np.testing.assert_array_equal(z, 0.0)


def test_powersgd_algorithm1_across_workers():
  """P = mean(M_w) Q, orthogonalized; Q = mean(M_w)^T P; every worker decodes P Q^T; Q is kept."""
  W, n, m, r = 3, 12, 7, 2
  comp = PowerSGD(rank=r)
  ms = jax.random.normal(KEY, (W, n, m))
  q0 = comp.init_state((n, m), jax.random.PRNGKey(5))

  wire = []

  def worker(x):
    ex, traffic = transport.counted(comp.exchange(x, KEY, "w", q0), "w")
    wire.append(traffic.sent.static)
    return ex.mean, ex.own, ex.state, ex.payload

  mean, own, state, payload = jax.jit(jax.vmap(worker, axis_name="w", out_axes=(None, None, None, 0)))(ms)
  mbar = np.asarray(ms.mean(0))
  p = np.asarray(orthogonalize(jnp.asarray(mbar @ np.asarray(q0))))
  q = mbar.T @ p
  np.testing.assert_allclose(mean, p @ q.T, atol=1e-5)
  np.testing.assert_array_equal(own, mean)  # error feedback against the aggregate
  np.testing.assert_allclose(state, q, atol=1e-5)
  assert wire == [4 * r * (n + m)]
  assert payload.p.shape == (W, n, r) and payload.q.shape == (W, m, r)
  np.testing.assert_allclose(payload.p[1], np.asarray(ms[1]) @ np.asarray(q0), atol=1e-5)  # local, before the mean


def test_powersgd_warm_start_converges_to_best_rank_r():
  """Warm start = one power iteration per step: on a fixed matrix the approximation approaches the SVD's."""
  n, m, r = 30, 20, 2
  u, _ = jnp.linalg.qr(jax.random.normal(KEY, (n, n)))
  v, _ = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(1), (m, m)))
  s = jnp.array([10.0, 5.0] + [0.5] * 18)
  mat = (u[:, :m] * s) @ v.T
  best = (u[:, :r] * s[:r]) @ v[:, :r].T
  comp = PowerSGD(rank=r)
  q = comp.init_state((n, m), KEY)
  for _ in range(15):
    ex = transport.run(comp.exchange(mat, KEY, None, q), None)
    q = ex.state
  np.testing.assert_allclose(ex.mean, best, atol=1e-3)


def test_powersgd_vectors_uncompressed_and_zero_input():
  comp = PowerSGD(rank=2)
  assert comp.matrix((7,)) == (7, 1, 0) and comp.init_state((7,), KEY) is None
  assert comp.matrix((4, 3)) == (4, 3, 0)  # 2 * (4 + 3) >= 12: would not shrink
  assert comp.matrix((3, 3, 2, 4)) == (18, 4, 2)  # HWIO -> (H*W*I, O)
  tx = jaxcomp.powersgd(rank=2, axis_name="w")
  params = {"b": jnp.zeros(6), "w": jnp.zeros((10, 8))}
  state = parallel.replicate_workers(tx.init(params), 2)
  g = {"b": jax.random.normal(KEY, (2, 6)), "w": jnp.zeros((2, 10, 8))}
  upd, st = _vmap_update(tx, g, state)
  np.testing.assert_allclose(upd["b"], g["b"].mean(0), rtol=1e-6)  # float pmean, exact
  np.testing.assert_array_equal(st.local.residual["b"], 0.0)
  np.testing.assert_array_equal(upd["w"], 0.0)  # zeros in, zeros out, no NaN
  # The all-zero step did not freeze the warm start: Q is still the initial Gaussian.
  np.testing.assert_array_equal(st.inner["w"], state.inner["w"])
  g2 = {"b": g["b"], "w": jax.random.normal(KEY, (2, 10, 8))}
  upd2, _ = _vmap_update(tx, g2, st)
  assert float(jnp.max(jnp.abs(upd2["w"]))) > 0
  m = jaxcomp.metrics(st)
  assert float(m["bytes_on_wire"]) == 4 * 6 + 4 * 2 * (10 + 8) + 2


def test_powersgd_without_warm_start_draws_shared_fresh_q():
  tx = jaxcomp.powersgd(rank=1, warm_start=False, axis_name="w")
  params = {"w": jnp.zeros((10, 8))}
  state = parallel.replicate_workers(tx.init(params), 2)
  g = {"w": jax.random.normal(KEY, (2, 10, 8))}
  upd1, st = _vmap_update(tx, g, state)
  upd2, _ = _vmap_update(tx, g, st)
  assert not np.allclose(upd1["w"], upd2["w"])  # a different Q each step (residual aside)
