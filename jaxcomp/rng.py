"""Fast, explicit randomness for stochastic quantizers.

Stochastic quantizers (TernGrad, QSGD, stochastic 3-value) draw one uniform
number per gradient element, so on a CPU they are bound by random-number
generation. JAX's default threefry generator produces about 80 M uniforms/s on
the machines this project is measured on; a counter-based integer hash of
``(seed, element index)`` produces several times more (see
``docs/benchmarks.md``). Both are available:

* ``"hash"`` (default): ``u_k = fmix32(fmix32(k ^ seed0) + seed1) / 2**32``
  with MurmurHash3's 32-bit finaliser ``fmix32``. The 64-bit seed comes from a
  regular JAX PRNG key, so a run is still a pure function of its seed; every
  step, worker and tensor gets its own key (see :func:`leaf_key`).
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
_M2 = 0xC2B2AE35
_GOLDEN = 0x9E3779B9


def _fmix32(x: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection on uint32 with full avalanche."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(_M1)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(_M2)
  x = x ^ (x >> 16)
  return x


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
  seed = jax.random.bits(key, (2,), dtype=jnp.uint32)
  idx = lax.iota(jnp.uint32, n)
  h = _fmix32(_fmix32(idx * jnp.uint32(_GOLDEN) ^ seed[0]) + seed[1])
  return (h >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


def leaf_key(step_key: jax.Array, leaf_index: int, worker_index) -> jax.Array:
  """The key of one tensor on one worker at one step.

  Folding in the tensor's position and the worker's ``lax.axis_index`` makes
  every tensor on every worker draw independently (DESIGN.md, rule 3).
  """
  return jax.random.fold_in(jax.random.fold_in(step_key, leaf_index), worker_index)
