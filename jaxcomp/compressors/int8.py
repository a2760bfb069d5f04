"""8-bit integer quantization with error feedback (the "8-bit int" baseline of 3LC §4.2).

Per tensor, on every worker: ``x = g + r`` (the shared error feedback of
:func:`jaxcomp.compress`), ``scale = max|x| / 127``,
``codes = round(x / scale) ∈ [−127, 127]`` as ``int8`` (255 levels; −128 is
never produced, as in 3LC's implementation), decoded as ``codes · scale``;
the residual keeps ``x − codes · scale`` (``|·| <= scale/2`` per element).

The wire: ``int8[n]`` codes plus the float32 scale, ``n + 4`` bytes.

Decisions (tested in ``tests/test_quantizers.py``):

* deterministic rounding, half to even (``jnp.round``); ``x / scale`` is
  computed as ``x · (127 / max|x|)`` and clipped to ±127, so float rounding
  can never produce −128;
* a tensor of zeros has ``scale = 0`` and decodes to zeros;
* no cross-worker agreement: each worker sends its own scale.

References:
  Lim, Andersen, Kaminsky. *3LC: Lightweight and Effective Traffic
  Compression for Distributed Machine Learning*. MLSys 2019 (arXiv:1802.07389), §4.2 ("8-bit
  int is 8-bit quantization with error accumulation ... 255 distinct values,
  [−127, 127], leaving −128 unused"). Error accumulation: Seide et al.,
  *1-bit stochastic gradient descent ...*, INTERSPEECH 2014.
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
from jaxcomp.compressors._quant import safe_reciprocal

LEVELS = 127


class Int8Payload(NamedTuple):
  codes: jax.Array  # int8[n] in [-127, 127]
  scale: jax.Array  # float32[]: max|x| / 127


@dataclasses.dataclass(frozen=True)
class Int8(core.BucketCompressor):
  """The 8-bit int baseline (see the module docstring); a bucket is quantized at once (``bucket_encode``)."""

  error_feedback = True

  def payload_struct(self, n):
    return Int8Payload(codes=jax.ShapeDtypeStruct((n,), jnp.int8), scale=jax.ShapeDtypeStruct((), jnp.float32))

  def encode_bucket(self, xs, keys, agreed, layout):
    del keys, agreed
    x = layout.joined_input(xs)  # one plane: the tensors end to end
    tops = layout.input_max_abs(xs)  # every tensor's max|x| (zero padding: max|x| >= 0)
    q = jnp.clip(jnp.round(x[0] * layout.per_chunk(LEVELS * safe_reciprocal(tops))), -LEVELS, LEVELS)
    return Int8Payload(codes=layout.compact(q.astype(jnp.int8)), scale=(tops / LEVELS).astype(jnp.float32))

  def decode_planes(self, payload, layout):
    return [layout.expand(payload.codes).astype(jnp.float32) * layout.per_chunk(payload.scale)]


@hyperparams.factory()
def int8(**kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """The 3LC §4.2 "8-bit int" baseline as an optax transform.

  Args:
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: on by
      default).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(Int8(), **kwargs)
