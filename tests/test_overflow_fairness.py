"""Over capacity, no position has a standing advantage (threshold, adaptive, top-k and so DGC).

When more entries are selected than the fixed slots hold, the sent ones are a
window of consecutive selected entries starting at a rank drawn from the
encode key (:func:`jaxcomp.compressors._select.compact_words`), so at every
step each selected entry is sent with probability ``K / S`` (``K`` slots,
``S`` selected in its column). Over many steps with error feedback, a
position's sends therefore follow the number of steps it was selected (for
threshold quantization: the number of steps it exceeded ``τ``, each of which
Strom's uncapped rule would send), scaled by ``K / S`` at each step:
``sends_i − Σ_t sel_{i,t}·min(1, K / S_t)`` is a martingale, checked here
within 5 standard deviations at every position. Under the former policy (the
first selected in index order) the same checks fail, which is tested too.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp
from jaxcomp.codecs import sparse
from jaxcomp.compressors import _select
from jaxcomp.compressors.adaptive import Adaptive
from jaxcomp.compressors.threshold import Threshold
from jaxcomp.compressors.topk import TopK

pytestmark = pytest.mark.accelerator


def reference_window(mask, capacity, fill, key):
  """Per column: the selected rows of ranks ``r … r + capacity − 1`` (mod ``S``), in row order."""
  mask = np.asarray(mask)
  total = mask.sum(0)
  start = np.asarray(_select.start_ranks(key, jnp.asarray(total, jnp.int32)))
  rows = np.full((capacity, mask.shape[1]), fill, np.int64)
  for j in range(mask.shape[1]):
    sel = np.flatnonzero(mask[:, j])
    ranks = np.sort((start[j] + np.arange(capacity)) % sel.size) if sel.size > capacity else np.arange(sel.size)
    rows[:ranks.size, j] = sel[ranks]
  return rows


@pytest.mark.parametrize("shape,p,cap", [
    ((37, 5), 0.3, 4), ((100, 3), 0.9, 200), ((1, 1), 1.0, 1), ((64, 7), 0.0, 3),
    ((1000, 1), 0.05, 10), ((33, 4), 0.5, 33), ((700, 2), 0.5, 600), ((5000, 1), 0.3, 1000),
])
def test_compact_window_equals_reference(shape, p, cap):
  """With a key, the slots hold the window of ranks from the drawn start, in increasing row order."""
  mask = jnp.asarray(np.random.default_rng(sum(shape)).random(shape) < p)
  compact = jax.jit(_select.compact_rows, static_argnums=(1, 2))
  for seed in range(3):
    key = jax.random.PRNGKey(seed)
    b = compact(mask, cap, sparse.MAX_INDEX, key)
    want = reference_window(mask, cap, sparse.MAX_INDEX, key)
    np.testing.assert_array_equal(b.rows, want)
    total = np.asarray(mask).sum(0)
    np.testing.assert_array_equal(b.count, np.minimum(total, cap))
    assert int(b.overflow) == int(np.sum(np.maximum(total - cap, 0)))
    used = np.asarray(b.used)
    for j in range(shape[1]):  # the wire's order: strictly increasing rows, then empty slots
      assert np.all(np.diff(np.asarray(b.rows)[used[:, j], j]) > 0)


def test_start_rank_is_uniform_whatever_the_layout():
  """Each selected entry is sent with probability K/S, also right after a long unselected run.

  (A start drawn over the rows would send the entry after the gap whenever the
  start fell into the gap: here in more than half of the draws.)
  """
  mask = np.zeros((400, 1), bool)
  mask[300:340] = True  # 40 selected after a gap of 300 rows
  mask[390:] = True  # and 10 more
  draws, cap, total = 4000, 10, 50
  keys = jax.random.split(jax.random.PRNGKey(7), draws)
  slots = jax.jit(jax.vmap(lambda k: _select.compact_rows(jnp.asarray(mask), cap, sparse.MAX_INDEX, k)))(keys)
  sent = np.zeros(400, np.int64)
  np.add.at(sent, np.asarray(slots.rows)[np.asarray(slots.used)], 1)
  p = cap / total
  sd = np.sqrt(draws * p * (1 - p))
  assert np.all(sent[~mask[:, 0]] == 0)
  np.testing.assert_array_less(np.abs(sent[mask[:, 0]] - draws * p), 5 * sd)


def _run_threshold_transform(tau, g, capacity, steps):
  """Per-step sends (update != 0) of jaxcomp.threshold with its own error feedback, g fixed."""
  tx = jaxcomp.threshold(tau=tau, capacity=capacity)

  def step(state, _):
    out, state = tx.update(g, state)
    return state, out != 0

  return np.asarray(jax.jit(lambda s: jax.lax.scan(step, s, None, length=steps)[1])(tx.init(g)))


def test_threshold_every_entry_over_tau_is_sent_equally_often():
  """All 64 entries exceed τ by different known amounts at every step: each is sent ~T·K/n times.

  Every entry stays over τ at every step (each step adds more than the τ a
  send removes), so Strom's rule would send each of them T times; with K of n
  slots, each is sent about T·K/n times whatever its position or its excess.
  """
  n, k, steps, tau = 64, 16, 400, 0.01
  excess = jnp.linspace(0.1, 3.0, n) * tau  # known amounts over τ, growing with the index
  g = (tau + excess) * jnp.where(jnp.arange(n) % 3 == 0, -1.0, 1.0)
  sends = _run_threshold_transform(tau, g, k, steps).sum(0)
  assert sends.sum() == steps * k  # the slots are full at every step
  p = k / n
  sd = np.sqrt(steps * p * (1 - p))
  np.testing.assert_array_less(np.abs(sends - steps * p), 5 * sd)
  # No drift with the position (or with the excess, which grows with it).
  assert abs(sends[: n // 2].mean() - sends[n // 2:].mean()) < 5 * sd / np.sqrt(n / 4)


def _ef_loop(comp, g, steps, selected):
  """Error feedback around ``comp`` on a fixed ``g``: per step, (selected mask, sent mask).

  ``selected(x, key)`` is the compressor's selection before the capacity applies.
  """

  def step(r, key):
    x = g + r
    payload = comp.encode(x, key, None)
    out = comp.decode(payload, g.shape)
    return x - out, (selected(x, key), out != 0)

  keys = jax.random.split(jax.random.PRNGKey(11), steps)
  _, (sel, sent) = jax.jit(lambda r: jax.lax.scan(step, r, keys))(jnp.zeros_like(g))
  return np.asarray(sel), np.asarray(sent)


def _check_fair(sel, sent, slots):
  """Every position's sends equal Σ_t sel·min(1, K/S_t) within 5 sd + 1; returns the overflow share."""
  sel = sel.reshape(sel.shape[0], -1, sel.shape[-1] if sel.ndim == 3 else 1)
  sent = sent.reshape(sel.shape)
  assert not np.any(sent & ~sel)  # only selected entries are sent
  total = sel.sum(1, keepdims=True)  # S_t per column
  p = sel * np.minimum(1.0, slots / np.maximum(total, 1))
  expected = p.sum(0)
  sd = np.sqrt((p * (1 - p)).sum(0))
  np.testing.assert_array_less(np.abs(sent.sum(0) - expected), 5 * sd + 1)
  return float(np.mean(total > slots))


def _first_in_order(key, total):
  return jnp.zeros(total.shape, jnp.int32)


def _threshold_case():
  n, k, tau = 96, 8, 0.01
  # A stationary pattern: each entry brings 0.05τ … 1.5τ per step (some over τ
  # at every step, most only every few steps), a quarter of them negative.
  g = tau * jnp.linspace(0.05, 1.5, n) * jnp.where(jnp.arange(n) % 4 == 1, -1.0, 1.0)
  g = g[jax.random.permutation(jax.random.PRNGKey(3), n)]
  comp = Threshold(tau=tau, capacity=k)
  return comp, g, k, lambda x, key: jnp.abs(x) > tau


def _adaptive_case():
  rows, cols, k = 128, 3, 4
  g = jax.random.normal(jax.random.PRNGKey(5), (rows, cols)) * jnp.array([0.5, 1.0, 2.0])
  # π = 1/8 from a sample of 16 rows: about 16 selected per column, for 4 slots.
  comp = Adaptive(proportion=1 / 8, sample=16, capacity=k)

  def selected(x, key):
    tp, tn = comp.thresholds(x, key)
    return jnp.logical_or(jnp.logical_and(x >= tp, x > 0), jnp.logical_and(x <= tn, x < 0))

  return comp, g, k, selected


def _topk_case(wire):
  def case():
    n, k = 96, 4
    g = jax.random.normal(jax.random.PRNGKey(4), (n,)) * jnp.linspace(0.5, 1.5, n)
    # 25% from a sample of 16: about 24 selected for 4 slots.
    comp = TopK(fraction=0.25, wire=wire, sample=16, capacity=k)

    def selected(x, key):
      return jnp.logical_and(jnp.abs(x) >= comp.threshold(x.reshape(-1), key), x != 0)

    return comp, g, k, selected

  return case


CASES = [_threshold_case, _adaptive_case, _topk_case("bitmap"), _topk_case("index")]
CASE_IDS = ["threshold", "adaptive", "topk_bitmap", "topk_index"]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_sends_follow_selected_steps_under_error_feedback(case):
  """Over 400 steps: each position's sends ≈ Σ_t (selected at t)·min(1, K/S_t), at every position."""
  comp, g, k, selected = case()
  sel, sent = _ef_loop(comp, g, 400, selected)
  overflowing = _check_fair(sel, sent, k)
  assert overflowing > 0.5  # the capacity binds at most steps: the policy is what is tested
  assert np.mean(sel.sum(0) > 0) > 0.95  # (nearly) every position competes


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_first_in_index_order_fails_the_check(case, monkeypatch):
  """The check can fail: with the start fixed at rank 0 (the former policy) it does."""
  monkeypatch.setattr(_select, "start_ranks", _first_in_order)
  comp, g, k, selected = case()
  sel, sent = _ef_loop(comp, g, 400, selected)
  with pytest.raises(AssertionError):
    _check_fair(sel, sent, k)


@pytest.mark.parametrize("comp", [Threshold(tau=0.5, capacity=0.25), Adaptive(0.25, sample=6, capacity=2)],
                         ids=["threshold", "adaptive"])
def test_deterministic_given_the_key_and_same_under_vmap(comp):
  x = jax.random.normal(jax.random.PRNGKey(2), (4, 24, 3))
  keys = jax.random.split(jax.random.PRNGKey(9), 4)
  encode = jax.jit(lambda x, k: comp.encode(x, k, None))
  one = [encode(x[i], keys[i]) for i in range(4)]
  batched = jax.jit(jax.vmap(lambda x, k: comp.encode(x, k, None)))(x, keys)
  for i in range(4):
    jax.tree.map(np.testing.assert_array_equal, one[i], jax.tree.map(lambda a: a[i], batched))
    jax.tree.map(np.testing.assert_array_equal, one[i], encode(x[i], keys[i]))
  # Different keys draw different windows (the capacity binds here).
  assert any(not np.array_equal(one[0].words, encode(x[0], k).words) for k in keys[1:])
