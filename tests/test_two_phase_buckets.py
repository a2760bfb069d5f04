"""A bucket through the two-phase exchange at once (jaxcomp.exchange.two_phase.bucket_steps), and "auto" per bucket."""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp
from jaxcomp.compressors.int8 import Int8
from jaxcomp.compressors.powersgd import PowerSGD
from jaxcomp.compressors.qsgd import QSGD
from jaxcomp.compressors.signsgd import SignSGD
from jaxcomp.compressors.stochastic_ternary import StochasticTernary
from jaxcomp.compressors.terngrad import TernGrad
from jaxcomp.compressors.threelc import ThreeLC
from jaxcomp.exchange import plan
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase as tp

import _golden as golden

WORKERS = 4
# Sizes with every kind of chunk: exact multiples of the alignment, padding in the last chunk, and
# one tensor (2900) whose last chunk is padding only up to a QSGD bucket.
SHAPES = [(3, 3, 16, 16), (2900,), (64, 40), (5000,)]
EXACT = [TernGrad(), ThreeLC(), StochasticTernary(), ThreeLC(sparsity=1.5)]
# XLA:CPU fuses the decode's multiply and the mean differently in a bucket (1 ulp, measured).
ROUNDED = [Int8(), QSGD()]


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  xs = [jnp.asarray(rng.normal(size=(WORKERS,) + s).astype(np.float32)) for s in SHAPES]
  rs = [jnp.asarray(0.01 * rng.normal(size=(WORKERS,) + s).astype(np.float32)) for s in SHAPES]
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), WORKERS * len(SHAPES)).reshape(WORKERS, len(SHAPES), 2)
  return xs, keys, rs


def _words(count):
  """A Count as its (hi, lo) uint32 words, the same on every worker here (exact)."""
  c = count.traced()
  return jnp.stack([c.hi, c.lo])


def _results(out):
  return [(o.mean, o.own, o.shard_residual) for o in out]


@functools.lru_cache(maxsize=None)
def _both(comp):
  """Each tensor's two-phase exchange alone, and the bucket's at once: (results, sent, received) each."""

  def alone(xs, keys, rs):
    out, traffic = [], transport.Traffic()
    for x, k, r in zip(xs, keys, rs):
      result, t = transport.counted(tp.two_phase_steps(comp, x, k, "w", r, need_own=True), "w")
      out.append(result)
      traffic += t
    return _results(out), _words(traffic.sent), _words(traffic.received)

  def together(xs, keys, rs):
    out, traffic = transport.counted(tp.bucket_steps(comp, xs, keys, "w", rs, need_own=True), "w")
    return _results(out), _words(traffic.sent), _words(traffic.received)

  xs, keys, rs = _inputs()
  run = lambda f: jax.device_get(jax.jit(jax.vmap(f, axis_name="w"))(xs, keys, rs))
  return run(alone), run(together)


@pytest.mark.parametrize("comp", EXACT + ROUNDED, ids=lambda c: type(c).__name__ + str(getattr(c, "sparsity", "")))
def test_a_bucket_gives_each_tensors_own_numbers_and_bytes(comp):
  assert tp.bucket_applies(comp)
  (want, want_sent, want_received), (got, got_sent, got_received) = _both(comp)
  for (m0, o0, r0), (m1, o1, r1) in zip(want, got):
    for a, b in ((m0, m1), (o0, o1), (r0, r1)):
      assert a.shape == b.shape
      if comp in EXACT:
        np.testing.assert_array_equal(a, b)
      else:
        np.testing.assert_array_max_ulp(a, b, maxulp=2)
  np.testing.assert_array_equal(got_sent, want_sent)  # every message's bytes, end to end
  # Received: a ring's share of each agreement is rounded up per message (one message here, 4 alone).
  to_int = lambda words: int(words[0, 0]) * 2**32 + int(words[0, 1])  # worker 0's (hi, lo)
  assert 0 <= to_int(want_received) - to_int(got_received) < len(SHAPES)
  assert to_int(got_received) > 0


def test_a_bucket_keeps_error_feedback_exact():
  """Over steps: inputs' mean == results + phase-1 residuals' mean + shard residuals (both phases kept)."""
  comp = ThreeLC()
  step = jax.jit(jax.vmap(
      lambda xs, keys, rs: _results(transport.run(tp.bucket_steps(comp, xs, keys, "w", rs, need_own=True), "w")),
      axis_name="w"))
  r1 = [jnp.zeros((WORKERS,) + s) for s in SHAPES]
  r2 = [jnp.zeros((WORKERS,) + s) for s in SHAPES]
  total_in = [jnp.zeros(s) for s in SHAPES]
  total_out = [jnp.zeros(s) for s in SHAPES]
  for t in range(8):
    gs, keys, _ = _inputs(10 + t)
    xs = [g + r for g, r in zip(gs, r1)]
    out = step(xs, keys, r2)
    r1 = [x - own for x, (_, own, _) in zip(xs, out)]
    r2 = [shard for _, _, shard in out]
    total_in = [a + g.mean(0) for a, g in zip(total_in, gs)]
    total_out = [a + mean[0] for a, (mean, _, _) in zip(total_out, out)]
  for i in range(len(SHAPES)):
    np.testing.assert_allclose(total_in[i], total_out[i] + r1[i].mean(0) + r2[i].sum(0), atol=2e-5, rtol=0)
    assert float(jnp.abs(r2[i]).max()) > 0.001  # not vacuous


def test_bucket_applies_only_where_a_bucket_encodes():
  assert not tp.bucket_applies(SignSGD())  # its own reduction and shard codec
  assert not tp.bucket_applies(ThreeLC(capacity=0.5))  # a fallback wire
  assert not tp.bucket_applies(PowerSGD(rank=2))
  with pytest.raises(ValueError, match="large enough to split"):
    jax.eval_shape(jax.vmap(lambda x, k: transport.run(tp.bucket_steps(TernGrad(), [x], k[None], "w"), "w"),
                            axis_name="w"), jax.ShapeDtypeStruct((WORKERS, 100), jnp.float32),
                   jax.ShapeDtypeStruct((WORKERS, 2), jnp.uint32))


def test_auto_chooses_per_bucket_by_the_plans_bytes():
  tern = TernGrad()
  sizes = [1000, 100, 50_000, 4000]
  # Two workers: two rounds save nothing, every bucket stays on the all-gather.
  assert plan.choose_buckets(tern, sizes, [[0, 1], [2, 3]], 2, "auto") == ["all_gather"] * 4
  # Four: the splittable tensors of a bucket go together; the one too small to split stays.
  assert plan.choose_buckets(tern, sizes, [[0, 1], [2, 3]], 4, "auto") == [
      "two_phase", "all_gather", "two_phase", "two_phase"]
  assert plan.choose_buckets(tern, sizes, [[0, 1], [2, 3]], 4, "all_gather") == ["all_gather"] * 4
  # A bucket of one is choose() on its tensor.
  for n in sizes:
    for workers in (2, 3, 8):
      assert plan.choose_buckets(tern, [n], [[0]], workers, "auto") == [plan.choose(tern, n, workers, "auto")]
  assert plan.choose_buckets(PowerSGD(rank=2), [1 << 20], [[0]], 8, "two_phase") == ["all_gather"]
  # The bytes it compares are the plan's, summed over the bucket.
  gathered = sum(plan.traffic(tern, n, 4, "all_gather").received for n in (50_000, 4000))
  phased = sum(plan.traffic(tern, n, 4, "two_phase").received for n in (50_000, 4000))
  assert phased < gathered


def test_the_plan_traces_inside_a_shard_map_step():
  """The transform chooses under shard_map; the plan's own abstract trace must not trip its axis typing."""
  mesh = golden.device_mesh()
  tx = golden.compressor_case("terngrad", "vmap")(("d",), exchange="auto")
  outs, state = golden.run_mesh(tx, mesh, ("d",), golden.WORKERS)
  want_outs, want_state = golden.run_vmap(golden.compressor_case("terngrad", "vmap_auto"))
  for got, want in zip(outs, want_outs):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_max_ulp(np.asarray(a), np.asarray(b), maxulp=2)
  routed = [np.asarray(v) for path, v in jax.tree_util.tree_flatten_with_path(state)[0]
            if "two_phase_tensors" in jax.tree_util.keystr(path)]
  assert len(routed) == 2 and int(routed[1].reshape(-1)[0]) > 0  # (hi, lo): the step did go two-phase
