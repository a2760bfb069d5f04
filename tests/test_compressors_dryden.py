"""The fast paths of 1-bit SGD, threshold and adaptive quantization give the same messages.

* ``_select.compact_rows`` (bit-packed counts, a histogram's prefix sum)
  selects the same slots as a plain NumPy reference (:func:`reference_compact`);
* ``Adaptive.aggregate`` (one scatter of every worker's words) and
  ``OneBit.aggregate`` (decoded payloads added one after another) equal the
  mean of the workers' decodes;
* adaptive's ``capacity`` sets its word slots per column.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomp.codecs import sparse
from jaxcomp.compressors import _select
from jaxcomp.compressors.adaptive import Adaptive
from jaxcomp.compressors.onebit import OneBit
from jaxcomp.compressors.threshold import Threshold

pytestmark = pytest.mark.accelerator


def reference_compact(mask, capacity: int, fill: int):
  """Per column, the first ``capacity`` selected rows (``fill`` in empty slots), the counts and the overflow."""
  mask = np.asarray(mask)
  rows = np.full((capacity, mask.shape[1]), fill, np.int64)
  count = np.zeros(mask.shape[1], np.int64)
  for j in range(mask.shape[1]):
    kept = np.flatnonzero(mask[:, j])[:capacity]
    rows[:kept.size, j] = kept
    count[j] = kept.size
  return rows, count, int(mask.sum() - count.sum())


@pytest.mark.parametrize("shape,p,cap", [
    ((37, 5), 0.3, 4), ((100, 3), 0.9, 200), ((1, 1), 1.0, 1), ((64, 7), 0.0, 3),
    ((1000, 1), 0.05, 10), ((33, 4), 0.5, 33), ((700, 2), 0.5, 600), ((5000, 1), 0.3, 2000),
])
def test_compact_rows_equals_reference(shape, p, cap):
  mask = jnp.asarray(np.random.default_rng(sum(shape)).random(shape) < p)
  rows, count, overflow = reference_compact(mask, cap, sparse.MAX_INDEX)
  b = jax.jit(_select.compact_rows, static_argnums=(1, 2))(mask, cap, sparse.MAX_INDEX)
  np.testing.assert_array_equal(b.rows, rows)
  np.testing.assert_array_equal(b.count, count)
  np.testing.assert_array_equal(b.used, np.arange(cap)[:, None] < count)
  assert int(b.overflow) == overflow


@pytest.mark.parametrize("kmax", [_select.TOP_K_MAX, 64])  # lax.top_k, then radix selection
def test_kth_largest_matches_a_sort(kmax):
  """Per column, the t-th largest valid entry, exactly (negatives, ties, inf, -0.0, edge ranks)."""
  rng = np.random.default_rng(1)
  pool = rng.normal(size=(97, 6)).astype(np.float32) * np.array([1, 1e-30, 1e30, 1, 1, 1], np.float32)
  pool[:40, 3] = 0.5  # ties
  pool[5, 4], pool[6, 4], pool[7, 4] = np.inf, -np.inf, -0.0
  valid = rng.random((97, 6)) < 0.7
  valid[:, 5] = np.arange(97) < 20  # a column with fewer valid entries than some ranks
  kth_largest = jax.jit(_select.kth_largest, static_argnums=3)  # one program for every t
  for t in ([1, 2, 3, 4, 5, 6], [0, 10, 30, 20, 32, 1], [32, 32, 32, 32, 32, 32], [64, 50, 64, 40, 64, 21]):
    t = [min(r, kmax) for r in t]
    got = np.asarray(kth_largest(jnp.asarray(pool), jnp.asarray(valid), jnp.asarray(t, jnp.int32), kmax))
    for j in range(6):
      col = np.sort(pool[valid[:, j], j])[::-1]
      want = np.inf if t[j] == 0 else (col[t[j] - 1] if t[j] <= col.size else -np.inf)
      assert got[j] == want, (t[j], j)


def test_prefix_sum_rows_every_path():
  """Triangular products (<= 512 rows; blocks of 128 with one or two levels of block totals) under a total bound of 2**24; int32 scans without one."""
  rng = np.random.default_rng(0)
  prefix_sum_rows = jax.jit(_select.prefix_sum_rows, static_argnums=1)  # the bound picks the path
  for n, cols, high in ((1, 3, 33), (7, 3, 33), (512, 3, 33), (513, 3, 33), (3000, 3, 33), (70_001, 1, 200)):
    c = rng.integers(0, high, (n, cols)).astype(np.int32)
    for bound in (2**24, None):
      np.testing.assert_array_equal(prefix_sum_rows(jnp.asarray(c), bound), np.cumsum(c, axis=0))
  # A column total of exactly 2**24 stays exact in float32.
  c = np.full((70_001, 1), 2**24 // 70_001, np.int32)
  c[-1] += 2**24 - c.sum()
  np.testing.assert_array_equal(prefix_sum_rows(jnp.asarray(c), 2**24), np.cumsum(c, axis=0))
  # Totals past 2**24 (here ~1e9) take the int32 scan, exact; float32 would round them.
  c = rng.integers(0, 30_000, (70_001, 1)).astype(np.int32)
  np.testing.assert_array_equal(prefix_sum_rows(jnp.asarray(c), int(c.sum())), np.cumsum(c, axis=0))


@pytest.mark.parametrize("comp", [
    Adaptive(1 / 16), Adaptive(1 / 16, sample=8, capacity=1 / 4), OneBit(), OneBit(sample=5),
    Threshold(tau=0.5, capacity=0.25),
])
def test_aggregate_is_mean_of_decodes(comp):
  n, shape = 4, (40, 6)
  xs = jax.random.normal(jax.random.PRNGKey(0), (n,) + shape)
  keys = jax.random.split(jax.random.PRNGKey(1), n)
  payloads = jax.jit(jax.vmap(lambda x, k: comp.encode(x, k, None)))(xs, keys)
  decoded = jax.jit(jax.vmap(lambda p: comp.decode(p, shape)))(payloads)
  aggregate = jax.jit(comp.aggregate, static_argnums=1)(payloads, shape)
  np.testing.assert_allclose(aggregate, decoded.mean(0), rtol=1e-6, atol=1e-7)


def test_adaptive_capacity_sets_slots():
  assert Adaptive(1 / 64, sample=None).slots(4096) == 65  # exact: ceil(pi * rows) + 1
  assert Adaptive(1 / 64).slots(4096) == 129  # sampled (default 128): ceil(2 pi * rows) + 1
  assert Adaptive(1 / 64).slots(100) == 3  # a sample of 128 >= rows: exact
  assert Adaptive(1 / 64, capacity=1 / 32).slots(4096) == 128
  assert Adaptive(1 / 64, capacity=10).slots(4096) == 10
  assert Adaptive(1 / 64, capacity=1 / 32).slots(3) == 1
  x = jax.random.normal(jax.random.PRNGKey(2), (256, 3))
  p = jax.jit(Adaptive(1 / 64, sample=16, capacity=1 / 32).encode)(x, jax.random.PRNGKey(3), None)
  assert p.words.shape == (8, 3)
  with pytest.raises(ValueError):
    Adaptive(capacity=0.0)
