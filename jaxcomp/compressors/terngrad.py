"""TernGrad: stochastic ternary gradients (Wen et al., NeurIPS 2017).

Per tensor (layer-wise ternarizing, §3.3: weights and biases each get their own
scalar), on every worker ``i``:

1. gradient clipping (Eq. 21): ``f(g) = clip(g, -cσ, cσ)`` with ``σ`` the
   standard deviation of the tensor's elements (population std, i.e. after
   subtracting their mean) and ``c = clip_sigma`` (default 2.5, §3.3);
2. the local scalar (Eq. 2): ``s_i = max(|f(g)|)``;
3. scalar sharing (Eq. 4): ``s = max_i s_i``, agreed by :mod:`jaxcomp.parallel`
   with ``lax.pmax`` before encoding;
4. stochastic ternarization (Eq. 1, 3): ``g~ = s · sign(f(g)) ∘ b`` with
   ``b_k ~ Bernoulli(|f(g)_k| / s)``, so ``E[g~] = f(g)`` (Eq. 10);
5. the wire: codes in {−1, 0, 1} packed four per byte (2 bits each, §3.1), plus
   the float32 scalar.

Decisions where the paper is brief (tested in ``tests/test_terngrad.py``):

* ``s`` follows the paper's Eq. 2, ``max|f(g)|``. The authors' TensorFlow code
  uses ``c·σ`` itself; the two differ only when ``max|g| < c·σ``.
* An element with ``|f(g)_k| = s`` becomes ``±s`` deterministically (its
  Bernoulli probability is 1), as in the authors' code.
* A tensor of zeros has ``s = 0`` and decodes to zeros (no 0/0).
* A tensor whose elements are all equal (``σ = 0``, e.g. a scalar) is not
  clipped, so it is sent exactly as ``±s``.
* With scalar sharing all workers use one ``s``, so the mean of N workers is
  ``s/N · Σ_i codes_i``: the aggregate sums the integer codes and scales once.
* Which tensors stay in float is the transform's ``skip``/``min_size`` (the
  paper keeps the last classification layer in float for AlexNet and
  GoogLeNet, §4.2).

References:
  Wen, Xu, Yan, Wu, Wang, Chen, Li. *TernGrad: Ternary Gradients to Reduce
  Communication in Distributed Deep Learning*. NeurIPS 2017. arXiv:1705.07878.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp.exchange import layout as layout_lib
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.codecs import twobit
from jaxcomp.compressors import _quant


class TernGradPayload(NamedTuple):
  codes: jax.Array  # uint8[ceil(n/4)]: 2-bit ternary codes, four per byte
  scale: jax.Array  # float32[]: the (shared) scalar s


def bucket_moments(x: jax.Array, layout: layout_lib.Layout) -> tuple[jax.Array, jax.Array]:
  """``(σ, max|x|)`` of every tensor of a bucket (``x``: its :meth:`~jaxcomp.exchange.layout.Layout.join`).

  ``σ`` is the population std, two-pass (stable); both are vectors with one
  value a tensor, reduced by chunk and then by tensor
  (:meth:`~jaxcomp.exchange.layout.Layout.tensor_sum`): a few kernels for the bucket,
  where a tensor's own reductions launched four (the plain form for one
  tensor is ``jnp.std(x), jnp.max(jnp.abs(x))``). Both paddings are masked
  out of the deviations (:meth:`~jaxcomp.exchange.layout.Layout.own`); ``max|x|`` is ``≥ 0`` so zero padding leaves it. An
  empty tensor has ``σ = max|x| = 0``.
  """
  n = jnp.asarray([float(max(size, 1)) for size in layout.sizes], jnp.float32)  # float: any size
  mean = layout.tensor_sum(x) / n
  d = jnp.where(layout.own(), x - layout.per_chunk(mean), 0.0)
  return jnp.sqrt(layout.tensor_sum(d * d) / n), layout.tensor_max(jnp.maximum(x, -x))


def _moments(flat: jax.Array) -> tuple[jax.Array, jax.Array]:
  """:func:`bucket_moments` of one flat tensor (the same bits as in any bucket): two scalars."""
  layout = layout_lib.Layout([flat.size], TernGrad.planes)
  sigma, amax = bucket_moments(layout.join([flat]), layout)
  return sigma[0], amax[0]


def _clip_bound(sigma: jax.Array, c: Optional[float]) -> jax.Array:
  """Eq. 21's ``c·σ``; ``inf`` (no clipping) for ``c=None`` or ``σ = 0``."""
  if c is None:
    return jnp.full(jnp.shape(sigma), jnp.inf, jnp.float32)
  return jnp.where(sigma > 0, c * sigma, jnp.inf)


def clip_by_sigma(x: jax.Array, c: Optional[float]) -> jax.Array:
  """Eq. 21: clips ``x`` to ``[-c·σ, c·σ]``, ``σ`` the std of ``x``.

  A tensor whose elements are all equal (``σ = 0``: a scalar, a constant
  gradient) is left unclipped: clipping it would erase it, which Eq. 21 does
  not intend (it assumes a spread of values around zero, §3.3).
  """
  flat = x.reshape(-1)
  bound = _clip_bound(_moments(flat)[0], c)
  return jnp.clip(x, -bound, bound)


@dataclasses.dataclass(frozen=True)
class TernGrad(core.BucketCompressor):
  """TernGrad's per-tensor compressor (see the module docstring).

  A bucket of tensors is ternarized and packed at once (``bucket_encode``):
  each tensor's ``σ``, bound and scalar are its own, spread over its columns
  of the bucket's layout (:mod:`jaxcomp.exchange.layout`: four planes, the 2-bit
  packing's), and the hash draws by each value's index within its tensor.

  Attributes:
    clip_sigma: ``c`` of Eq. 21; ``None`` turns clipping off.
    scalar_sharing: agree on ``s = max_i s_i`` across workers (Eq. 4).
    rng: ``"hash"`` (fast counter-based) or ``"threefry"`` uniforms.
  """

  clip_sigma: Optional[float] = 2.5
  scalar_sharing: bool = True
  rng: rng.RngImpl = "hash"

  unbiased = True  # unbiased w.r.t. the clipped gradient (exactly unbiased when clip_sigma=None)
  planes = 4  # the 2-bit packing's (jaxcomp.codecs.twobit)

  def __post_init__(self):
    if self.clip_sigma is not None:
      hyperparams.check_number(self.clip_sigma, "clip_sigma", lambda c: c > 0, "positive or None")
    rng.check_impl(self.rng)

  def _bounds_and_scales(self, x: jax.Array, layout: layout_lib.Layout) -> tuple[jax.Array, jax.Array]:
    """Eq. 21's bound and Eq. 2's scalar of every tensor of a bucket laid out as ``x``."""
    sigma, amax = bucket_moments(x, layout)
    bounds = _clip_bound(sigma, self.clip_sigma)
    return bounds, jnp.minimum(amax, bounds)  # max|clip(x, -b, b)| = min(max|x|, b)

  def agree(self, x):
    if not self.scalar_sharing:
      return None
    layout = layout_lib.Layout([x.size], self.planes)
    return self.agree_bucket([x.reshape(-1)], layout)[0]

  def agree_bucket(self, xs, layout):
    """Every tensor's local scalar ``max|clip(x)|`` (Eq. 2), for Eq. 4's maximum over workers."""
    if not self.scalar_sharing:
      return None
    return self._bounds_and_scales(layout.joined_input(xs), layout)[1]

  def payload_struct(self, n):
    return TernGradPayload(codes=jax.ShapeDtypeStruct((twobit.packed_2bit_size(n),), jnp.uint8),
                           scale=jax.ShapeDtypeStruct((), jnp.float32))

  def encode_bucket(self, xs, keys, agreed, layout):
    """Eq. 1, 3 over the bucket: ``sign(x)·b``, ``b ~ Bernoulli(min(|x|, bound)/s)``, packed 2-bit."""
    codes, scales = self.ternary_codes(xs, keys, agreed, layout)
    return TernGradPayload(codes=layout.compact(twobit.pack_planes(codes)), scale=scales)

  def ternary_codes(self, xs, keys, agreed, layout) -> tuple[jax.Array, jax.Array]:
    """The codes ``t + 1`` of a bucket's tensors in ``layout`` (uint8; a padded zero draws 1) and their scalars.

    The moments (:func:`bucket_moments`) and what follows from them (Eq. 21's
    bound, Eq. 2's scalar, its reciprocal) are computed for all tensors at
    once, on vectors of one value a tensor.
    """
    x = layout.joined_input(xs)  # padded with zeros: a zero draws code 0, the packing's own padding
    bounds, scales = self._bounds_and_scales(x, layout)
    scales = (scales if agreed is None else agreed).astype(jnp.float32)
    mag = jnp.minimum(jnp.abs(x), layout.per_chunk(bounds))
    prob = mag * layout.per_chunk(_quant.safe_reciprocal(scales))
    if self.rng == "hash":
      seeds = rng.hash_seeds(keys)
      bits = rng.hash_bits24_at(layout.index(), layout.per_chunk(seeds[:, 0]), layout.per_chunk(seeds[:, 1]))
      keep = bits < rng.bernoulli_threshold(prob)
    else:  # threefry: each tensor's own uniforms, laid out as the values
      keep = layout.join([rng.uniform(k, n, self.rng) for k, n in zip(keys, layout.sizes)], fill=1.0) < prob
    return jnp.where(keep, jnp.where(x > 0, 2, 0), 1).astype(jnp.uint8), scales  # t + 1

  def decode_planes(self, payload, layout):
    codes = layout.expand(payload.codes)
    scale = layout.per_chunk(payload.scale)
    return [(twobit.plane(codes, k).astype(jnp.float32) - 1.0) * scale for k in range(self.planes)]  # t + 1 → t·s

  def aggregate_columns(self, gathered, layout):
    if not self.scalar_sharing:
      return super().aggregate_columns(gathered, layout)
    workers = gathered.scale.shape[0]
    total = _sum_codes(gathered.codes, layout) - workers  # int32: the sum of t over workers
    return total.astype(jnp.float32) * layout.per_chunk(gathered.scale[0] / workers)


# Past this many groups of LANE_WORKERS workers, _sum_codes loops over them in a scan instead of
# unrolling them (a trace at 65,536 workers, as the performance model's, would unroll 516).
_UNROLLED_GROUPS = 8


def _sum_codes(codes: jax.Array, layout) -> jax.Array:
  """The workers' ``t + 1`` summed per plane (int32), from their packed bytes ``codes[workers, ...]``.

  Summed on the packed bytes, LANE_WORKERS workers at a time (integer sums: exact
  in any order). The plain form unpacks every worker, plane k being
  ``core.sum_leading(twobit.plane(jax.vmap(layout.expand)(codes), k))``.
  """
  group = lambda c: twobit.lane_planes(layout.expand(core.sum_leading(twobit.spread_lanes(c))))
  lanes = twobit.LANE_WORKERS
  scanned = codes.shape[0] // lanes * lanes if codes.shape[0] > _UNROLLED_GROUPS * lanes else 0
  total = 0
  if scanned:
    groups = codes[:scanned].reshape((scanned // lanes, lanes) + codes.shape[1:])
    zero = jnp.zeros(jax.eval_shape(group, groups[0]).shape, jnp.int32)
    total, _ = jax.lax.scan(lambda acc, c: (acc + group(c), None), zero, groups)
  for lo in range(scanned, codes.shape[0], lanes):
    total = total + group(codes[lo:lo + lanes])
  return total


@hyperparams.factory()
def terngrad(
    clip_sigma: Optional[float] = 2.5,
    *,
    scalar_sharing: bool = True,
    rng: rng.RngImpl = "hash",
    **kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """TernGrad as an optax transform.

  Example::

    tx = optax.chain(
        jaxcomp.terngrad(clip_sigma=2.5, axis_name="workers"),
        optax.sgd(0.01, momentum=0.9),
    )

  Args:
    clip_sigma: ``c`` of the gradient clipping (Eq. 21); ``None`` disables it
      (TernGrad-noclip of Table 2).
    scalar_sharing: share ``s = max_i s_i`` across workers (Eq. 4).
    rng: uniform generator, ``"hash"`` or ``"threefry"``.
    **kwargs: passed to :func:`jaxcomp.compress`: ``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback`` (off by
      default: TernGrad is unbiased and uses none).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(
      TernGrad(clip_sigma=clip_sigma, scalar_sharing=scalar_sharing, rng=rng), **kwargs
  )
