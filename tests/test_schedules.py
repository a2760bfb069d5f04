"""Hyperparameters under optax.inject_hyperparams and on a schedule (jaxcomp.hyperparams).

Every registered compressor builds under ``optax.inject_hyperparams``; its
numeric hyperparameters that fix no shape may be injected (traced) and give
the update of the plain factory with the same value; the ones that fix a
shape or the wire are refused with an error that names them; a scheduled
fraction (top-k, random-k, DGC's warm-up) keeps the payload's size and
changes how many entries are sent, which ``encoded_bytes`` counts.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import parallel

from _layouts import vmap_update

pytestmark = pytest.mark.accelerator

W = 4  # workers
PARAMS = {"w": jnp.zeros((8, 32)), "b": jnp.zeros((48,))}


def _grads(step):
  keys = jax.random.split(jax.random.PRNGKey(100 + step), len(PARAMS))
  return {name: jax.random.normal(k, (W,) + p.shape) for k, (name, p) in zip(keys, PARAMS.items())}


def _updates(tx, steps=2):
  state = parallel.replicate_workers(tx.init(PARAMS), W)
  out = []
  for t in range(steps):
    upd, state = vmap_update(tx, _grads(t), state)
    out.append(upd)
  return out, state


# name -> (factory, positional args, static keyword arguments, injected hyperparameters and their values).
INJECTED = {
    "terngrad": (jaxcomp.terngrad, (), {}, {"clip_sigma": 2.0}),
    "threelc": (jaxcomp.threelc, (), {}, {"sparsity": 1.5}),
    "threshold": (jaxcomp.threshold, (), {"capacity": 0.25}, {"tau": 0.5}),
    "signum": (jaxcomp.signum, (), {}, {"beta": 0.75}),
    "dgc": (jaxcomp.dgc, (), {"sample": None, "capacity": 0.5, "warmup_steps": 0},
            {"density": 0.25, "momentum": 0.75, "clip_norm": 4.0}),
    "topk": (jaxcomp.topk, (), {"sample": 64, "capacity": 0.5}, {"fraction": 0.25}),
    "randomk": (jaxcomp.randomk, (), {"capacity": 0.5}, {"fraction": 0.25}),
    "diloco": (jaxcomp.diloco, (optax.sgd(0.1),), {"inner_steps": 1},
               {"outer_learning_rate": 0.5, "outer_momentum": 0.75}),
    "demo": (jaxcomp.demo, (), {"k": 4, "chunk": 4}, {"learning_rate": 0.125, "decay": 0.75}),
    "onebit_adam": (jaxcomp.onebit_adam, (), {"exchange": "all_gather"},
                    {"learning_rate": 0.125, "b1": 0.75, "b2": 0.875, "eps": 1e-3, "freeze_step": 1}),
}


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_injected_hyperparameters_give_the_plain_update(name):
  factory, args, static, hyper = INJECTED[name]
  plain = factory(*args, **static, **hyper, axis_name="w")
  injected = optax.inject_hyperparams(factory, static_args=factory.static_args)(
      *args, **static, **hyper, axis_name="w")
  state = injected.init(PARAMS)
  assert set(hyper) <= set(state.hyperparams), "each one is injected (an array in the state), not static"
  expected, _ = _updates(plain)
  got, _ = _updates(injected)
  for e, g in zip(expected, got):
    for k in PARAMS:
      np.testing.assert_allclose(g[k], e[k], rtol=1e-6, atol=1e-6, err_msg=f"{name} {k}")


@pytest.mark.parametrize("name", [n for n in jaxcomp.names() if n not in INJECTED])
def test_every_other_compressor_builds_under_inject_hyperparams(name):
  """No numeric hyperparameter to inject: the static ones in static_args, the options in **kwargs pass through."""
  if name == "local_steps":
    factory, args = jaxcomp.local_steps, (optax.sgd(-1.0), 1)  # one step: the averaged gradient itself
  else:
    factory, args = jaxcomp.REGISTRY[name], ()
  options = {"axis_name": "w", "min_size": 300, "skip": jaxcomp.skip_by_path(lambda p: p == "b")}
  tx = optax.inject_hyperparams(factory, static_args=factory.static_args)(*args, **options)
  state = tx.init(PARAMS)
  assert not set(factory.static_args) & set(state.hyperparams)
  # The options reached jaxcomp.compress: the state is the plain factory's (skip, min_size: which
  # tensors have a residual), and an update traces over the worker axis.
  plain = jax.eval_shape(factory(*args, **options).init, PARAMS)
  assert jax.tree.structure(state.inner_state) == jax.tree.structure(plain)
  jax.eval_shape(lambda s: parallel.worker_slice(jax.vmap(
      tx.update, in_axes=(0, None), axis_name="w")(_grads(0), s)[1], 0), state)


@pytest.mark.parametrize("factory, static, value, match", [
    (jaxcomp.qsgd, "bucket_size", 64, "bucket_size` fixes the number of norms"),
    (jaxcomp.qsgd, "bits_per_value", 4, "bits_per_value` fixes the bits per value"),
    (jaxcomp.powersgd, "rank", 2, "rank` fixes the shapes"),
    (jaxcomp.threshold, "capacity", 0.25, "capacity` fixes the number of word slots"),
    (jaxcomp.topk, "sample", 64, "sample` fixes the size of the sample"),
    (jaxcomp.threelc, "capacity", 0.5, "capacity` fixes the size of the zero-run buffer"),
    (jaxcomp.dgc, "warmup_steps", 8, "warmup_steps` fixes the stages"),
    (jaxcomp.local_steps, "k", 2, "k` fixes the local steps"),
])
def test_shape_fixing_hyperparameters_must_be_static(factory, static, value, match):
  args = (optax.sgd(0.1),) if factory is jaxcomp.local_steps else ()
  others = tuple(a for a in factory.static_args if a != static)
  with pytest.raises(TypeError, match=match) as e:
    optax.inject_hyperparams(factory, static_args=others)(*args, **{static: value}).init(PARAMS)
  assert "static_args" in str(e.value)


@pytest.mark.parametrize("factory, fraction", [(jaxcomp.topk, "fraction"), (jaxcomp.randomk, "fraction"),
                                               (jaxcomp.dgc, "density")])
def test_a_traced_fraction_needs_a_capacity(factory, fraction):
  with pytest.raises(TypeError, match=f"traced {fraction} .* needs a static `capacity`"):
    static = tuple(a for a in factory.static_args if a != "capacity")
    optax.inject_hyperparams(factory, static_args=static)(**{fraction: 0.5}).init(PARAMS)


def test_bad_concrete_values_keep_their_errors():
  with pytest.raises(ValueError, match=r"beta must be a number in \[0, 1\); got 1.5"):
    jaxcomp.signum(1.5)
  with pytest.raises(ValueError, match="beta must be a number in"):  # injected, concrete at init: checked
    optax.inject_hyperparams(jaxcomp.signum)(beta=1.5).init(PARAMS)
  with pytest.raises(ValueError, match="sparsity"):
    jaxcomp.threelc(2.5)


def test_changing_an_injected_value_changes_the_selection():
  """3LC's sparsity multiplier: a larger s zeroes more values (§3.1); changed in the state between steps."""
  tx = optax.inject_hyperparams(jaxcomp.threelc)(sparsity=1.0, error_feedback=False)
  params = {"w": jnp.zeros((512,))}
  g = {"w": jax.random.normal(jax.random.PRNGKey(0), (512,))}
  state = tx.init(params)
  step = jax.jit(tx.update)
  zeros = []
  for s in (1.0, 1.9):
    state.hyperparams["sparsity"] = jnp.float32(s)
    upd, state = step(g, state)
    zeros.append(int(jnp.sum(upd["w"] == 0)))
  assert zeros[1] > zeros[0] + 20, zeros  # 467 and 510 of 512


def test_a_top_k_fraction_on_a_schedule_keeps_the_payload_and_changes_the_count():
  n = 512
  schedule = optax.piecewise_constant_schedule(0.5, {1: 0.25, 2: 0.25})  # 0.5, 0.125, 0.03125
  tx = optax.inject_hyperparams(jaxcomp.topk, static_args=jaxcomp.topk.static_args)(
      fraction=schedule, wire="index", sample=None, capacity=0.5, error_feedback=False)
  params = {"w": jnp.zeros((n,))}
  g = {"w": jax.random.normal(jax.random.PRNGKey(1), (n,))}
  state = tx.init(params)
  step = jax.jit(tx.update)
  for fraction in (0.5, 0.125, 0.03125):
    upd, state = step(g, state)
    k = int(np.ceil(fraction * n))
    assert int(jnp.sum(upd["w"] != 0)) == k
    m = jaxcomp.metrics(state)
    assert int(m["bytes_on_wire"]) == 8 * (n // 2)  # the capacity's slots, every step
    assert int(m["encoded_bytes"]) == 8 * k  # the filled ones


def test_a_random_k_fraction_on_a_schedule_fills_k_of_the_capacity():
  n = 400
  tx = optax.inject_hyperparams(jaxcomp.randomk, static_args="capacity")(fraction=optax.piecewise_constant_schedule(0.5, {1: 0.1}),
                                                 capacity=0.5, error_feedback=False)
  params = {"w": jnp.zeros((n,))}
  state = tx.init(params)
  step = jax.jit(tx.update)
  for k in (200, 20):
    upd, state = step({"w": jnp.arange(1.0, n + 1.0)}, state)
    m = jaxcomp.metrics(state)
    assert int(jnp.sum(upd["w"] != 0)) == k
    assert int(m["bytes_on_wire"]) == 4 * 200 and int(m["encoded_bytes"]) == 4 * k


def test_dgc_warmup_schedule_gives_the_papers_densities():
  """§3.3: 25%, 6.25%, 1.5625%, 0.390625% over four equal stages, then 0.1%; the stages of DGC(warmup_steps)."""
  schedule = jaxcomp.dgc_warmup_schedule(400)
  steps = [0, 99, 100, 199, 200, 300, 399, 400, 10**6]
  expected = [0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.00390625, 0.00390625, 0.001, 0.001]
  got = [float(schedule(jnp.int32(s))) for s in steps]
  np.testing.assert_allclose(got, expected, rtol=1e-7)
  stages = jaxcomp.DGC(warmup_steps=400)
  assert got == [float(np.float32(stages.density_at(s))) for s in steps]


def test_dgc_with_the_warmup_schedule_sends_the_scheduled_counts():
  n = 256
  tx = optax.inject_hyperparams(jaxcomp.dgc, static_args=jaxcomp.dgc.static_args)(
      density=jaxcomp.dgc_warmup_schedule(4, density=0.01), capacity=0.25, sample=None, momentum=0.0)
  params = {"w": jnp.zeros((n,))}
  state = tx.init(params)
  step = jax.jit(tx.update)
  sent, wire = [], []
  for t in range(6):
    _, state = step({"w": jax.random.normal(jax.random.PRNGKey(t), (n,))}, state)
    m = jaxcomp.metrics(state)
    sent.append(int(m["encoded_bytes"]) // 8)
    wire.append(int(m["bytes_on_wire"]))
  assert sent == [64, 16, 4, 1, 3, 3]  # ceil(d·256) for d = 1/4, 1/16, 1/64, 1/256, then 0.01
  assert wire == [8 * 64] * 6
