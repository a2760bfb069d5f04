"""Signum and Deep Gradient Compression: worker-local momentum in front of a compressed exchange.

Signum (Bernstein et al., ICML 2018 / ICLR 2019): beta=0 is signSGD exactly;
every worker has its own momentum, carried across steps; the vote is signSGD's.
DGC (Lin et al., ICLR 2018): density 1 without masking is momentum SGD on the
mean gradient; momentum factor masking zeroes u and v where sent; what was sent
plus the residual accounts for every velocity; the warm-up schedule's densities
at its stage boundaries, with exact bytes; local clipping at clip_norm/sqrt(N).
Both give the same numbers under vmap, pmap, shard_map and shard_map+vmap.
"""

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel
from jaxcomp.exchange import transport

dgc_module = importlib.import_module("jaxcomp.compressors.dgc")  # jaxcomp.compressors.dgc is the factory

from _layouts import run_layouts, vmap_update as _vmap_update

W = 4  # workers of the vmap tests


def _run(tx, grads_per_step, params):
  """Runs ``tx`` over W workers; returns (updates per step, states per step)."""
  state = parallel.replicate_workers(tx.init(params), W)
  updates, states = [], []
  for g in grads_per_step:
    upd, state = _vmap_update(tx, g, state)
    updates.append(upd)
    states.append(state)
  return updates, states


def _grads(step, shapes, workers=W):
  keys = jax.random.split(jax.random.PRNGKey(1000 + step), len(shapes))
  return {name: jax.random.normal(k, (workers,) + shape) for k, (name, shape) in zip(keys, shapes.items())}


def _bytes(state):
  return int(jaxcomp.metrics(state)["bytes_on_wire"])


# -- Signum -------------------------------------------------------------------------


SIGNUM_SHAPES = {"w": (37, 3), "b": (5,)}  # "b" stays in float (min_size=8)


def _majority(m):
  """signSGD's vote in numpy: bit x >= 0, an all-zero worker abstains, ties 0."""
  votes = np.where(m >= 0, 1, -1) * np.any(m != 0, axis=tuple(range(1, m.ndim)), keepdims=True)
  return np.sign(votes.sum(0)).astype(np.float32)


def test_signum_with_beta_0_is_signsgd():
  params = jax.tree.map(lambda g: g[0], _grads(0, SIGNUM_SHAPES))
  steps = [_grads(s, SIGNUM_SHAPES) for s in range(2)]
  ours, our_states = _run(jaxcomp.signum(0.0, axis_name="w", min_size=8), steps, params)
  ref, ref_states = _run(jaxcomp.signsgd(axis_name="w", min_size=8), steps, params)
  for a, b in zip(ours, ref):
    jax.tree.map(np.testing.assert_array_equal, a, b)
  assert _bytes(our_states[-1]) == _bytes(ref_states[-1])


def test_signum_momentum_is_per_worker_and_carried():
  beta = 0.9
  tx = jaxcomp.signum(beta, axis_name="w", min_size=8)
  params = jax.tree.map(lambda g: g[0], _grads(0, SIGNUM_SHAPES))
  steps = [_grads(s, SIGNUM_SHAPES) for s in range(3)]
  updates, states = _run(tx, steps, params)
  m = np.zeros((W,) + SIGNUM_SHAPES["w"], np.float32)
  differs_from_signsgd = False
  for g, upd, state in zip(steps, updates, states):
    m = beta * m + (1 - beta) * np.asarray(g["w"])
    momenta = np.asarray(state.local.residual["w"])
    np.testing.assert_allclose(momenta, m, rtol=1e-6, atol=1e-7)
    assert not np.allclose(momenta[0], momenta[1])  # every worker its own
    np.testing.assert_array_equal(upd["w"], _majority(m))
    differs_from_signsgd |= not np.array_equal(_majority(m), _majority(np.asarray(g["w"])))
    # The float tensor carries no momentum: the mean gradient, as signSGD sends it.
    np.testing.assert_allclose(upd["b"], np.mean(np.asarray(g["b"]), 0), rtol=1e-6)
    # ceil(111/8) + 1 bytes of signs and flag, 1 non-finite flag, 5 float32.
    assert _bytes(state) == math.ceil(111 / 8) + 1 + 1 + 4 * 5
  assert differs_from_signsgd, "the momentum should change some votes"


def _layout_grads(step, n=8):
  k1, k2 = jax.random.split(jax.random.PRNGKey(200 + step))
  return {"conv": jax.random.normal(k1, (n, 5, 5, 3, 8)), "bias": jax.random.normal(k2, (n, 8))}


def _check_layouts(make_tx, steps):
  assert len(jax.devices()) >= 8, "tests/conftest.py should give 8 host devices"
  params = jax.tree.map(lambda g: g[0], _layout_grads(0))
  results = run_layouts(make_tx, params, _layout_grads, 8, steps=steps)
  assert set(results) == {"vmap", "pmap", "shard_map", "shard_map+vmap"}
  ref_outs, ref_metrics, ref_state = results["vmap"]
  for layout, (outs, metrics, state) in results.items():
    close = lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, err_msg=layout)
    for a, b in zip(ref_outs, outs):
      jax.tree.map(close, a, b)
    jax.tree.map(close, ref_state.local.residual, state.local.residual)  # the workers' momenta
    jax.tree.map(close, ref_state.exchange.local.residual, state.exchange.local.residual)
    for k in ref_metrics:
      assert float(ref_metrics[k]) == float(metrics[k]), (layout, k)
  return results


def test_signum_same_numbers_under_every_layout():
  results = _check_layouts(lambda axis: jaxcomp.signum(0.9, axis_name=axis, min_size=100), steps=2)
  momenta = np.asarray(results["vmap"][2].local.residual["conv"])
  assert momenta.shape == (8, 5, 5, 3, 8) and not np.allclose(momenta[0], momenta[1])
  # conv: 600 sign bits + flag; bias (8 values) in float32; one non-finite flag.
  assert float(results["vmap"][1]["bytes_on_wire"]) == 600 / 8 + 1 + 4 * 8 + 1


# -- DGC ------------------------------------------------------------------------------


DGC_SHAPES = {"w": (40, 30), "b": (6,)}  # "b" stays in float (min_size=8)


def test_dgc_density_one_without_masking_is_momentum_sgd():
  """chain(dgc(density=1, masking=False), sgd(lr)) == sgd(lr, momentum) on the mean gradient."""
  lr, mom = 0.1, 0.9
  params = jax.tree.map(lambda g: g[0], _grads(0, DGC_SHAPES))
  steps = [_grads(s, DGC_SHAPES) for s in range(4)]
  dgc_tx = optax.chain(jaxcomp.dgc(1.0, momentum=mom, masking=False, sample=None, axis_name="w", min_size=8),
                       optax.sgd(lr))
  ours, _ = _run(dgc_tx, steps, params)
  # The same chain with masking: every entry is sent every step, so u is zeroed: plain SGD
  # on the compressed tensor, momentum SGD on the float one (it has no mask).
  masked_tx = optax.chain(jaxcomp.dgc(1.0, momentum=mom, sample=None, axis_name="w", min_size=8), optax.sgd(lr))
  masked, _ = _run(masked_tx, steps, params)
  ref_tx, plain_tx = optax.sgd(lr, momentum=mom), optax.sgd(lr)
  ref_state, plain_state = ref_tx.init(params), plain_tx.init(params)
  for g, a, b in zip(steps, ours, masked):
    mean = jax.tree.map(lambda x: x.mean(0), g)
    ref, ref_state = ref_tx.update(mean, ref_state)
    plain, plain_state = plain_tx.update(mean, plain_state)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6), a, ref)
    np.testing.assert_allclose(b["w"], plain["w"], rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(b["b"], ref["b"], rtol=2e-5, atol=1e-6)
  assert not np.allclose(ours[-1]["w"], masked[-1]["w"])


def test_dgc_masking_and_what_is_sent_plus_residual():
  """One worker, numpy reference: u <- m u + g; v <- v + u; sent = v where selected; u, v zeroed there.

  What was sent plus the residual accounts for every velocity:
  sum(sent) + v_T == sum over steps of u_t (the velocities before masking).
  """
  mom, density, n_steps = 0.9, 0.1, 5
  tx = jaxcomp.dgc(density, momentum=mom, sample=None)
  params = {"w": jnp.zeros((20, 10))}
  update = jax.jit(tx.update)
  state = tx.init(params)
  u = v = np.zeros((20, 10), np.float32)
  total_sent, total_u = np.zeros((20, 10)), np.zeros((20, 10))
  for step in range(n_steps):
    g = np.asarray(jax.random.normal(jax.random.PRNGKey(step), (20, 10)))
    out, state = update({"w": jnp.asarray(g)}, state)
    sent = np.asarray(out["w"])
    u = mom * u + g
    v = v + u
    mask = sent != 0
    assert mask.sum() == math.ceil(density * 200)  # exact threshold: k entries
    np.testing.assert_allclose(sent[mask], v[mask], rtol=1e-5, atol=1e-6)
    # The k largest |v|: nothing unsent is larger than anything sent.
    assert np.abs(v[~mask]).max() <= np.abs(v[mask]).min()
    total_sent += sent
    total_u += u
    v = np.where(mask, 0.0, v)
    u = np.where(mask, 0.0, u)
    momentum = np.asarray(state.local.residual["w"])
    residual = np.asarray(state.exchange.local.residual["w"])
    assert np.all(momentum[mask] == 0) and np.all(residual[mask] == 0)  # masked where sent, exactly
    np.testing.assert_allclose(momentum, u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(residual, v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total_sent + residual, total_u, rtol=1e-5, atol=1e-4)
  assert int(jaxcomp.metrics(state)["overflow"]) == 0


def test_dgc_warmup_schedule_densities_and_bytes():
  comp = jaxcomp.DGC(warmup_steps=8)
  # §3.3: sparsity 75%, 93.75%, 98.4375%, 99.6% (1 - 4^-4), one stage per quarter, then 99.9%.
  assert [1 - comp.density_at(s) for s in range(10)] == [
      0.75, 0.75, 0.9375, 0.9375, 0.984375, 0.984375, 0.99609375, 0.99609375, 0.999, 0.999]
  assert jaxcomp.DGC(warmup_steps=6).stage_starts == (2, 3, 5, 6)
  assert jaxcomp.DGC().densities == (0.001,) and not jaxcomp.DGC().custom_exchange
  # The exchange takes the stage's branch: bytes per step are 8 per slot at that density
  # (one worker here; the layouts test runs the branches over workers).
  n = 1000
  tx = jaxcomp.dgc(warmup_steps=8)
  update = jax.jit(tx.update)
  state = tx.init({"w": jnp.zeros((n,))})
  for step in range(10):
    out, state = update({"w": jax.random.normal(jax.random.PRNGKey(step), (n,))}, state)
    slots = math.ceil(comp.density_at(step) * n)
    assert _bytes(state) == 8 * slots, step  # one worker: no non-finite flag to agree on
    assert 0 < int(jnp.sum(out["w"] != 0)) <= slots
  assert int(state.exchange.inner["w"]) == 10  # the step counter


def test_dgc_byte_counts_hold_for_billions_of_elements():
  """A stage's conditional message of 6.4e9 bytes (> 2**32) counts exactly where it runs, 0 elsewhere."""
  comp = jaxcomp.DGC(warmup_steps=4)
  n = 3 * 2**30  # 3.2e9 elements; the payload's shapes only (nothing is allocated)
  slots = comp.selector(comp.densities[0]).slots(n)  # the index wire: a uint32 index and a float32 value a slot
  payload = (jax.ShapeDtypeStruct((slots,), jnp.uint32), jax.ShapeDtypeStruct((slots,), jnp.float32))
  nbytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in payload)
  assert nbytes == 8 * math.ceil(comp.densities[0] * n) > 2**32
  for stage, want in ((0, nbytes), (1, 0)):
    traffic = transport.Traffic()
    traffic.add(jaxcomp.core.Message("gather", payload, when=jnp.int32(stage) == 0), workers=4)
    assert (int(traffic.sent), int(traffic.received)) == (want, 3 * want)


def test_dgc_same_numbers_under_every_layout():
  # 2 steps take both branches of a one-stage warm-up; "bias" (8 values) stays in float.
  make_tx = lambda axis: jaxcomp.dgc(momentum=0.9, warmup_steps=1, warmup_densities=(0.25,),
                                     axis_name=axis, min_size=100)
  results = _check_layouts(make_tx, steps=2)
  momenta = np.asarray(results["vmap"][2].local.residual["conv"])
  assert not np.allclose(momenta[0], momenta[1])  # every worker its own u
  # The second step is after the warm-up: density 0.001 of 600 values (1 slot); bias in float32; one flag.
  assert float(results["vmap"][1]["bytes_on_wire"]) == 8 * 1 + 4 * 8 + 1


def test_a_nonfinite_gradient_leaves_the_momentum_and_residual_as_they_were():
  g1 = {"w": jnp.linspace(-1.0, 1.0, 64)}
  bad = {"w": g1["w"].at[5].set(jnp.nan)}
  for tx in (jaxcomp.signum(0.9), jaxcomp.dgc(0.1, sample=None)):
    update = jax.jit(tx.update)
    _, state = update(g1, tx.init(g1))
    out, after = update(bad, state)
    assert np.all(np.isnan(out["w"]))  # nonfinite="propagate": as without compression
    np.testing.assert_array_equal(after.local.residual["w"], state.local.residual["w"])
    jax.tree.map(np.testing.assert_array_equal, after.exchange.local.residual, state.exchange.local.residual)
    out, _ = update(g1, after)
    assert np.all(np.isfinite(out["w"]))


def test_dgc_local_clipping_scales_the_threshold_by_inverse_sqrt_n():
  clip = 1.0
  tx = jaxcomp.dgc(1.0, momentum=0.0, masking=False, sample=None, clip_norm=clip, axis_name="w")
  g = jnp.stack([jnp.full((16,), 3.0), jnp.full((16,), -1.0), jnp.full((16,), 0.01), jnp.full((16,), 0.02)])
  params = {"w": jnp.zeros(16)}
  (upd,), _ = _run(tx, [{"w": g}], params)
  limit = clip / math.sqrt(W)  # per worker
  norms = np.linalg.norm(np.asarray(g), axis=1)
  clipped = np.asarray(g) * np.minimum(1.0, limit / norms)[:, None]
  np.testing.assert_allclose(upd["w"], clipped.mean(0), rtol=1e-6)
  # One worker: the threshold itself.
  one = jaxcomp.dgc(1.0, momentum=0.0, masking=False, sample=None, clip_norm=clip)
  out, _ = jax.jit(one.update)({"w": g[0]}, one.init(params))
  np.testing.assert_allclose(np.linalg.norm(out["w"]), clip, rtol=1e-6)


# -- both ---------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: jaxcomp.signum(beta=1.0), "beta"),
    (lambda: jaxcomp.signum(beta=-0.1), "beta"),
    (lambda: jaxcomp.dgc(density=0.0), "density"),
    (lambda: jaxcomp.dgc(density=1.5), "density"),
    (lambda: jaxcomp.dgc(momentum=1.0), "momentum"),
    (lambda: jaxcomp.dgc(clip_norm=0.0), "clip_norm"),
    (lambda: jaxcomp.dgc(warmup_steps=-1), "warmup_steps"),
    (lambda: jaxcomp.dgc(warmup_steps=2), "warmup_steps"),
    (lambda: jaxcomp.dgc(warmup_densities=(0.5, 0.0)), "warmup_densities"),
    (lambda: jaxcomp.dgc(sample=0), "sample"),
    (lambda: jaxcomp.dgc(error_feedback=False), "error_feedback"),
    (lambda: jaxcomp.dgc(exchange="two_phase"), "exchange"),
])
def test_bad_arguments_name_the_argument(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_the_throughput_benchmark_builds_and_times_the_compressors():
  from experiments import throughput
  assert type(throughput.compressor_of("signum")) is jaxcomp.Signum
  comp = throughput.compressor_of("dgc")
  assert type(comp) is jaxcomp.DGC and not comp.custom_exchange  # timed through encode/decode
  x = jax.random.normal(jax.random.PRNGKey(0), (5000,))
  payload = jax.jit(lambda x, k: comp.encode(x, k, comp.agree(x)))(x, jax.random.PRNGKey(1))
  assert payload.indices.dtype == jnp.uint32 and payload.values.shape == (5,)  # ceil(0.001 * 5000)
  back = jax.jit(lambda p: comp.decode(p, x.shape))(payload)
  np.testing.assert_array_equal(back[payload.indices], x[payload.indices])
  assert int(jnp.sum(back != 0)) == 5
