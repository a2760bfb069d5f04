"""A 2-bit stochastic quantizer: every value becomes one of four levels {-m, -m/3, m/3, m}.

m = max|x| is one float32 scale per tensor (TernGrad's max-norm scaling: Wen et al., NeurIPS
2017, Eq. 2). A value between two neighbouring levels a < b is sent as b with probability
(x - a)/(b - a), else as a, so E[decode(encode(x))] = x: QSGD's stochastic quantization with
s levels (Alistarh et al., NeurIPS 2017, §3.1), on a uniform grid over [-m, m]. The codes
0..3 are packed four to a byte: a tensor of n values costs ceil(n/4) + 4 bytes.
"""

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

import jaxcomp


class TwoBitPayload(NamedTuple):
  codes: jax.Array  # uint8[ceil(n/4)]: four 2-bit codes a byte; code k means (2k/3 - 1)·m
  scale: jax.Array  # float32[]: m = max|x|


@dataclasses.dataclass(frozen=True)
class TwoBit(jaxcomp.core.Compressor):
  """Two bits per value and one scale; unbiased, so no error feedback is needed."""

  unbiased = True

  def encode(self, x, key, agreed):
    flat = x.reshape(-1).astype(jnp.float32)
    m = jnp.max(jnp.abs(flat))
    u = (flat / jnp.where(m > 0, m, 1.0) + 1.0) * 1.5  # in [0, 3]: level k sits at u = k
    low = jnp.clip(jnp.floor(u), 0.0, 2.0)  # the level below (u = 3 rounds up from 2)
    up = jax.random.uniform(key, u.shape) < u - low  # up with probability u - low
    codes = (low + up).astype(jnp.uint8)
    quads = jnp.pad(codes, (0, -codes.size % 4)).reshape(-1, 4)  # zero-padded to whole bytes
    packed = quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6
    return TwoBitPayload(codes=packed, scale=m)

  def decode(self, payload, shape):
    shifts = jnp.array([0, 2, 4, 6], jnp.uint8)
    codes = (payload.codes[:, None] >> shifts & 3).reshape(-1)[:math.prod(shape)]
    return ((codes * (2.0 / 3.0) - 1.0) * payload.scale).reshape(shape)


tx = jaxcomp.compress(TwoBit(), axis_name="workers")
