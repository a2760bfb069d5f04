"""Stochastic 3-value quantization on the base-3^5 wire ("Stoch 3-value b-3-5", 3LC §4.2).

3LC's baseline: "a stochastic version of 3-value quantization similar to that
of TernGrad (Wen et al., 2017) without gradient clipping, and our base-3^5
encoding for 1.6-bit quantization". Per tensor, on every worker:

1. ``s = max|g|`` (TernGrad Eq. 2 with no clipping);
2. ``codes = sign(g) ∘ b``, ``b_k ~ Bernoulli(|g_k| / s)`` (TernGrad Eq. 1, 3),
   so ``E[s · codes] = g``: unbiased;
3. the wire: base-3^5 bytes, five codes per byte (3LC §3.2,
   :mod:`jaxcomp.codecs.base243`), plus the float32 ``s``: ``ceil(n/5) + 4``
   bytes.

The quantizer is TernGrad's own (:meth:`~jaxcomp.compressors.terngrad.TernGrad.ternary_codes`
and its scale, inherited here,
with clipping fixed off); only the wire differs.

Decisions (tested in ``tests/test_quantizers.py``):

* Scalar sharing (TernGrad Eq. 4) is **off** by default: 3LC is a
  point-to-point design with no coordination between workers (3LC §3), so
  each worker sends its own ``s``. ``scalar_sharing=True`` turns TernGrad's
  ``pmax`` agreement on (then the aggregate sums integer codes and scales
  once).
* No error feedback: 3LC §3.1 reports that combining error accumulation with
  stochastic 3-value quantization failed to converge, and the baseline uses
  none.
* As in TernGrad: an element with ``|g_k| = s`` is sent as ``±s``
  deterministically; a tensor of zeros decodes to zeros.

References:
  Lim, Andersen, Kaminsky. *3LC*. MLSys 2019 (arXiv:1802.07389), §3.1, §3.2,
  §4.2.
  Wen et al. *TernGrad*. NeurIPS 2017 (arXiv:1705.07878), Eq. 1–3.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.codecs import base243
from jaxcomp.compressors.terngrad import TernGrad


class StochasticTernaryPayload(NamedTuple):
  codes: jax.Array  # uint8[ceil(n/5)]: base-3^5 bytes of the ternary codes
  scale: jax.Array  # float32[]: s


@dataclasses.dataclass(frozen=True)
class StochasticTernary(TernGrad):
  """TernGrad's quantizer without clipping, on the base-3^5 wire.

  Attributes:
    scalar_sharing: agree on ``s = max_i s_i`` across workers (off: 3LC's
      point-to-point design has no agreement round).
    rng: ``"hash"`` (fast counter-based) or ``"threefry"`` uniforms.
  """

  clip_sigma: Optional[float] = dataclasses.field(default=None, init=False)
  scalar_sharing: bool = False
  rng: rng.RngImpl = "hash"


  planes = 5  # base-3^5's partitions (jaxcomp.codecs.base243)

  def payload_struct(self, n):
    return StochasticTernaryPayload(codes=jax.ShapeDtypeStruct((base243.base243_size(n),), jnp.uint8),
                                    scale=jax.ShapeDtypeStruct((), jnp.float32))

  def encode_bucket(self, xs, keys, agreed, layout):
    """TernGrad's codes over the bucket (no clipping), five to a byte (base-3^5 pads with digit 0)."""
    codes, scales = self.ternary_codes(xs, keys, agreed, layout)
    digits = jnp.where(layout.valid(), codes, 0)
    return StochasticTernaryPayload(codes=layout.compact(base243.pack_digits(digits)), scale=scales)

  def decode_planes(self, payload, layout):
    scale = layout.per_chunk(payload.scale)
    return [t.astype(jnp.float32) * scale for t in base243.ternary_planes(layout.expand(payload.codes))]

  def aggregate_columns(self, gathered, layout):
    if not self.scalar_sharing:
      return core.BucketCompressor.aggregate_columns(self, gathered, layout)
    digits = jax.vmap(lambda c: base243.unpack_digits(layout.expand(c)).astype(jnp.int8) - jnp.int8(1))
    total = core.sum_leading(digits(gathered.codes))
    return total.astype(jnp.float32) * layout.per_chunk(gathered.scale[0] / gathered.scale.shape[0])


@hyperparams.factory()
def stochastic_ternary(
    *, scalar_sharing: bool = False, rng: rng.RngImpl = "hash", **kwargs: Any
) -> optax.GradientTransformationExtraArgs:
  """3LC's "Stoch 3-value b-3-5" baseline as an optax transform.

  Args:
    scalar_sharing: TernGrad's ``pmax`` of the scalars (off by default).
    rng: uniform generator, ``"hash"`` or ``"threefry"``.
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: off).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(StochasticTernary(scalar_sharing=scalar_sharing, rng=rng), **kwargs)
