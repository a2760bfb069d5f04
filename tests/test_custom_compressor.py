"""The minimal compressor of docs/compressors.md ("Write your own compressor") runs as written."""

import dataclasses
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp
from jaxcomp import parallel

pytestmark = pytest.mark.accelerator

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "compressors.md"


def _example() -> str:
  section = DOC.read_text().split("## Write your own compressor", 1)[1].split("\n## ", 1)[0]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _namespace() -> dict:
  ns: dict = {}
  exec(compile(_example(), str(DOC), "exec"), ns)  # pylint: disable=exec-used
  return ns


def test_example_is_short():
  lines = [line for line in _example().splitlines() if line.strip()]
  assert len(lines) <= 30, len(lines)


def test_example_round_trip_and_wire():
  ns = _namespace()
  comp = ns["ScaledSign"]()
  x = jnp.array([[0.5, -2.0, 0.0], [1.5, -0.25, 3.0]])
  y = comp.decode(comp.encode(x, jax.random.PRNGKey(0), None), x.shape)
  np.testing.assert_allclose(y, np.where(np.asarray(x) >= 0, 1.0, -1.0) * np.abs(np.asarray(x)).mean(), rtol=1e-6)
  tx = jaxcomp.compress(comp)  # one worker: quantized and dequantized locally
  out, state = tx.update(x, tx.init(x))
  np.testing.assert_allclose(out, y)
  assert int(jaxcomp.metrics(state)["bytes_on_wire"]) == math.ceil(6 / 8) + 4


def test_example_exchange_over_workers_conserves_the_gradients():
  """Under vmap: the mean of the workers' messages, and sum(means) + mean(residuals) == mean(sum(grads))."""
  ns = _namespace()
  workers, n = 4, 37
  tx = ns["tx"]  # axis_name="workers"
  state = parallel.replicate_workers(tx.init(jnp.zeros(n)), workers)
  axes = parallel.worker_axes(state)
  update = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="workers"))
  total_in, total_out = np.zeros(n), np.zeros(n)
  for t in range(5):
    g = jax.random.normal(jax.random.PRNGKey(t), (workers, n))
    out, state = update(g, state)
    total_in += np.asarray(g).mean(0)
    total_out += np.asarray(out)
  np.testing.assert_allclose(total_out + np.asarray(state.local.residual).mean(0), total_in, atol=1e-5)
  assert np.abs(np.asarray(state.local.residual)).max() > 0  # the sign did lose something
  assert int(jaxcomp.metrics(state)["bytes_on_wire"]) == math.ceil(n / 8) + 4 + 1  # + the non-finite flag


@pytest.mark.parametrize("exchange, n, expected", [
    ("all_gather", (3, 5), (3, 5)),
    ("two_phase", (400,), (400,)),
])
def test_a_decode_of_the_wrong_shape_is_named_at_trace_time(exchange, n, expected):
  """A decode that returns another shape is jaxcomp's error naming it, not optax's broadcasting error."""
  ns = _namespace()

  class Rows(ns["ScaledSign"]):
    def decode(self, payload, shape):  # the bug: a row of the right values, not the tensor's shape
      return super().decode(payload, shape).reshape(1, -1)

  tx = jaxcomp.compress(dataclasses.dataclass(frozen=True)(Rows)(), axis_name="workers", exchange=exchange)
  with pytest.raises(jaxcomp.core.DecodeShapeError) as e:  # at init already, or in the first update
    state = parallel.replicate_workers(tx.init(jnp.zeros(n)), 4)
    axes = parallel.worker_axes(state)
    jax.eval_shape(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="workers"),
                   jnp.zeros((4,) + n), state)
  assert str(e.value).startswith(f"Rows.decode(payload, shape) returned shape {(1, math.prod(expected))} "
                                 f"for a tensor of shape {expected}")
