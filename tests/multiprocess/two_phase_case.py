"""The two-phase exchange case shared by tests/test_two_phase.py and two_phase_worker.py."""

import jax

from jaxcomp.exchange import two_phase as tp
from jaxcomp.compressors.terngrad import TernGrad
from jaxcomp.compressors.threelc import ThreeLC

COMPRESSORS = {"terngrad": TernGrad(), "threelc": ThreeLC(), "threelc_zero_run": ThreeLC(capacity=0.5)}


def inputs(n_workers):
  """Every worker's tensor, key and shard residual, with a leading worker axis."""
  xs = jax.random.normal(jax.random.PRNGKey(0), (n_workers, 37, 11))
  keys = jax.random.split(jax.random.PRNGKey(1), n_workers)
  r = jax.random.normal(jax.random.PRNGKey(2), (n_workers, 37, 11)) * 0.01
  return xs, keys, r


def worker(comp, axis):
  def f(x, k, res):
    out = tp.two_phase_exchange(comp, x, k, axis, res, need_own=True)
    return out.mean, out.own, out.shard_residual
  return f


def transform(axis):
  """A compressor transform with the two-phase exchange; 3LC's error feedback keeps both residuals."""
  import jaxcomp  # pylint: disable=g-import-not-at-top

  return jaxcomp.threelc(axis_name=axis, exchange="two_phase")


def transform_grads(n_workers, step):
  return {"w": jax.random.normal(jax.random.PRNGKey(10 + step), (n_workers, 37, 11))}


TRANSFORM_STEPS = 2
