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
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.codecs import twobit
from jaxcomp.compressors import _quant


class TernGradPayload(NamedTuple):
  codes: jax.Array  # uint8[ceil(n/4)]: 2-bit ternary codes, four per byte
  scale: jax.Array  # float32[]: the (shared) scalar s


def _moments(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(σ, max|x|)`` of a flat tensor: the population std (two-pass, stable) and the max.

  The sum of squared deviations is a dot product, which XLA:CPU runs at memory
  speed (``jnp.std`` is the plain form). ``max|x|`` is ``max(max x, -min x)``:
  ``max(abs(x))`` writes ``|x|`` to memory before reducing it on XLA:CPU.
  """
  if x.size == 0:
    return jnp.float32(0.0), jnp.float32(0.0)
  d = x - jnp.mean(x)
  return jnp.sqrt(jnp.dot(d, d) / float(x.size)), jnp.maximum(jnp.max(x), -jnp.min(x))  # float: any size


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
  of the bucket's layout (:mod:`jaxcomp.layout`: four planes, the 2-bit
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

  def _bound_and_scale(self, flat: jax.Array) -> tuple[jax.Array, jax.Array]:
    # max|clip(x, -b, b)| = min(max|x|, b): Eq. 2 on the clipped tensor, same pass.
    sigma, amax = _moments(flat)
    bound = _clip_bound(sigma, self.clip_sigma)
    return bound, jnp.minimum(amax, bound)

  def _local_scale(self, x: jax.Array) -> jax.Array:
    return self._bound_and_scale(x.reshape(-1))[1]

  def agree(self, x):
    return self._local_scale(x) if self.scalar_sharing else None

  def payload_struct(self, n):
    return TernGradPayload(codes=jax.ShapeDtypeStruct((twobit.packed_2bit_size(n),), jnp.uint8),
                           scale=jax.ShapeDtypeStruct((), jnp.float32))

  def encode_bucket(self, xs, keys, agreed, layout):
    """Eq. 1, 3 over the bucket: ``sign(x)·b``, ``b ~ Bernoulli(min(|x|, bound)/s)``, packed 2-bit."""
    codes, scales = self.ternary_codes(xs, keys, agreed, layout)
    return TernGradPayload(codes=layout.compact(twobit.pack_planes(codes)), scale=scales)

  def ternary_codes(self, xs, keys, agreed, layout) -> tuple[jax.Array, jax.Array]:
    """The codes ``t + 1`` of a bucket's tensors in ``layout`` (uint8; a padded zero draws 1) and their scalars.

    The moments are reduced per tensor; what follows from them (Eq. 21's bound,
    Eq. 2's scalar, its reciprocal) is computed for all tensors at once, on
    vectors of one value a tensor (the same IEEE operations as on scalars).
    """
    moments = [_moments(flat) for flat in xs]
    bounds = _clip_bound(jnp.stack([m[0] for m in moments]), self.clip_sigma)
    scales = jnp.minimum(jnp.stack([m[1] for m in moments]), bounds) if agreed is None else agreed
    scales = scales.astype(jnp.float32)
    x = layout.join(xs)  # padded with zeros: a zero draws code 0, the packing's own padding
    mag = jnp.minimum(jnp.abs(x), layout.per_chunk(bounds))
    prob = mag * layout.per_chunk(_quant.safe_reciprocal(scales))
    if self.rng == "hash":
      seeds = rng.hash_seeds(keys)
      bits = rng.hash_bits24_at(layout.index(), layout.per_chunk(seeds[:, 0]), layout.per_chunk(seeds[:, 1]))
      keep = bits < rng.bernoulli_threshold(prob)
    else:  # threefry: each tensor's own uniforms, laid out as the values
      keep = layout.join([rng.uniform(k, n, self.rng) for k, n in zip(keys, layout.sizes)], fill=1.0) < prob
    return jnp.where(keep, jnp.where(x > 0, 2, 0), 1).astype(jnp.uint8), scales  # t + 1

  def decode_columns(self, payload, layout):
    codes = twobit.unpack_planes(layout.expand(payload.codes))  # t + 1
    return (codes.astype(jnp.float32) - 1.0) * layout.per_chunk(payload.scale)

  def aggregate_columns(self, gathered, layout):
    if not self.scalar_sharing:
      return super().aggregate_columns(gathered, layout)
    workers = gathered.scale.shape[0]
    # The codes are summed on the packed bytes, LANE_WORKERS workers at a time
    # (integer sums: exact in any order). The plain form unpacks every worker:
    # core.sum_leading(jax.vmap(lambda c: twobit.unpack_planes(layout.expand(c)))(gathered.codes)).
    codes = 0
    for lo in range(0, workers, twobit.LANE_WORKERS):
      lanes = layout.expand(core.sum_leading(twobit.spread_lanes(gathered.codes[lo:lo + twobit.LANE_WORKERS])))
      codes = codes + twobit.lane_planes(lanes)
    total = codes - workers  # int32: the sum of t over workers
    return total.astype(jnp.float32) * layout.per_chunk(gathered.scale[0] / workers)


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
