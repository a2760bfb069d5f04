"""Fast, explicit randomness for stochastic quantizers.

Stochastic quantizers (TernGrad, QSGD, stochastic 3-value) draw one uniform
number per gradient element, so on a CPU they are bound by random-number
generation. A counter-based integer hash of ``(seed, element index)``
produces uniforms several times faster than JAX's default threefry generator
(``docs/benchmarks.md``). Both are available:

* ``"hash"`` (default): a counter-based hash of the element index ``k``,
  keyed by a 64-bit seed ``(s0, s1)`` drawn from a regular JAX PRNG key (so a
  run is still a pure function of its seed, and every step, worker and tensor
  gets its own key, see :func:`leaf_key`)::

      x = (k ^ s0) * 0x9E3779B9
      x = (x ^ x >> 15) * (s1 | 1)        # a key-dependent odd multiplier
      x = (x ^ x >> 13) * 0x85EBCA6B
      x =  x ^ x >> 16                    # MurmurHash3's fmix32 shape

  and the top 24 bits of ``x`` are the random number. Three multiplies and
  shifts, in a form XLA:CPU vectorizes well (better than two chained
  ``fmix32`` rounds keyed by addition).
* ``"threefry"``: ``jax.random.uniform`` with the key as given.

The hash generator is not cryptographic. Its purpose is unbiased stochastic
rounding; ``tests/test_rng.py`` checks uniformity, independence between
neighbouring indices and between seeds, and the unbiasedness of the quantizers
that use it.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

RngImpl = Literal["hash", "threefry"]
RNG_IMPLS = ("hash", "threefry")

_M1 = 0x85EBCA6B
_GOLDEN = 0x9E3779B9


def check_impl(impl: str) -> None:
  if impl not in RNG_IMPLS:
    raise ValueError(f"Unknown rng implementation {impl!r}; expected one of {RNG_IMPLS}.")


def uniform(key: jax.Array, n: int, impl: RngImpl = "hash") -> jax.Array:
  """Returns ``n`` float32 uniforms in ``[0, 1)`` drawn from ``key``.

  Args:
    key: a JAX PRNG key (typed or raw uint32[2]).
    n: how many numbers (static).
    impl: ``"hash"`` (fast counter-based hash) or ``"threefry"``.

  Returns:
    A float32 vector of shape ``(n,)``. With ``"hash"`` the numbers have 24
    random bits (multiples of 2**-24), enough for unbiased stochastic rounding.
  """
  check_impl(impl)
  if impl == "threefry":
    return jax.random.uniform(key, (n,), dtype=jnp.float32)
  return hash_to_uniform(_hash_bits24(key, n))


def hash_to_uniform(bits24: jax.Array) -> jax.Array:
  """The float32 uniforms on ``[0, 1)`` of the hash's 24-bit values (multiples of ``2**-24``)."""
  return bits24.astype(jnp.float32) * jnp.float32(2.0**-24)


def hash_seed(key: jax.Array) -> jax.Array:
  """The hash generator's 64-bit seed ``(s0, s1)`` of ``key``: ``uint32[2]``."""
  return jax.random.bits(key, (2,), dtype=jnp.uint32)


def hash_seeds(keys) -> jax.Array:
  """:func:`hash_seed` of every key of a list (or stacked array) at once: ``uint32[k, 2]``."""
  return jax.vmap(hash_seed)(jnp.stack(list(keys)) if isinstance(keys, (list, tuple)) else keys)


def _hash_bits24(key: jax.Array, n: int) -> jax.Array:
  """``n`` int32 values uniform on ``[0, 2**24)`` from the counter-based hash."""
  seed = hash_seed(key)
  return hash_bits24_at(lax.iota(jnp.uint32, n), seed[0], seed[1])


def hash_bits24_at(k: jax.Array, s0: jax.Array, s1: jax.Array) -> jax.Array:
  """The hash's int32 value on ``[0, 2**24)`` of element index ``k`` under the seed ``(s0, s1)``.

  Elementwise over ``uint32`` arrays of one shape (or scalars): a bucket of
  tensors draws each tensor's numbers as the tensor would alone by passing
  every value's index within its tensor and that tensor's seed
  (:mod:`jaxcomp.exchange.layout`).
  """
  x = (k ^ s0) * jnp.uint32(_GOLDEN)
  x = (x ^ (x >> 15)) * (s1 | jnp.uint32(1))
  x = (x ^ (x >> 13)) * jnp.uint32(_M1)
  x = x ^ (x >> 16)
  return (x >> 8).astype(jnp.int32)


def bernoulli_threshold(prob: jax.Array) -> jax.Array:
  """``floor(prob · 2**24)`` as int32: :func:`bernoulli` draws ``bits24 < threshold`` (see there)."""
  return (prob * jnp.float32(2.0**24)).astype(jnp.int32)


def bernoulli(key: jax.Array, prob: jax.Array, impl: RngImpl = "hash") -> jax.Array:
  """Independent draws ``b_k ~ Bernoulli(prob_k)`` for a float vector ``prob`` in [0, 1].

  With ``"hash"`` the comparison stays in integers: ``bits24 < floor(prob * 2**24)``,
  so ``P(b_k) = floor(prob_k * 2**24) / 2**24``, within ``2**-24`` below ``prob_k``
  (and exactly 1 for ``prob_k = 1``); this skips an int-to-float conversion per
  element, the costliest part of :func:`uniform` on a CPU.
  """
  check_impl(impl)
  n = prob.shape[0]
  if impl == "threefry":
    return jax.random.uniform(key, (n,), dtype=jnp.float32) < prob
  return _hash_bits24(key, n) < bernoulli_threshold(prob)


def leaf_key(step_key: jax.Array, leaf_index: int, worker_index) -> jax.Array:
  """The key of one tensor on one worker at one step.

  Folding in the tensor's position and the worker's ``lax.axis_index`` makes
  every tensor on every worker draw independently: no two workers, tensors
  or steps share a stream of random numbers.
  """
  return jax.random.fold_in(jax.random.fold_in(step_key, leaf_index), worker_index)


def leaf_keys(step_key: jax.Array, leaf_indices, worker_index) -> jax.Array:
  """:func:`leaf_key` of every index of ``leaf_indices`` (static ints) at once: the keys stacked.

  One vectorized computation instead of one small one per tensor (a model has
  hundreds); the keys are the same bits as :func:`leaf_key`'s.
  """
  indices = jnp.asarray(list(leaf_indices), dtype=jnp.uint32)
  if indices.shape[0] == 0:
    return jnp.zeros((0,) + jnp.shape(step_key), jnp.asarray(step_key).dtype)
  return jax.vmap(lambda i: leaf_key(step_key, i, worker_index))(indices)
