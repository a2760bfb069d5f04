"""The trainer's learning-rate schedules: piecewise decay, and local steps' update count."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import jaxcomp
from configs import common
from experiments import optimizers
from experiments import validation


def _config(**overrides):
  c = common.base_config()
  c.num_train_steps = 100
  c.learning_rate = 0.1
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def test_piecewise_divides_at_fractions_of_the_run():
  """He et al. 2015 §4.2's schedule: ÷10 at 50% and 75% of the steps."""
  sched = optimizers.make_schedule(_config(lr_schedule="piecewise", lr_boundaries=(0.5, 0.75), lr_decay_rate=0.1))
  np.testing.assert_allclose([float(sched(t)) for t in (0, 49, 50, 74, 75, 99)],
                             [0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


@pytest.mark.parametrize("bounds", [(0.75, 0.5), (0.0, 0.5), (0.5, 1.0)])
def test_piecewise_rejects_bad_boundaries(bounds):
  with pytest.raises(ValueError, match="lr_boundaries"):
    validation.validate_config(_config(lr_schedule="piecewise", lr_boundaries=bounds))


def test_local_steps_schedule_spans_the_optimizer_updates():
  """With k local steps the optimizer steps T/k times; its cosine must reach lr_end (3LC §4.3)."""
  c = _config(lr_schedule="cosine", lr_end=0.001, compressor="local_steps",
              compressor_kwargs=ml_collections.ConfigDict({"k": 2}))
  assert optimizers.updates_per_step(c) == 0.5
  sched = optimizers.make_schedule(c)
  np.testing.assert_allclose(float(sched(50)), 0.001, rtol=1e-5)  # the last of 50 updates
  np.testing.assert_allclose(float(sched(25)), (0.1 + 0.001) / 2, rtol=1e-5)
  c.compressor_kwargs = ml_collections.ConfigDict()  # local_steps' own default k
  assert optimizers.updates_per_step(c) == 1 / 2
  assert optimizers.updates_per_step(_config(compressor="threelc")) == 1.0


def test_make_tx_builds_local_steps_with_the_trainers_arguments():
  """make_tx passes seed/skip/min_size to every compressor; local steps' float exchange takes them."""
  c = _config(compressor="local_steps", compressor_kwargs=ml_collections.ConfigDict({"k": 2}),
              min_size=10)
  tx = optimizers.make_tx(c, axis_name=None)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  upd, state = tx.update({"w": jnp.ones(3)}, state, params)
  np.testing.assert_array_equal(upd["w"], 0.0)  # first of two local steps: no update
  upd, state = tx.update({"w": jnp.ones(3)}, state, params)
  assert float(jnp.abs(upd["w"]).max()) > 0
  with pytest.raises(TypeError, match="compressor"):
    jaxcomp.local_steps(optax.sgd(0.1), k=2, fraction=0.1)
