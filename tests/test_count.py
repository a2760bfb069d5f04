"""Exact counters (jaxcomp.count.Count), and the metrics of a 1B-parameter model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp
from jaxcomp import parallel
from jaxcomp.count import Count

pytestmark = pytest.mark.accelerator


def test_traced_sum_carries_past_32_bits_under_jit():
  @jax.jit
  def total(a, b):
    return Count(3 * 2**32) + Count.of(a) + Count.of(b)

  c = total(jnp.uint32(2**32 - 1), jnp.int32(2**31 - 1))
  assert int(c) == 3 * 2**32 + (2**32 - 1) + (2**31 - 1)
  assert c == 3 * 2**32 + (2**32 - 1) + (2**31 - 1)


def test_mean_over_workers_is_exact():
  per_worker = [2**32 - 1, 2**32 - 2, 5, 2**31, 0, 2**32 - 1]  # the sum wraps uint32 several times
  static = 10**12  # the same on every worker

  def count(v):
    return Count(static) + Count(2**33).traced() + Count.of(v)

  laid = jax.vmap(count)(jnp.asarray(per_worker, jnp.uint32))
  mean = laid.mean()
  expected = static + 2**33 + sum(per_worker) / len(per_worker)
  assert mean.per == len(per_worker)
  assert mean.value() == static + 2**33 + __import__("fractions").Fraction(sum(per_worker), len(per_worker))
  assert float(mean) == expected
  np.testing.assert_array_equal(np.asarray(laid), [static + 2**33 + v for v in per_worker])
  with pytest.raises(ValueError, match="not an integer"):
    int(mean)


def test_sum_over_workers_is_exact():
  per_worker = [2**32 - 1, 7, 2**31]
  laid = jax.vmap(lambda v: Count(5) + Count.of(v))(jnp.asarray(per_worker, jnp.uint32))
  assert laid.sum().value() == 5 * len(per_worker) + sum(per_worker)  # the static part once per worker
  assert Count(5).sum() == 5 and laid[0].sum() == 5 + per_worker[0]  # no worker axis: as it is


def test_range_and_type_errors():
  with pytest.raises(OverflowError):
    Count.of(2**64)
  with pytest.raises(TypeError):
    Count.of(jnp.float32(1.0))
  assert f"{Count(2**40):,}" == f"{2**40:,}"


# -- a 1B-parameter model, traced abstractly ----------------------------------

N = 2
# 1,000,014,848 float32 parameters (4.0 GB), one tensor of 2**29 (the size that used to overflow).
SHAPES = {"w1": (2**14, 2**15), "w2": (14134, 2**15), "b": (1024,)}
ELEMENTS = sum(math.prod(s) for s in SHAPES.values())


def _abstract_run(tx):
  """The metrics after init and after one update over N workers, under jax.eval_shape (nothing is allocated)."""
  params = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in SHAPES.items()}
  grads = {k: jax.ShapeDtypeStruct((N,) + s, jnp.float32) for k, s in SHAPES.items()}

  def run(params, grads):
    state = parallel.replicate_workers(tx.init(params), N)
    axes = parallel.worker_axes(state)
    update = jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w")
    return jaxcomp.metrics(state), jaxcomp.metrics(update(grads, state)[1])

  return jax.eval_shape(run, params, grads)


def test_terngrad_on_a_billion_parameters():
  assert ELEMENTS > 10**9 and 4 * ELEMENTS > 2**31
  before, after = _abstract_run(jaxcomp.terngrad(axis_name="w"))
  # Per tensor: 2-bit codes, the float32 scale, the agreed scale (pmax), one non-finite flag.
  wire = sum(math.ceil(math.prod(s) / 4) + 4 + 4 + 1 for s in SHAPES.values())
  for m in (before, after):
    assert m["float32_bytes"].is_static and int(m["float32_bytes"]) == 4 * ELEMENTS
    assert m["bytes_on_wire"].is_static and int(m["bytes_on_wire"]) == wire


def test_float_baseline_on_a_billion_parameters():
  _, m = _abstract_run(jaxcomp.compress(None, axis_name="w"))
  assert int(m["bytes_on_wire"]) == int(m["float32_bytes"]) == 4 * ELEMENTS


def test_variable_length_counts_are_wide_on_a_billion_parameters():
  """3LC's zero-run size is only known when the step runs: it is carried in two uint32 words."""
  _, m = _abstract_run(jaxcomp.threelc(axis_name="w"))
  assert int(m["bytes_on_wire"]) == sum(math.ceil(math.prod(s) / 5) + 4 + 1 for s in SHAPES.values())
  enc = m["encoded_bytes"]
  assert not enc.is_static and enc.hi.dtype == enc.lo.dtype == jnp.uint32
  assert enc.static == len(SHAPES)  # the non-finite flags; the run-coded bytes are traced
