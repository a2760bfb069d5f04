"""``jaxcomp.shard_optimizer``: the optimizer state sharded over the workers (ZeRO-1/2).

What must hold: with the float ``none`` exchange the sharded step gives the
replicated step's parameters (bitwise for SGD with momentum and Lion, whose
arithmetic is the same per element; AdamW to an ulp, where XLA fuses the
chunk's update otherwise than the whole tensor's), under ``vmap`` and under
``shard_map`` with one worker per device through ``jaxcomp.data_parallel``;
with a compressor, the reduce-scatter is the two-phase exchange's first
phase (the same payloads: the same error-feedback residuals, bit for bit)
and the shard is their decoded mean; the state is 1/N; the bytes of the
updates' all-gather are what the messages' shapes say; and a wrong chain or
worker count is refused by name. Tiny trees, 4 workers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

import jaxcomp
from benchmarks import zero_optimizers
from jaxcomp import compress_update
from jaxcomp import parallel
from jaxcomp.exchange import scatter

N = 4
ALIGN = 40
PARAMS = {"w": jnp.linspace(-1.0, 1.0, 3 * 500).reshape(3, 500), "b": jnp.ones(7), "v": jnp.linspace(0.5, -0.5, 1201)}


def _grads(worker):
  key = jax.random.PRNGKey(worker)
  return jax.tree.map(lambda p: jax.random.normal(jax.random.fold_in(key, p.size), p.shape), PARAMS)


GRADS = jax.vmap(_grads)(jnp.arange(N))


def _run(tx, steps=3):
  """``steps`` updates over ``N`` vmap-simulated workers: the parameters, the state, the last updates."""
  return zero_optimizers.run(tx, PARAMS, GRADS, steps)


def _chain(name, opt):
  return optax.chain(jaxcomp.get_transform(name, axis_name="workers"), opt)


def _sharded(chain):
  return jaxcomp.shard_optimizer(chain, axis_name="workers", num_workers=N, align=ALIGN)


OPTIMIZERS = {"sgd_momentum": lambda: optax.sgd(0.1, momentum=0.9), "lion": lambda: optax.lion(1e-3),
              "adamw": lambda: optax.adamw(1e-2, weight_decay=0.1)}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_float_sharded_step_equals_replicated(opt):
  replicated = _run(_chain("none", OPTIMIZERS[opt]()))
  sharded = _run(_sharded(_chain("none", OPTIMIZERS[opt]())))
  for u in jax.tree.leaves(sharded[2]):  # every worker gets the same whole update
    np.testing.assert_array_equal(u, jnp.broadcast_to(u[0], u.shape))
  for want, got in zip(jax.tree.leaves(replicated[0]), jax.tree.leaves(sharded[0])):
    if opt == "adamw":
      np.testing.assert_allclose(got, want, rtol=2e-7, atol=2e-7)
    else:
      np.testing.assert_array_equal(got, want)


def test_state_is_a_shard_per_worker():
  state = jax.eval_shape(_sharded(_chain("none", optax.adamw(1e-3))).init, PARAMS)
  mu = state.local.residual[1][0].mu
  # w: 1500 values -> 375 a worker, rounded up to 40: 400; v: 1201 -> 320; b (7 < N * 40) stays whole
  assert mu["w"].shape == (N, 400) and mu["v"].shape == (N, 320)
  kept = state.replicated[1][0]  # b (7 < N * 40 values) and the step count: whole, the same on every worker
  assert kept.mu["b"].shape == (7,) and kept.count.shape == ()
  assert isinstance(mu["b"], optax.MaskedNode) and isinstance(state.local, jaxcomp.core.ShardLocal)


def test_init_traces_the_compression_update_once(monkeypatch):
  """The counters' abstract trace of an update: once for the init (not for the chunks' inits, whose compression
  state is dropped), not again for a second init of the same shapes; the two states are alike."""
  traced = []
  update_fn = compress_update.Compress.update_fn
  monkeypatch.setattr(compress_update.Compress, "update_fn",
                      lambda self, *args, **kwargs: traced.append(1) or update_fn(self, *args, **kwargs))
  tx = _sharded(_chain("terngrad", optax.adamw(1e-3)))
  abstract, state = jax.eval_shape(tx.init, PARAMS), tx.init(PARAMS)
  assert len(traced) == 1
  assert jax.tree.structure(abstract) == jax.tree.structure(state)  # the static counts included


# Compressors whose reduce-scatter must be the two-phase exchange's first phase (blocks that divide ALIGN).
FIRST_PHASE = {"terngrad": lambda **kw: jaxcomp.terngrad(axis_name="workers", error_feedback=True, **kw),
               "blockint4": lambda **kw: jaxcomp.blockint(bits=4, block=ALIGN, axis_name="workers", **kw)}


@pytest.mark.parametrize("name", sorted(FIRST_PHASE))
def test_compressed_shard_is_the_two_phase_first_phase(name):
  """The same phase-1 payloads as ``exchange="two_phase"`` (the residuals agree bitwise); the shard their mean."""
  sgd = lambda: optax.sgd(1.0)
  make = FIRST_PHASE[name]
  sharded = _run(_sharded(optax.chain(make(), sgd())), steps=1)
  two_phase = _run(optax.chain(make(exchange="two_phase"), sgd()), steps=1)
  residual = lambda state: state[1].replicated[0].local.residual if hasattr(state[1], "replicated") else state[1][0].local.residual
  for got, want in zip(jax.tree.leaves(residual(sharded)), jax.tree.leaves(residual(two_phase))):
    np.testing.assert_array_equal(got, want)
  # sent by each worker = x - r; their mean is the averaged gradient (the updates are its negative)
  assert len(jax.tree.leaves(residual(sharded))) == 3  # w and v reduce-scattered, b (too small) all-gathered
  for key in ("w", "v"):
    sent = GRADS[key] - residual(sharded)[key]
    np.testing.assert_allclose(-sharded[2][key][0], jnp.mean(sent, axis=0), rtol=1e-6, atol=1e-6)


def test_gather_bytes_are_the_chunks():
  _, state, _ = _run(_sharded(_chain("terngrad", optax.sgd(0.1))), steps=1)
  m = jaxcomp.metrics(state)
  chunks = 4 * (400 + 320)  # the float32 chunks of w and v this worker sends
  assert int(m["gather_bytes"]) == chunks
  assert float(m["bytes_on_wire"]) > chunks  # and the compressed reduce-scatter's


def test_data_parallel_one_worker_per_device_equals_vmap():
  mesh = Mesh(np.array(jax.devices()[:N]), ("workers",))
  chain = lambda: _sharded(_chain("none", optax.sgd(0.1, momentum=0.9)))
  x = jax.random.normal(jax.random.PRNGKey(1), (N, 4, 1500))

  def loss(params, batch):
    return jnp.mean((batch @ params["w"].reshape(-1, 1)) ** 2) + jnp.sum(params["v"] ** 2) + jnp.sum(params["b"])

  out = []
  for where in ({"mesh": mesh}, {"workers": N}):
    tx = chain()

    def worker_step(params, opt_state, batch, tx=tx):
      grads = jax.grad(loss)(parallel.vary(params, "workers"), batch)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    step = jaxcomp.data_parallel(worker_step, tx, **where)
    params, state = step.init(PARAMS)
    for _ in range(2):
      params, state = step(params, state, x)
    out.append(params)
  for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # device all-reduces sum in their own order


def test_refusals_name_the_fix():
  with pytest.raises(ValueError, match="starts with a compression transform"):
    jaxcomp.shard_optimizer(optax.adamw(1e-3), axis_name="workers", num_workers=N).init(PARAMS)
  tx = jaxcomp.shard_optimizer(_chain("none", optax.sgd(0.1)), axis_name="workers", num_workers=2, align=ALIGN)
  state = parallel.replicate_workers(tx.init(PARAMS), 2)
  with pytest.raises(ValueError, match="num_workers=2"):
    jax.vmap(lambda g: tx.update(g, parallel.worker_slice(state, 0), PARAMS), axis_name="workers")(GRADS)
  with pytest.raises(ValueError, match="leading axis of 4"):
    parallel.replicate_workers(tx.init(PARAMS), N)
  qsgd = jaxcomp.shard_optimizer(optax.chain(jaxcomp.qsgd(axis_name="workers"), optax.sgd(0.1)),
                                 axis_name="workers", num_workers=N, align=ALIGN)
  with pytest.raises(ValueError, match="align="):
    _run(qsgd, steps=1)


def test_split_keeps_small_tensors_whole_and_counts_for_billions():
  assert scatter.split(1000, 4, 2560) is None
  lay = scatter.split(3_000_000_001, 8)
  assert lay.chunk % 2560 == 0 and lay.padded >= 3_000_000_001
  big = {"w": jax.ShapeDtypeStruct((50_000, 40_000), jnp.float32)}  # 2e9 parameters, nothing allocated
  tx = jaxcomp.shard_optimizer(_chain("none", optax.adam(1e-3)), axis_name="workers", num_workers=8)
  state = jax.eval_shape(tx.init, big)
  assert state.local.residual[1][0].mu["w"].shape == (8, 250_001_920)  # 2e9 / 8 rounded up to 2,560


def test_clip_by_global_norm_sees_the_whole_model():
  """jaxcomp.clip_by_global_norm: optax's numbers replicated, the whole model's norm sharded (a 4-byte sum counted)."""
  clip = lambda: optax.chain(jaxcomp.get_transform("none", axis_name="workers"), jaxcomp.clip_by_global_norm(0.5),
                             optax.sgd(0.1))
  plain = _run(optax.chain(jaxcomp.get_transform("none", axis_name="workers"), optax.clip_by_global_norm(0.5),
                           optax.sgd(0.1)))
  replicated, sharded = _run(clip()), _run(_sharded(clip()))
  for want, a, b in zip(jax.tree.leaves(plain[0]), jax.tree.leaves(replicated[0]), jax.tree.leaves(sharded[0])):
    np.testing.assert_array_equal(a, want)
    np.testing.assert_allclose(b, want, rtol=1e-6, atol=1e-7)
  m = jaxcomp.metrics(sharded[1])
  assert int(m["gather_bytes"]) == 4 * (400 + 320)
  assert float(m["bytes_on_wire"]) - float(jaxcomp.metrics(_run(_sharded(_chain("none", optax.sgd(0.1))))[1])[
      "bytes_on_wire"]) == 4  # the chunks' sum of squares: one float32


@pytest.mark.parametrize("name", ["adafactor", "sm3", "novograd", "apply_if_finite"])
def test_optimizers_that_look_across_a_tensor_are_refused_by_name(name):
  opt = optax.apply_if_finite(optax.sgd(1e-2), 3) if name == "apply_if_finite" else getattr(optax, name)(1e-2)
  tx = jaxcomp.shard_optimizer(_chain("none", opt), axis_name="workers", num_workers=N, align=ALIGN)
  with pytest.raises(ValueError, match="looks across a tensor"):
    tx.init(PARAMS)


# The updates' all-gather compressed: the codec, and the bytes of a chunk of c values.
GATHERS = {"int8": (jaxcomp.Int8(), lambda c: c + 4),
           "blockint8": (jaxcomp.BlockInt(bits=8, block=ALIGN), lambda c: c + 4 * (c // ALIGN))}


@pytest.mark.parametrize("name", sorted(GATHERS))
def test_compressed_gather_keeps_replicas_identical_and_conserves_the_updates(name):
  """gather=Int8() (c + 4 bytes a chunk) or BlockInt (a scale a block); sum of applied updates + the residuals =
  sum of the chain's updates."""
  chain = lambda: _chain("none", optax.sgd(1.0))
  steps = 3
  codec, chunk_bytes = GATHERS[name]
  tx = jaxcomp.shard_optimizer(chain(), axis_name="workers", num_workers=N, align=ALIGN, gather=codec)
  params, state, updates = _run(tx, steps=steps)
  for u in jax.tree.leaves(updates):
    np.testing.assert_array_equal(u, jnp.broadcast_to(u[0], u.shape))
  assert int(jaxcomp.metrics(state)["gather_bytes"]) == chunk_bytes(400) + chunk_bytes(320)
  # every step's chain update is -mean(grads) (the same grads each step): what was applied plus what the
  # residuals hold is steps times that, per cut tensor
  for key, lay in (("w", scatter.split(1500, N, ALIGN)), ("v", scatter.split(1201, N, ALIGN))):
    held = scatter.whole(state.gather.local.residual[key], lay, PARAMS[key].shape)
    np.testing.assert_allclose(params[key] - PARAMS[key] + held, -steps * jnp.mean(GRADS[key], axis=0),
                               rtol=1e-5, atol=1e-5)
  assert float(jnp.max(jnp.abs(state.gather.local.residual["w"]))) > 0  # the codec did lose something
