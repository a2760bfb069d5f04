"""benchmarks.overlap: its three ways of putting a psum beside compute give the same results."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import overlap


def test_each_way_sums_and_computes_the_same():
  mesh = jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  x = jnp.arange(6, dtype=jnp.float32).reshape(1, 6)
  y = jnp.asarray(np.random.default_rng(0).standard_normal((1, 8, 8)), jnp.float32) * 0.1
  want = y[0]
  for _ in range(2):
    want = jnp.tanh(want @ want) * 0.5
  ways = overlap.programs(mesh, matmuls=2)
  assert tuple(ways) == overlap.WAYS
  for way, f in ways.items():
    summed, computed = jax.tree.leaves(f(x, y))  # two_programs: each program's tuple
    np.testing.assert_allclose(summed, x, err_msg=way)  # one worker: the sum is its own values
    np.testing.assert_allclose(computed[0], want, rtol=1e-5, err_msg=way)


def test_arguments_are_checked():
  with pytest.raises(SystemExit):
    overlap.main(["--matmuls", "0"])
