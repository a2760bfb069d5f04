"""signSGD with majority vote (Bernstein et al., ICML 2018 / ICLR 2019).

Every worker sends the sign of each gradient element, one bit per element;
the server (here: every worker, after the ``all_gather``) returns the sign of
the sum of the votes, ``sign(Σ_i sign(g_i))`` (Bernstein et al. 2018,
Algorithm 3, "signSGD with majority vote"). The update is ``±1`` per element
(or 0, see below): it is not rescaled, the learning rate of the optimizer that
follows sets the step.

The wire: the sign bits packed eight per byte
(:func:`jaxcomp.codecs.bits.pack_bits`), ``ceil(n/8)`` bytes, plus one
``uint8`` per tensor saying whether the worker's tensor is nonzero (see
below): ``ceil(n/8) + 1`` bytes.

Decisions (tested in ``tests/test_quantizers.py``):

* ``sign(0) = +1`` per element (one bit cannot say 0; bit 1 means
  ``g >= 0``, so ``-0.0`` also votes +1), as the QSGD paper's ``sgn``.
* A worker whose whole tensor is zero (a frozen or unused layer) abstains:
  its one-byte flag is 0 and it votes 0 everywhere. So an all-zero input gives
  an all-zero update (zeros in, zeros out, as for every compressor here), not
  ``+1``.
* Ties of the vote (an even number of voters split equally, or all abstain)
  give 0: ``sign(0) = 0`` for the aggregate.
* The majority vote is the aggregate; ``decode`` of a single payload is that
  worker's vote, so with one worker the update is ``sign(g)``.
* No error feedback (the paper uses none; turning the shared one on would
  feed back ``g − sign(g)``, which mixes units). Signum, the variant with
  each worker's momentum, is :func:`jaxcomp.signum`
  (:mod:`jaxcomp.compressors.signum`): the same wire and vote, fed with a
  worker-local momentum.

References:
  Bernstein, Wang, Azizzadenesheli, Anandkumar. *signSGD: Compressed
  Optimisation for Non-Convex Problems*. ICML 2018, Algorithm 3 (majority
  vote). Bernstein, Zhao, Azizzadenesheli, Anandkumar. *signSGD with Majority
  Vote is Communication Efficient and Fault Tolerant*. ICLR 2019.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import transforms
from jaxcomp.exchange import two_phase
from jaxcomp.codecs import bits


class SignPayload(NamedTuple):
  signs: jax.Array  # uint8[ceil(n/8)]: bit 1 <=> x >= 0, LSB first
  nonzero: jax.Array  # uint8[]: 0 if the worker's tensor is all zero (it abstains)


def sign_bits(x: jax.Array) -> jax.Array:
  """One bit per element, ``x >= 0`` (``sign(0) = +1``), packed eight per byte."""
  return bits.pack_bits(x.reshape(-1) >= 0)


def unpack_signs(packed: jax.Array, n: int) -> jax.Array:
  """``int8[n]`` of ±1 from :func:`sign_bits`."""
  return bits.unpack_uint(packed, 1, n).astype(jnp.int8) * jnp.int8(2) - jnp.int8(1)


@dataclasses.dataclass(frozen=True)
class SignSGD(core.Compressor):
  """signSGD with majority vote (see the module docstring)."""


  def encode(self, x, key, agreed):
    del key, agreed
    return SignPayload(signs=sign_bits(x), nonzero=jnp.any(x != 0).astype(jnp.uint8))

  def _votes(self, payload, n):
    return unpack_signs(payload.signs, n) * payload.nonzero.astype(jnp.int8)

  def decode(self, payload, shape):
    return self._votes(payload, core.size_of(shape)).astype(jnp.float32).reshape(shape)

  def aggregate(self, gathered, shape):
    n = core.size_of(shape)
    votes = jax.vmap(lambda p: self._votes(p, n))(gathered)
    return jnp.sign(core.sum_leading(votes)).astype(jnp.float32).reshape(shape)

  # The two-phase exchange (jaxcomp.exchange.two_phase): exact integer vote counts in
  # phase 1, their sign (ties 0) in base-3^5 in phase 2.
  def reduce_chunks(self, received, shape):
    n = core.size_of(shape)
    votes = jax.vmap(lambda p: self._votes(p, n))(received)
    return core.sum_leading(votes).astype(jnp.float32).reshape(shape)

  shard_compressor = two_phase.Ternary()


@hyperparams.factory()
def signsgd(**kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """signSGD with majority vote as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.signsgd(axis_name="workers"), optax.sgd(1e-4))

  Args:
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: off).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates are the
    majority vote in {−1, 0, +1}.
  """
  return transforms.compress(SignSGD(), **kwargs)
