"""Trainer options used by the TernGrad configs: weight decay on chosen tensors, top-5 accuracy; a sharded optimizer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp

from configs import common
from experiments import optimizers
from experiments import step as step_lib
from experiments import validation


def _config(**kw):
  c = common.base_config()
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def test_weight_decay_pattern_selects_tensors():
  params = {"conv1": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
            "fc3": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
            "fc4": {"kernel": jnp.ones((2, 2))}}
  mask = optimizers.decay_mask(_config(weight_decay_pattern=r"fc[34]/kernel"), params)
  assert mask == {"conv1": {"kernel": False, "bias": False},
                  "fc3": {"kernel": True, "bias": False}, "fc4": {"kernel": True}}
  assert all(np.ravel(list(optimizers.decay_mask(_config(), params)["conv1"].values())))


@pytest.mark.parametrize("pattern, decayed", [(None, {"a", "b"}), ("^a", {"a"})])
def test_loss_mode_weight_decay_only_on_matched(pattern, decayed):
  c = _config(weight_decay=0.5, weight_decay_pattern=pattern)
  params = {"a": jnp.full((3,), 2.0), "b": jnp.full((3,), 4.0)}

  def loss_fn(p, bs, x, y, key):
    del bs, x, y, key
    return jnp.float32(0.0) * (p["a"].sum() + p["b"].sum()), (jnp.zeros((1, 2)), {})

  grads = step_lib.loss_and_grad(c, loss_fn, params, {}, None, jnp.zeros(1, jnp.int32), None)[0]
  for k in params:
    np.testing.assert_allclose(grads[k], 0.5 * params[k] if k in decayed else 0.0)


def test_bad_weight_decay_pattern_fails_before_compiling():
  c = _config(weight_decay_pattern="fc[")
  with pytest.raises(ValueError, match="weight_decay_pattern"):
    validation.validate_config(c)


def test_shard_optimizer_cuts_the_chains_state_over_the_workers():
  c = _config(shard_optimizer=True, workers=4, optimizer="adam", compressor="terngrad")
  params = {"fc": {"kernel": jax.ShapeDtypeStruct((100, 200), jnp.float32)}, "b": jax.ShapeDtypeStruct((5,), jnp.float32)}
  state = jax.eval_shape(optimizers.make_tx(c, ("devices", "workers")).init, params)
  assert state.local.residual[1][0].mu["fc"]["kernel"].shape == (4, 5120)  # 20,000 / 4 rounded up to 2,560
  assert isinstance(state.local, jaxcomp.core.ShardLocal)
  # grad_clip_norm's jaxcomp.clip_by_global_norm takes the whole model's norm in a sharded chain
  validation.validate_config(_config(shard_optimizer=True, grad_clip_norm=1.0))


def test_shard_params_shards_the_parameters_gathered_by_the_named_codec():
  c = _config(shard_params=True, workers=4, optimizer="adam", compressor="blockint", compressor_kwargs={"bits": 4},
              param_gather="blockint", param_gather_kwargs={"bits": 8})
  validation.validate_config(c)
  tx = optimizers.make_tx(c, ("devices", "workers"))
  assert isinstance(tx, jaxcomp.zero.ShardedTransformation) and optimizers.param_gather(c) == jaxcomp.BlockInt(bits=8)
  params = {"w": jnp.arange(20_000, dtype=jnp.float32).reshape(100, 200), "b": jnp.ones(5)}
  sharded = tx.shard_params(params)
  assert sharded.local.residual["w"].shape == (4, 5120) and sharded.whole["b"] is params["b"]
  np.testing.assert_array_equal(tx.unshard(sharded)["w"], params["w"])
  for bad in (dict(param_gather="int4", shard_params=True), dict(param_gather="int8")):
    with pytest.raises(ValueError, match="param_gather"):
      validation.validate_config(_config(**bad))


class _FixedLogits:
  """A stand-in model (test fixture) whose logits are given."""

  def __init__(self, logits):
    self.logits = logits

  def apply(self, variables, images, train=False):
    del variables, train
    return self.logits[: images.shape[0]]


def test_eval_reports_top5():
  # Label 0 is the top-1 of row 0, 5th of row 1, 6th of row 2; row 3 is padding.
  logits = jnp.array([[9, 1, 2, 3, 4, 5, 0], [4, 9, 8, 7, 6, 0, 1],
                      [3, 9, 8, 7, 6, 5, 0], [0, 9, 8, 7, 6, 5, 1]], jnp.float32)
  step = step_lib.make_eval_step(_FixedLogits(logits), 7, has_bn=False)
  batch = {"image": np.zeros((4, 1)), "label": np.zeros(4, np.int32),
           "mask": np.array([True, True, True, False])}

  class _Pipe:
    def reset(self):
      return [batch]

  res = step_lib.evaluate(step, {}, {}, _Pipe())
  assert res["count"] == 3
  np.testing.assert_allclose(res["accuracy"], 1 / 3)
  np.testing.assert_allclose(res["top5_accuracy"], 2 / 3)
