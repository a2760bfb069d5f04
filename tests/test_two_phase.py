"""The two-phase compressed all-reduce (jaxcomp.exchange.two_phase): layout, bytes, semantics, layouts."""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax._src.interpreters import partial_eval as pe  # dead-code elimination of a jaxpr (test_bytes_per_worker_target)
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel
from jaxcomp.exchange import two_phase as tp
from jaxcomp.compressors.blockint import BlockInt
from jaxcomp.compressors.int8 import Int8
from jaxcomp.compressors.powersgd import PowerSGD
from jaxcomp.compressors.qsgd import QSGD
from jaxcomp.compressors.signsgd import SignSGD
from jaxcomp.compressors.stochastic_ternary import StochasticTernary
from jaxcomp.compressors.terngrad import TernGrad
from jaxcomp.compressors.threelc import ThreeLC
from jaxcomp.exchange import transport
from jaxcomp.exchange import allgather
from jaxcomp.exchange import plan

from _layouts import run_layouts
from _processes import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))


def _run_vmap(comp, xs, keys, residual=None, need_own=True):
  """The exchange of every worker's row of ``xs`` under vmap; the mean comes back unbatched."""
  def f(x, k, r):
    res, traffic = transport.counted(tp.two_phase_steps(comp, x, k, "w", r, need_own=need_own), "w")
    return res.mean, res.own, res.shard_residual, traffic.encoded, res.metrics
  res_axes = None if residual is None else 0
  return jax.jit(jax.vmap(f, in_axes=(0, 0, res_axes), out_axes=(None, 0, 0, 0, 0), axis_name="w"))(xs, keys, residual)


def _reference(comp, xs, keys, residual):
  """The two phases computed with encode/decode only, no collective: chunk j of every worker goes to worker j."""
  n_workers, n = xs.shape
  lay = tp.split(comp, n, n_workers)
  c = lay.chunk
  chunks = jnp.pad(xs, ((0, 0), (0, lay.padded - n))).reshape(n_workers, n_workers, c)
  res = jnp.pad(residual, ((0, 0), (0, lay.padded - n))).reshape(n_workers, n_workers, c)
  shards, new_res = [], jnp.zeros_like(res)
  for j in range(n_workers):
    k1, k2 = jax.random.split(keys[j])
    decoded = [comp.decode(comp.encode(chunks[w, j], None, comp.agree(chunks[w, j])), (c,)) for w in range(n_workers)]
    y = sum(decoded) / n_workers + res[j, j]
    sent = comp.decode(comp.encode(y, k2, comp.agree(y)), (c,))
    new_res = new_res.at[j, j].set(y - sent)
    shards.append(sent)
  mean = jnp.concatenate(shards)[:n]
  return mean, new_res.reshape(n_workers, -1)[:, :n]


def test_layout_and_static_bytes():
  tern = TernGrad()
  assert tp.split(tern, 4 * 40 - 1, 4) is None  # fewer than N aligned blocks
  assert tp.split(tern, 1000, 1) is None  # one worker
  lay = tp.split(tern, 1000, 4)
  assert (lay.chunk, lay.padded) == (280, 1120)  # ceil(1000/4) = 250 -> a multiple of 40
  assert tp.split(QSGD(bucket_size=512), 4 << 20, 64).chunk % 512 == 0  # buckets never straddle chunks
  # TernGrad, 4 workers, chunks of 280: 70 code bytes + the 4-byte scale per chunk and per shard,
  # one agreed float32 per chunk (an all-reduce of 16 bytes: a ring receives 2*3/4 of it).
  # The plan reads them off the messages the transport counts (traced abstractly): here by hand.
  b = plan.traffic(tern, 1000, 4, "two_phase")
  assert b == plan.Bytes(sent=4 * 74 + 74 + 16, received=3 * (74 + 74) + 24)
  ag = plan.traffic(tern, 1000, 4, "all_gather")
  assert ag == plan.Bytes(sent=250 + 4 + 4, received=3 * 254 + 6)
  assert plan.choose(tern, 1000, 4, "auto") == "two_phase"
  assert plan.choose(tern, 1000, 2, "auto") == "all_gather"  # N = 2: two rounds save nothing
  assert plan.choose(tern, 100, 4, "two_phase") == "all_gather"  # too small to split
  assert transport.allreduce_received(1000, 8) == 1750


def test_refusals_are_clear():
  with pytest.raises(ValueError, match="PowerSGD runs its own exchange"):
    plan.check(PowerSGD(rank=2), "two_phase")
  assert plan.choose(PowerSGD(rank=2), 1 << 20, 8, "auto") == "all_gather"
  with pytest.raises(ValueError, match="exchange must be one of"):
    plan.check_exchange("ring")
  with pytest.raises(ValueError, match="too small to split"):
    jax.vmap(lambda x, k: tp.two_phase_exchange(TernGrad(), x, k, "w").mean, axis_name="w")(
        jnp.ones((4, 100)), jax.random.split(jax.random.PRNGKey(0), 4))


@pytest.mark.parametrize("comp", [ThreeLC(sparsity=1.5), Int8(), BlockInt(bits=4, block=40)],
                         ids=["threelc", "int8", "blockint4"])
def test_deterministic_matches_the_reference(comp):
  """The collectives route chunk j of every worker to worker j: same numbers as computed by hand."""
  n_workers, n = 4, 1001
  xs = jax.random.normal(jax.random.PRNGKey(0), (n_workers, n))
  r = jax.random.normal(jax.random.PRNGKey(1), (n_workers, n)) * 0.01
  keys = jax.random.split(jax.random.PRNGKey(2), n_workers)
  mean, own, new_r, enc, _ = jax.jit(functools.partial(_run_vmap, comp))(xs, keys, r)
  ref_mean, ref_r = _reference(comp, xs, keys, r)
  np.testing.assert_allclose(mean, ref_mean, atol=1e-6, rtol=0)
  np.testing.assert_allclose(new_r, ref_r, atol=1e-6, rtol=0)
  own_ref = jnp.stack([comp.decode(comp.encode(x, None, None), x.shape) for x in
                       jnp.pad(xs, ((0, 0), (0, 119))).reshape(n_workers, n_workers, 280).reshape(-1, 280)])
  np.testing.assert_allclose(own, own_ref.reshape(n_workers, -1)[:, :n], atol=1e-6, rtol=0)


def test_error_feedback_conservation_both_stages():
  """mean_w(sum of inputs) == sum of results + mean_w(phase-1 residual) + sum_w(shard residuals)."""
  comp, n_workers, n = ThreeLC(), 4, 777
  step = jax.jit(functools.partial(_run_vmap, comp))
  r1 = jnp.zeros((n_workers, n))
  r2 = jnp.zeros((n_workers, n))
  total_in, total_out = jnp.zeros(n), jnp.zeros(n)
  for t in range(20):
    g = jax.random.normal(jax.random.PRNGKey(t), (n_workers, n))
    x = g + r1  # the caller's error feedback
    mean, own, r2, _, _ = step(x, jax.random.split(jax.random.PRNGKey(100 + t), n_workers), r2)
    r1 = x - own
    total_in += g.mean(0)
    total_out += mean
  np.testing.assert_allclose(total_in, total_out + r1.mean(0) + r2.sum(0), atol=2e-5, rtol=0)
  # Not vacuous: both residuals are in use, each worker's shard residual only on its own shard.
  assert float(jnp.abs(r1).max()) > 0.1 and float(jnp.abs(r2).max()) > 0.01
  lay = tp.split(comp, n, n_workers)
  for w in range(n_workers):
    outside = jnp.concatenate([r2[w, :w * lay.chunk], r2[w, (w + 1) * lay.chunk:]])
    assert float(jnp.abs(outside).max()) == 0.0


def test_signsgd_vote_is_exact():
  """Phase 1 sums the votes exactly, phase 2 sends their sign: the all-gather's majority vote, ties (0) included."""
  n_workers, n = 4, 1003
  xs = jax.random.normal(jax.random.PRNGKey(0), (n_workers, n))
  xs = xs.at[3].set(0.0)  # worker 3 abstains (an all-zero tensor)
  keys = jax.random.split(jax.random.PRNGKey(1), n_workers)
  mean, *_ = _run_vmap(SignSGD(), xs, keys, need_own=False)
  gathered = jax.jit(jax.vmap(lambda x, k: allgather.exchange(SignSGD(), x, k, "w")[0], out_axes=None,
                              axis_name="w"))(xs, keys)
  np.testing.assert_array_equal(mean, gathered)
  np.testing.assert_array_equal(mean, jnp.sign(jnp.where(xs[:3] >= 0, 1.0, -1.0).sum(0)))
  # Four voters, so ties happen: they give 0, which one sign bit could not carry.
  xs4 = jax.random.normal(jax.random.PRNGKey(3), (n_workers, n))
  mean4, *_ = _run_vmap(SignSGD(), xs4, keys, need_own=False)
  np.testing.assert_array_equal(mean4, jnp.sign(jnp.where(xs4 >= 0, 1.0, -1.0).sum(0)))
  assert float(jnp.mean(mean4 == 0)) > 0.2


UNBIASED = {
    "terngrad_noclip": TernGrad(clip_sigma=None),
    "qsgd": QSGD(levels=3, bucket_size=64),
    "stochastic_ternary": StochasticTernary(),
}


@pytest.mark.parametrize("name", sorted(UNBIASED))
def test_unbiased_end_to_end(name):
  """E[result] = mean of the inputs: over T trials every element within 5 standard errors.

  With 400 elements and independent trials, an unbiased exchange exceeds 5
  standard errors anywhere with probability < 1e-3; a bias of a tenth of the
  per-trial spread would be 6 standard errors out at T = 4000.
  """
  comp, n_workers, n, trials = UNBIASED[name], 4, 400, 4000
  xs = jax.random.normal(jax.random.PRNGKey(0), (n_workers, n)) * jnp.linspace(0.1, 2.0, n)
  keys = jax.random.split(jax.random.PRNGKey(1), (trials, n_workers))
  one = lambda k: _run_vmap(comp, xs, k, need_own=False)[0]
  means = jax.jit(jax.vmap(one))(keys)
  avg, sd = means.mean(0), means.std(0)
  z = jnp.abs(avg - xs.mean(0)) / (sd / np.sqrt(trials) + 1e-12)
  assert float(z.max()) < 5.0, float(z.max())
  assert float(sd.min()) > 0  # the exchange is stochastic: the test is not vacuous


def _mesh(n):
  return jax.make_mesh((n,), ("d",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])


@pytest.mark.parametrize("comp", [TernGrad(), ThreeLC(capacity=0.5)], ids=["terngrad", "threelc_zero_run"])
def test_same_numbers_under_vmap_shard_map_and_both(comp):
  """vmap, shard_map over 8 devices, and vmap inside shard_map (3LC's dense inputs take the plain rounds)."""
  n_workers, n = 8, 37 * 11
  xs = jax.random.normal(jax.random.PRNGKey(0), (n_workers, 37, 11))
  keys = jax.random.split(jax.random.PRNGKey(1), n_workers)
  r = jax.random.normal(jax.random.PRNGKey(2), (n_workers, 37, 11)) * 0.01

  def worker(axis):
    def f(x, k, res):
      out = tp.two_phase_exchange(comp, x, k, axis, res, need_own=True)
      return out.mean, out.own, out.shard_residual
    return f

  ref = jax.jit(jax.vmap(worker("w"), out_axes=(None, 0, 0), axis_name="w"))(xs, keys, r)

  def per_device(x, k, res):  # one worker per device: drop the device's worker axis of 1, put it back
    mean, own, shard_res = worker("d")(x[0], k[0], res[0])
    return mean, own[None], shard_res[None]

  specs = dict(in_specs=P("d"), out_specs=(P(), P("d"), P("d")))
  sm = jax.jit(jax.shard_map(per_device, mesh=_mesh(n_workers), **specs))(xs, keys, r)
  inner = jax.vmap(worker(("d", "w")), out_axes=(None, 0, 0), axis_name="w")  # two workers per device
  smv = jax.jit(jax.shard_map(inner, mesh=_mesh(n_workers // 2), check_vma=False, **specs))(xs, keys, r)
  for name, got in (("shard_map", sm), ("shard_map+vmap", smv)):
    for a, b in zip(ref, got):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=0, err_msg=name)
  assert tp.split(comp, n, n_workers) is not None


@pytest.mark.slow
def test_two_processes_match_vmap(tmp_path):
  """jax.distributed on loopback, one CPU device per process: the numbers of vmap."""
  n_proc = 2
  outs = run_workers("two_phase_worker.py", n_proc, tmp_path)
  sys.path.insert(0, os.path.join(HERE, "multiprocess"))
  try:
    import two_phase_case as case  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  xs, keys, r = case.inputs(n_proc)
  for name, comp in case.COMPRESSORS.items():
    mean, own, res = jax.jit(jax.vmap(case.worker(comp, "w"), out_axes=(None, 0, 0), axis_name="w"))(xs, keys, r)
    for i in range(n_proc):
      np.testing.assert_allclose(outs[i][f"{name}_mean"], mean, atol=1e-6, rtol=0)
      np.testing.assert_allclose(outs[i][f"{name}_own"], own[i], atol=1e-6, rtol=0)
      np.testing.assert_allclose(outs[i][f"{name}_res"], res[i], atol=1e-6, rtol=0)
  # The transform, jaxcomp.threelc(exchange="two_phase"), over its steps.
  tx = case.transform("w")
  state = parallel.replicate_workers(tx.init(jax.tree.map(lambda a: a[0], case.transform_grads(n_proc, 0))), n_proc)
  step = jax.jit(_vmapped(tx, n_proc))
  for t in range(case.TRANSFORM_STEPS):
    upd, state = step(case.transform_grads(n_proc, t), state)
    for i in range(n_proc):
      np.testing.assert_allclose(outs[i][f"tx_update{t}"], upd["w"], atol=1e-6, rtol=0)
  for i in range(n_proc):
    np.testing.assert_allclose(outs[i]["tx_shard_residual"], state.shard.residual["w"][i], atol=1e-6, rtol=0)


def test_threelc_zero_run_wire_in_both_phases():
  """capacity=f: zero-run buffers in both phases, a plain round where a stream did not fit; same numbers."""
  n_workers, n = 4, 2000
  # Sparse inputs fit a buffer of half the base-3^5 size; dense ones do not.
  sparse = jax.random.normal(jax.random.PRNGKey(0), (n_workers, n)) * (jnp.arange(n) % 50 == 0)
  dense = jax.random.normal(jax.random.PRNGKey(1), (n_workers, n))
  keys = jax.random.split(jax.random.PRNGKey(2), n_workers)
  r = jnp.zeros((n_workers, n))
  plain, buffered = ThreeLC(), ThreeLC(capacity=0.5)
  static = plan.traffic(buffered, n, n_workers, "two_phase")
  plain_bytes = tp.split(plain, n, n_workers).chunk // 5 + 4  # one plain chunk or shard payload

  def runner(comp):
    def f(x, k, res):
      out, traffic = transport.counted(tp.two_phase_steps(comp, x, k, "w", res, need_own=True), "w")
      return out.mean, out.own, out.shard_residual, traffic.sent, traffic.received, out.metrics
    return jax.jit(jax.vmap(f, out_axes=(None, 0, 0, 0, 0, 0), axis_name="w"))

  run_plain, run_buffered = runner(plain), runner(buffered)
  for xs, rounds in ((sparse, 0), (dense, 2)):
    want, got = run_plain(xs, keys, r), run_buffered(xs, keys, r)
    for a, b in zip(want[:3], got[:3]):
      np.testing.assert_array_equal(a, b)
    m = got[5]
    assert (np.asarray(m["zero_run_fallback_rounds"]) == rounds).all()
    if rounds == 0:
      np.testing.assert_array_equal(m["zero_run_fallbacks"], 0)
      np.testing.assert_array_equal(got[3], static.sent)
      np.testing.assert_array_equal(got[4], static.received)
    else:
      assert (np.asarray(m["zero_run_fallbacks"]) > 0).all()
      # Both plain rounds on top: N chunk payloads and one shard payload handed, 2(N - 1) received.
      np.testing.assert_array_equal(got[3], static.sent + (n_workers + 1) * plain_bytes)
      np.testing.assert_array_equal(got[4], static.received + 2 * (n_workers - 1) * plain_bytes)


# -- the exchange= option of every compressor transform -------------------------------------

FACTORIES = {"terngrad": jaxcomp.terngrad, "qsgd": jaxcomp.qsgd, "threelc": jaxcomp.threelc}


def _vmapped(tx, n_workers):
  def step(grads, state):
    axes = parallel.worker_axes(state)
    return jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w")(grads, state)
  return step


BYTES = ("bytes_on_wire", "received_bytes", "two_phase_tensors")


def _abstract_metrics(tx, n, n_workers, keys=BYTES):
  """``keys`` of jaxcomp.metrics after one real traced update of N workers (vmap), evaluated without running it.

  The update is traced on abstract gradients (nothing is allocated); dead-code
  elimination keeps only what these metrics depend on, which must be constants
  of the trace (it fails if one needed the data), and evaluates that.
  """
  grads = jax.ShapeDtypeStruct((n_workers, n), jnp.float32)
  state = jax.eval_shape(lambda: parallel.replicate_workers(tx.init(jnp.zeros((n,))), n_workers))
  step = _vmapped(tx, n_workers)

  def metrics(g, s):
    m = jaxcomp.metrics(step(g, s)[1])
    return {k: m[k] for k in keys if k in m}

  closed, shapes = jax.make_jaxpr(metrics, return_shape=True)(grads, state)
  jaxpr, used = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
  assert not any(used), "a metric depends on the gradients"
  values = jax.core.eval_jaxpr(jaxpr, closed.consts)
  return jax.tree.unflatten(jax.tree.structure(shapes), values)


def test_exchange_option_is_checked():
  with pytest.raises(ValueError, match="PowerSGD runs its own exchange"):
    jaxcomp.powersgd(rank=2, exchange="two_phase")
  jaxcomp.powersgd(rank=2, exchange="auto")  # keeps its own exchange
  with pytest.raises(ValueError, match="exchange must be one of"):
    jaxcomp.terngrad(exchange="ring")


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_bytes_per_worker_target(name):
  """4M values, N = 4, 8, 64: received bytes per worker <= 1.1 x 2(N-1)/N·P, P the all-gather's bytes_on_wire."""
  n = 4 << 20
  comp = {"terngrad": TernGrad(), "qsgd": QSGD(), "threelc": ThreeLC()}[name]
  for n_workers in (4, 8, 64):
    m = {ex: _abstract_metrics(FACTORIES[name](axis_name="w", exchange=ex), n, n_workers)
         for ex in ("all_gather", "two_phase", "auto")}
    p = float(m["all_gather"]["bytes_on_wire"])
    bound = 1.1 * 2 * (n_workers - 1) / n_workers * p
    assert "received_bytes" not in m["all_gather"]  # reported by the routed transforms
    assert plan.traffic(comp, n, n_workers, "all_gather").received == pytest.approx((n_workers - 1) * p, rel=1e-5)
    assert float(m["two_phase"]["received_bytes"]) <= bound, (n_workers, float(m["two_phase"]["received_bytes"]), bound)
    assert float(m["two_phase"]["bytes_on_wire"]) <= bound  # bytes handed to collectives, too
    assert float(m["two_phase"]["two_phase_tensors"]) == 1
    assert float(m["auto"]["two_phase_tensors"]) == 1
    assert float(m["auto"]["received_bytes"]) == float(m["two_phase"]["received_bytes"])
    # The metrics are the plan's sizes (the same messages, counted alike).
    flag = n_workers - 1  # the non-finite flag's byte rides the shards' gather
    assert float(m["two_phase"]["received_bytes"]) == plan.traffic(comp, n, n_workers, "two_phase").received + flag


def _grads(n_workers, step):
  """Gaussian gradients drawn by numpy: no random-number program to compile for each shape."""
  rng = np.random.default_rng(100 + step)
  normal = lambda *shape: rng.standard_normal((n_workers,) + shape, np.float32)
  return {"fc": normal(37, 11), "conv": normal(3, 3, 8, 8),
          "bias": normal(11) * np.float32(0.1)}  # too small to split: the all-gather


def test_transform_same_numbers_in_every_layout():
  """exchange="auto" through jaxcomp.compress: vmap, pmap, shard_map and shard_map+vmap agree.

  3LC with its zero-run wire: both residuals in the state, the plain rounds'
  conditional collectives (dense gradients overflow the buffers).
  """
  n_workers = 8
  make_tx = lambda axis: jaxcomp.threelc(axis_name=axis, exchange="auto", capacity=0.5, tensor_metrics="fc|bias")
  params = jax.tree.map(lambda g: g[0], _grads(n_workers, 0))
  results = run_layouts(make_tx, params, lambda t: _grads(n_workers, t), n_workers)
  ref_outs, ref_metrics, _ = results["vmap"]
  for layout, (outs, m, _) in results.items():
    for a, b in zip(ref_outs, outs):
      jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, err_msg=layout), a, b)
    for k in ref_metrics:
      assert float(ref_metrics[k]) == float(m[k]), (layout, k)
  assert float(ref_metrics["two_phase_tensors"]) == 2  # fc and conv; the bias stays on the all-gather
  assert float(ref_metrics["two_phase:fc"]) == 1 and float(ref_metrics["two_phase:bias"]) == 0


def test_transform_matches_the_function():
  """The transform's update is two_phase_exchange's mean, with the transform's keys."""
  n_workers, tx = 4, jaxcomp.terngrad(axis_name="w", exchange="two_phase", seed=3)
  g = jax.random.normal(jax.random.PRNGKey(0), (n_workers, 1000))
  state = parallel.replicate_workers(tx.init(jnp.zeros(1000)), n_workers)
  upd, new_state = jax.jit(_vmapped(tx, n_workers))(g, state)
  step_key = jax.random.split(state.key)[1]
  want = jax.jit(jax.vmap(lambda x, w: tp.two_phase_exchange(
      TernGrad(), x, jaxcomp.rng.leaf_key(step_key, 0, w), "w").mean, out_axes=None, axis_name="w"))(
          g, jnp.arange(n_workers))
  np.testing.assert_array_equal(upd, want)
  m = jaxcomp.metrics(new_state)
  b = plan.traffic(TernGrad(), 1000, n_workers, "two_phase")
  assert int(m["bytes_on_wire"]) == b.sent + 1  # + the non-finite flag
  assert int(m["received_bytes"]) == b.received + n_workers - 1  # the flag rides the shards' gather
  assert int(m["two_phase_tensors"]) == 1


def test_transform_conservation_with_both_residuals():
  """3LC: mean_w(sum of gradients) == sum of updates + mean_w(residual) + sum_w(shard residual)."""
  n_workers, n = 4, 777
  tx = jaxcomp.threelc(axis_name="w", exchange="two_phase")
  state = parallel.replicate_workers(tx.init(jnp.zeros(n)), n_workers)
  step = jax.jit(_vmapped(tx, n_workers))
  total_in, total_out = jnp.zeros(n), jnp.zeros(n)
  for t in range(15):
    g = jax.random.normal(jax.random.PRNGKey(t), (n_workers, n))
    upd, state = step(g, state)
    total_in += g.mean(0)
    total_out += upd
  r1, r2 = state.local.residual, state.shard.residual
  np.testing.assert_allclose(total_in, total_out + r1.mean(0) + r2.sum(0), atol=2e-5, rtol=0)
  assert float(jnp.abs(r2).max()) > 0.01


def test_local_steps_takes_a_two_phase_transform():
  """local_steps' `exchange` names a compressor or takes a transform: a two-phase one works, the bare word is refused."""
  with pytest.raises(ValueError, match="exchange=jaxcomp.terngrad"):
    jaxcomp.local_steps(optax.sgd(0.1), k=2, axis_name="w", exchange="two_phase")
  n_workers = 4
  tx = jaxcomp.local_steps(optax.sgd(1.0), k=2, axis_name="w",
                           exchange=jaxcomp.terngrad(axis_name="w", exchange="two_phase"))
  state = parallel.replicate_workers(tx.init(jnp.zeros(1000)), n_workers)
  step = jax.jit(_vmapped(tx, n_workers))
  g = jax.random.normal(jax.random.PRNGKey(0), (2, n_workers, 1000))
  upd0, state = step(g[0], state)
  upd1, state = step(g[1], state)
  np.testing.assert_array_equal(upd0, 0.0)
  assert float(jnp.abs(upd1).max()) > 0
  assert int(jaxcomp.metrics(state)["two_phase_tensors"]) == 1


def test_powersgd_keeps_its_all_reduces():
  """PowerSGD with "auto": its own exchange, whose bytes received are a ring all-reduce's."""
  tx = jaxcomp.powersgd(rank=2, axis_name="w", exchange="auto", nonfinite="zero")
  m = _abstract_metrics(tx, 64 * 32, 8)
  assert "two_phase_tensors" in m and float(m["two_phase_tensors"]) == 0
  assert float(m["received_bytes"]) == transport.allreduce_received(int(m["bytes_on_wire"]), 8)


def test_counters_are_one_scalar_whatever_the_workers():
  """Phase 1's per-chunk counters (threshold's overflow) are summed: the state's shape does not depend on N."""
  for n_workers in (2, 4):
    tx = jaxcomp.threshold(0.01, axis_name="w", exchange="two_phase")
    state = parallel.replicate_workers(tx.init(jnp.zeros(1000)), n_workers)
    g = jax.random.normal(jax.random.PRNGKey(0), (n_workers, 1000))
    _, state = jax.jit(_vmapped(tx, n_workers))(g, state)
    shapes = {k: np.shape(v.lo) for k, v in jaxcomp.core.worker_locals(state)[0].metrics.items() if not v.is_static}
    assert shapes["overflow"] == (n_workers,), shapes  # one scalar a worker
