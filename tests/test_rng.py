"""The counter-based hash generator: uniform, independent, and a correct Bernoulli.

Statistical checks with fixed keys and stated tolerances (each set far beyond
what a good generator produces: the tests pin the keys, so they are
deterministic, and a broken hash fails them by orders of magnitude).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomp import rng

pytestmark = pytest.mark.accelerator

N = 1 << 20


@pytest.mark.parametrize("impl", ["hash", "threefry"])
def test_uniform_histogram_and_moments(impl):
  for seed in range(3):
    u = np.asarray(rng.uniform(jax.random.PRNGKey(seed), N, impl))
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = np.histogram(u, bins=256, range=(0, 1))[0]
    chi2 = ((counts - N / 256) ** 2 / (N / 256)).sum()
    assert chi2 < 255 + 6 * np.sqrt(2 * 255), chi2  # 255 dof: mean 255, sd 22.6
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / N)


def test_hash_bits_balanced_and_neighbours_uncorrelated():
  bits = np.asarray(rng._hash_bits24(jax.random.PRNGKey(7), N))
  assert bits.min() >= 0 and bits.max() < 2**24
  for b in range(24):  # every bit is a fair coin
    frac = ((bits >> b) & 1).mean()
    assert abs(frac - 0.5) < 5 * 0.5 / np.sqrt(N), (b, frac)
  u = bits / 2**24
  for lag in (1, 2, 4, 8, 1024):  # counters next to each other give unrelated numbers
    r = np.corrcoef(u[:-lag], u[lag:])[0, 1]
    assert abs(r) < 5 / np.sqrt(N), (lag, r)


def test_streams_of_different_keys_are_unrelated():
  keys = [jax.random.PRNGKey(0), jax.random.fold_in(jax.random.PRNGKey(0), 1), jax.random.PRNGKey(1)]
  us = [np.asarray(rng.uniform(k, N)) for k in keys]
  for i in range(3):
    for j in range(i + 1, 3):
      assert abs(np.corrcoef(us[i], us[j])[0, 1]) < 5 / np.sqrt(N)
      assert (us[i] == us[j]).mean() < 1e-3
  # No key's stream is a shifted copy of another's (a weakness of keying by an offset).
  a, b = us[0], us[1]
  starts = np.nonzero(b[: N - 16] == a[0])[0]
  assert not any(np.array_equal(b[d:d + 16], a[:16]) for d in starts)


@pytest.mark.parametrize("impl", ["hash", "threefry"])
def test_bernoulli_probabilities(impl):
  p = jnp.linspace(0.0, 1.0, 11)
  probs = jnp.repeat(p, N // 16)
  draws = np.asarray(rng.bernoulli(jax.random.PRNGKey(3), probs, impl)).reshape(11, -1)
  freq = draws.mean(1)
  sd = np.sqrt(np.asarray(p) * (1 - np.asarray(p)) / draws.shape[1])
  np.testing.assert_array_less(np.abs(freq - np.asarray(p)), 5 * sd + 1e-12)
  assert freq[0] == 0.0 and freq[-1] == 1.0  # p = 0 never, p = 1 always


def test_bad_impl():
  with pytest.raises(ValueError, match="rng"):
    rng.uniform(jax.random.PRNGKey(0), 4, "mt19937")
