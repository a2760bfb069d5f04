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
  return _hash_bits24(key, n).astype(jnp.float32) * jnp.float32(2.0**-24)


def _hash_bits24(key: jax.Array, n: int) -> jax.Array:
  """``n`` int32 values uniform on ``[0, 2**24)`` from the counter-based hash."""
  seed = jax.random.bits(key, (2,), dtype=jnp.uint32)
  x = (lax.iota(jnp.uint32, n) ^ seed[0]) * jnp.uint32(_GOLDEN)
  x = (x ^ (x >> 15)) * (seed[1] | jnp.uint32(1))
  x = (x ^ (x >> 13)) * jnp.uint32(_M1)
  x = x ^ (x >> 16)
  return (x >> 8).astype(jnp.int32)


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
  threshold = (prob * jnp.float32(2.0**24)).astype(jnp.int32)
  return _hash_bits24(key, n) < threshold


def leaf_key(step_key: jax.Array, leaf_index: int, worker_index) -> jax.Array:
  """The key of one tensor on one worker at one step.

  Folding in the tensor's position and the worker's ``lax.axis_index`` makes
  every tensor on every worker draw independently: no two workers, tensors
  or steps share a stream of random numbers.
  """
  return jax.random.fold_in(jax.random.fold_in(step_key, leaf_index), worker_index)
