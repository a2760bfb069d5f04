"""The shared machinery of jaxcomp.compress: error feedback, skipping, policies, metrics."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import core, parallel, transforms, update_steps

from _layouts import vmap_update

pytestmark = pytest.mark.accelerator


class _RoundPayload(NamedTuple):
  codes: jax.Array
  scale: jax.Array


@dataclasses.dataclass(frozen=True)
class Round(core.Compressor):
  """A deterministic biased test compressor: int8 codes of round(x / scale)."""

  levels: int = 3
  error_feedback = True

  def encode(self, x, key, agreed):
    del key, agreed
    scale = jnp.max(jnp.abs(x), initial=0.0) / self.levels
    safe = jnp.where(scale > 0, scale, 1.0)
    return _RoundPayload(jnp.round(x / safe).astype(jnp.int8).reshape(-1), scale)

  def decode(self, p, shape):
    return (p.codes.astype(jnp.float32) * p.scale).reshape(shape)


def _vmap_update(tx, grads, state):
  """``tx.update`` vmapped over workers "w", jitted once per transform and state structure (not eager ops)."""
  return vmap_update(tx, grads, state)


def test_error_feedback_conservation_single_worker():
  """Over T steps: sum(decoded) + final residual == sum(inputs)."""
  tx = jaxcomp.compress(Round())
  g0 = jnp.zeros((50,))
  state = tx.init(g0)
  total_in = jnp.zeros(50)
  total_out = jnp.zeros(50)
  for t in range(25):
    g = jax.random.normal(jax.random.PRNGKey(t), (50,))
    out, state = jax.jit(tx.update)(g, state)
    total_in += g
    total_out += out
  np.testing.assert_allclose(total_out + state.local.residual, total_in, atol=1e-4)
  assert float(jnp.max(jnp.abs(state.local.residual))) > 0  # the test is not vacuous


def test_error_feedback_conservation_many_workers():
  """Per worker: sum of own decodes + residual == sum of inputs; mean of decodes is the update."""
  N = 4
  tx = jaxcomp.compress(Round(), axis_name="w")
  state = parallel.replicate_workers(tx.init(jnp.zeros((3, 7))), N)
  total_in = jnp.zeros((N, 3, 7))
  total_upd = jnp.zeros((3, 7))
  for t in range(10):
    g = jax.random.normal(jax.random.PRNGKey(t), (N, 3, 7))
    upd, state = _vmap_update(tx, g, state)
    total_in += g
    total_upd += upd
  # The update is the mean of what workers decoded, so mean_i(sum_in_i - r_i) == sum(updates).
  np.testing.assert_allclose(total_upd, (total_in - state.local.residual).mean(0), atol=1e-4)


def test_skip_predicate_tree_and_min_size():
  params = {"a": jnp.zeros((100,)), "b": jnp.zeros((100,)), "small": jnp.zeros((3,))}
  grads = {k: jnp.linspace(-1, 1, v.size) for k, v in params.items()}
  # Callable predicate on the path, and min_size.
  tx = jaxcomp.compress(Round(), skip=jaxcomp.skip_by_path(lambda p: p == "b"), min_size=10)
  out, st = jax.jit(tx.update)(grads, tx.init(params))
  np.testing.assert_array_equal(out["b"], grads["b"])
  np.testing.assert_array_equal(out["small"], grads["small"])
  assert not np.array_equal(out["a"], grads["a"])
  assert isinstance(st.local.residual["b"], optax.MaskedNode)
  m = jaxcomp.metrics(st)
  assert float(m["float_bytes"]) == 4 * 103
  # A pytree of booleans (a prefix of the structure works too).
  tx2 = jaxcomp.compress(Round(), skip={"a": True, "b": False, "small": False})
  out2, _ = jax.jit(tx2.update)(grads, tx2.init(params))
  np.testing.assert_array_equal(out2["a"], grads["a"])
  with pytest.raises(TypeError, match="Python booleans"):
    jaxcomp.compress(Round(), skip={"a": jnp.array(True), "b": False, "small": False}).init(params)
  with pytest.raises(ValueError, match="structure"):
    jaxcomp.compress(Round(), skip={"zzz": True}).init(params)


@pytest.mark.parametrize("policy", ["propagate", "zero"])
def test_nonfinite_policies(policy):
  N = 2
  tx = jaxcomp.compress(Round(), axis_name="w", nonfinite=policy)
  state = parallel.replicate_workers(tx.init({"x": jnp.zeros(5), "y": jnp.zeros(5)}), N)
  g = {"x": jnp.array([[1.0, 2, 3, 4, 5], [1, 2, jnp.nan, 4, 5]]), "y": jnp.ones((N, 5))}
  upd, st = _vmap_update(tx, g, state)
  if policy == "propagate":
    assert np.all(np.isnan(upd["x"]))
  else:
    assert np.all(np.isfinite(upd["x"]))
    x0 = g["x"][0]
    alone = jax.jit(lambda x: Round().decode(Round().encode(x, None, None), x.shape))(x0)
    np.testing.assert_allclose(upd["x"], alone / 2, atol=1e-6)  # the bad worker sent zeros
  np.testing.assert_allclose(upd["y"], 1.0)
  # The bad worker's residual is untouched (zeros), never NaN.
  assert np.all(np.isfinite(st.local.residual["x"]))
  np.testing.assert_array_equal(st.local.residual["x"][1], 0.0)
  assert float(jaxcomp.metrics(st)["nonfinite_tensors"]) == 1  # one tensor on one of two workers: a sum
  with pytest.raises(ValueError, match="nonfinite"):
    jaxcomp.compress(Round(), nonfinite="ignore")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_is_nonfinite_is_not_all_isfinite(dtype):
  big = float(jnp.finfo(dtype).max)
  cases = [[], [0.0, -0.0], [big, big, -big], [1e-45, 3.0], [1.0, jnp.inf], [-jnp.inf, 2.0],
           [jnp.nan, 1.0], [jnp.inf, -jnp.inf], [big] * 1000 + [jnp.nan]]
  for c in cases:
    x = jnp.asarray(c, dtype)
    assert bool(jax.jit(update_steps.is_nonfinite)(x)) == (not bool(jnp.all(jnp.isfinite(x)))), c


def test_after_leaves_every_value_bit_for_bit():
  """``after`` selects on a flag XLA cannot fold: ±0, subnormals, ±Inf and NaN keep their bits."""
  x = jnp.asarray([0.0, -0.0, 1e-45, -1e-45, 1.5, -2.5, jnp.inf, -jnp.inf, jnp.nan, 3.4e38], jnp.float32)
  for flag in (False, True):
    (y,) = jax.jit(core.after)([x], jnp.asarray(flag))
    np.testing.assert_array_equal(np.asarray(y).view(np.uint32), np.asarray(x).view(np.uint32))
  text = jax.jit(core.after).lower([x], jnp.asarray(True)).compile().as_text()
  assert "select" in text  # kept: the dependency that orders the buckets is real


def test_integer_leaves_rejected_and_registry():
  with pytest.raises(TypeError, match="floating"):
    jaxcomp.compress(Round()).init({"i": jnp.zeros(3, jnp.int32)})
  with pytest.raises(ValueError, match="Unknown compressor"):
    jaxcomp.get_transform("nope")
  assert "terngrad" in jaxcomp.names() and "none" in jaxcomp.names()
  with pytest.raises(TypeError, match="terngrad"):
    jaxcomp.get_transform("terngrad", levels=3)


def test_metrics_from_nested_state_and_masked():
  params = {"a": jnp.zeros((64,)), "b": jnp.zeros((64,))}
  tx = optax.chain(jaxcomp.compress(Round()), optax.sgd(0.1))
  _, st = jax.jit(tx.update)(params, tx.init(params), params)
  m = jaxcomp.metrics(st)
  # int8 codes (64 B) + float32 scale (4 B) per tensor, single worker: no agreement, no flags.
  assert float(m["bytes_on_wire"]) == 2 * (64 + 4)
  assert float(m["compression_ratio"]) == pytest.approx(512 / 136)
  with pytest.raises(ValueError, match="no compression transform"):
    jaxcomp.metrics(optax.sgd(0.1).init(params))


@dataclasses.dataclass(frozen=True)
class _CountingMean(core.Compressor):
  """A custom exchange with per-tensor state: float pmean, counting its calls."""

  custom_exchange = True

  def init_state(self, shape, key):
    return jnp.zeros((), jnp.int32)

  def exchange(self, x, key, axis_name, state):
    mean = yield core.Message("mean", x)
    return core.Exchanged(mean=mean, own=x, payload=(x,), state=state + 1)


def test_custom_exchange_and_inner_state():
  N = 3
  tx = jaxcomp.compress(_CountingMean(), axis_name="w")
  state = parallel.replicate_workers(tx.init({"a": jnp.zeros(4), "b": jnp.zeros(2)}), N)
  g = {"a": jnp.arange(12.0).reshape(N, 4), "b": jnp.ones((N, 2))}
  for _ in range(2):
    upd, state = _vmap_update(tx, g, state)
  np.testing.assert_allclose(upd["a"], g["a"].mean(0))
  assert int(state.inner["a"]) == 2 and int(state.inner["b"]) == 2  # replicated, not per worker
  assert float(jaxcomp.metrics(state)["bytes_on_wire"]) == 4 * 6 + 2  # + one non-finite flag byte per tensor


def test_make_optimizer_chains():
  opt = jaxcomp.make_optimizer("terngrad", optax.sgd(0.1), clip_sigma=None)
  params = {"w": jnp.ones(8)}
  upd, st = jax.jit(opt.update)({"w": jnp.ones(8)}, opt.init(params), params)
  np.testing.assert_allclose(upd["w"], -0.1)
  assert float(jaxcomp.metrics(st)["bytes_on_wire"]) == 2 + 4


@dataclasses.dataclass(frozen=True)
class _Clip(core.Compressor):
  """Sends int8 codes of x clipped to [-1, 1]; reports how many entries were clipped."""

  metric_keys = ("clipped",)

  def encode_with_metrics(self, x, key, agreed):
    codes = jnp.round(jnp.clip(x, -1, 1)).astype(jnp.int8).reshape(-1)
    return _RoundPayload(codes, jnp.float32(1)), {"clipped": jnp.sum(jnp.abs(x) > 1)}

  def encode(self, x, key, agreed):
    return self.encode_with_metrics(x, key, agreed)[0]

  def decode(self, p, shape):
    return (p.codes.astype(jnp.float32) * p.scale).reshape(shape)


def test_encoder_metrics_stay_local_and_are_summed():
  """encode_with_metrics: counters reach the metrics, never the wire."""
  N = 2
  tx = jaxcomp.compress(_Clip(), axis_name="w")
  state = parallel.replicate_workers(tx.init({"a": jnp.zeros(4), "b": jnp.zeros(3)}), N)
  g = {"a": jnp.array([[0.0, 2, -3, 1], [5.0, 0, 0, 0]]), "b": jnp.array([[9.0, 0, 0], [0.0, 0, 0]])}
  upd, st = _vmap_update(tx, g, state)
  np.testing.assert_array_equal(st.local.metrics["clipped"], [3, 1])  # per worker, summed over tensors
  m = jaxcomp.metrics(st)
  assert float(m["clipped"]) == 2.0  # mean over workers
  assert float(m["bytes_on_wire"]) == (4 + 4) + (3 + 4) + 2  # payloads + one flag byte per tensor
  np.testing.assert_allclose(upd["a"], [0.5, 0.5, -0.5, 0.5])


def test_init_records_the_static_sizes_of_an_update():
  """Before any update the counters hold the sizes an update records statically, zero for the rest,
  and the state has the same pytree structure as after an update (one jit cache entry, lax.scan)."""
  params = {"a": jnp.zeros((10,)), "small": jnp.zeros((3,))}
  tx = jaxcomp.compress(_Clip(), min_size=5)
  s0 = tx.init(params)
  _, s1 = jax.jit(tx.update)({"a": jnp.full((10,), 3.0), "small": jnp.zeros((3,))}, s0)
  assert jax.tree.structure(s0) == jax.tree.structure(s1)
  m0, m1 = jaxcomp.metrics(s0), jaxcomp.metrics(s1)
  for m in (m0, m1):
    assert int(m["float32_bytes"]) == 4 * 13 and int(m["compressed_float32_bytes"]) == 4 * 10
    assert int(m["bytes_on_wire"]) == 10 + 4 + 4 * 3  # int8 codes + scale, and the float tensor
  assert int(m0["clipped"]) == 0 and int(m1["clipped"]) == 10
