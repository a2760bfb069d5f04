"""1-bit SGD with error feedback (Seide et al. 2014, as Dryden et al. §3.1 describe it).

Per tensor, on every worker, after the shared error feedback has added the
residual (``x = g + r``):

1. quantize: ``x ≥ 0 → 1``, ``x < 0 → 0`` (Dryden §3.1, "greater than or
   equal to zero are encoded using the value 1");
2. reconstruction values, **per column**: the mean of the non-negative entries
   and the mean of the negative entries of that column ("the means of the
   non-negative and negative updates, respectively ... column-wise over the
   weight matrix"), which minimise the squared quantization error of each
   class;
3. the wire: the bits packed eight per byte (:func:`jaxcomp.codecs.bits.pack_bits`)
   and ``float32[2, columns]`` (row 0: the non-negative means, row 1: the
   negative means);
4. error feedback (the shared mechanism of :func:`jaxcomp.compress`):
   ``r ← x − decode(own payload)``.

Decisions where the papers are brief (tested in ``tests/test_column_compressors.py``):

* **Per tensor** (``per="tensor"``): one pair of means for the whole tensor,
  as 3LC describes the design it compares ("MQE 1-bit int": "the average of
  non-negative or negative values in the input tensor", Lim et al., MLSys
  2019, §3); the wire carries ``float32[2, 1]``.
* **Column** (the papers speak of weight matrices): the column view of
  :mod:`jaxcomp.compressors._select`: a tensor of shape ``s`` is
  ``(prod(s[:-1]), s[-1])``, i.e. one column per output unit for a Dense
  kernel ``(in, out)``, per output channel for an HWIO convolution kernel
  (``(H·W·I, O)``), and a single column for vectors and scalars.
* **Empty class**: a column with no negative (or no non-negative) entries has
  that mean set to 0 (no 0/0); an all-zero tensor has all bits 1 and both
  means 0, so it decodes to zeros.
* **Negative zero**: the class is read from the sign bit, so ``-0.0`` is in
  the negative class (its bit is 0 and it counts towards the negative mean).
  Its value is 0 in either class; reading the sign bit keeps the means three
  plain reductions (see :func:`column_means`).
* **Sampling** (``sample=k``, Dryden §3.1's "slight modification"): each
  column's two means are estimated from ``k`` entries of that column drawn
  uniformly **with replacement** (an independent draw per worker, tensor and
  step); the bits still cover every entry. A class missing from the sample
  gets the mean 0, so its entries decode to 0 that step and stay in the
  residual: error feedback compensates, as the paper says. With
  ``k >= rows`` (or ``sample=None``, the default) the means are exact.
* The aggregate decodes every worker's payload and averages (each worker has
  its own reconstruction values, so codes cannot be summed before scaling);
  up to 16 workers it adds the decoded payloads one after another in one
  fused pass, without the ``(workers, ...)`` array of decoded tensors.
* Seide et al. also run AdaGrad inside the exchange; that is an optimizer
  choice, left to the optax chain that follows.

References:
  Seide, Fu, Droppo, Li, Yu. *1-Bit Stochastic Gradient Descent and its
  Application to Data-Parallel Distributed Training of Speech DNNs*.
  Interspeech 2014.
  Dryden, Moon, Jacobs, Van Essen. *Communication Quantization for
  Data-parallel Training of Deep Neural Networks*. MLHPC 2016, §3.1.
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
from jaxcomp.codecs import bits
from jaxcomp.compressors import _select


PER = ("column", "tensor")


class OneBitPayload(NamedTuple):
  bits: jax.Array  # uint8[ceil(n/8)]: 1 for x >= 0, eight per byte, C order
  means: jax.Array  # float32[2, cols]: per column, the non-negative and the negative mean


def nonnegative(x: jax.Array) -> jax.Array:
  """The class of each entry: ``True`` for ``x >= 0``, read from the sign bit (``-0.0`` is negative)."""
  return jnp.logical_not(jnp.signbit(x))


def column_means(pool: jax.Array) -> jax.Array:
  """``float32[2, cols]``: per column, the mean of the non-negative and of the negative entries of ``pool``.

  The classes are :func:`nonnegative`'s. Three plain reductions: the column
  sum, ``Σ max(x, 0)`` and the count of sign bits; the negative sum is their
  difference (its rounding error is that of the column's sums, ~1e-7 of
  ``Σ|x|``; error feedback carries it like any quantization error). Written
  with ``x >= 0`` masks, or with ``Σ min(x, 0)`` as a third sum, XLA:CPU
  fuses the reductions into one slow loop (docs/benchmarks.md). A single
  column is reduced as a flat vector, which XLA:CPU reduces faster than an
  ``(n, 1)`` array. Counts are
  summed in float32 (exact) up to 2**24 rows, in int32 beyond.
  """
  rows, cols = pool.shape
  x = pool.reshape(-1) if cols == 1 else pool
  count_dtype = jnp.float32 if rows <= 2**24 else jnp.int32
  s_all = jnp.sum(x, axis=0)
  s_pos = jnp.sum(jnp.maximum(x, 0.0), axis=0)
  n_neg = jnp.sum(jnp.signbit(x).astype(count_dtype), axis=0)
  means = jnp.stack([_select.safe_mean(s_pos, rows - n_neg), _select.safe_mean(s_all - s_pos, n_neg)])
  return means.reshape(2, cols)


@dataclasses.dataclass(frozen=True)
class OneBit(core.Compressor):
  """1-bit SGD's per-tensor compressor (see the module docstring).

  Attributes:
    sample: estimate each column's two means from this many sampled entries
      (``None``: from the whole column).
    rng: uniform generator for the sample, ``"hash"`` or ``"threefry"``.
    per: ``"column"`` (Seide et al.) or ``"tensor"`` (3LC's MQE 1-bit): what
      one pair of reconstruction values covers.
  """

  sample: Optional[int] = None
  rng: rng.RngImpl = "hash"
  per: str = "column"

  error_feedback = True

  def __post_init__(self):
    _select.check_sample(self.sample)
    rng.check_impl(self.rng)
    if self.per not in PER:
      raise ValueError(f"per must be one of {PER}, got {self.per!r}.")

  def view(self, shape) -> tuple[int, int]:
    """``(rows, cols)``: the columns that get their own pair of means."""
    rows, cols = _select.column_shape(shape)
    return (rows, cols) if self.per == "column" else (rows * cols, 1)

  def encode(self, x, key, agreed):
    del agreed
    x2 = x.reshape(self.view(x.shape))
    pool = _select.sample_rows(x2, key, self.sample, self.rng) if _select.uses_sample(self.sample, x2.shape[0]) else x2
    return OneBitPayload(bits=bits.pack_bits(nonnegative(x2)), means=column_means(pool).astype(jnp.float32))

  def decode(self, payload, shape):
    rows, cols = self.view(shape)
    b = bits.unpack_bits(payload.bits, rows * cols).reshape(rows, cols)
    return jnp.where(b, payload.means[0], payload.means[1]).reshape(shape)

  def aggregate(self, gathered, shape):
    workers = gathered.bits.shape[0]
    if workers > 16:
      return super().aggregate(gathered, shape)
    total = self.decode(jax.tree.map(lambda a: a[0], gathered), shape)
    for w in range(1, workers):
      total = total + self.decode(jax.tree.map(lambda a, w=w: a[w], gathered), shape)
    return total / workers


@hyperparams.factory(sample="the size of the sample (a shape)", per="the shape of the means")
def onebit(sample: Optional[int] = None, *, rng: rng.RngImpl = "hash", per: str = "column",
           **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """1-bit SGD (Seide et al. 2014; Dryden et al. §3.1) as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.onebit(axis_name="workers"), optax.sgd(0.01, momentum=0.9))

  Args:
    sample: estimate each column's reconstruction values from this many
      randomly sampled entries of the column (Dryden §3.1); ``None`` (default)
      uses every entry.
    rng: uniform generator for the sample, ``"hash"`` or ``"threefry"``.
    per: ``"column"`` (default; Seide et al.'s means per column) or
      ``"tensor"`` (one pair per tensor: the design 3LC §3 and §4.2 compare
      as "MQE 1-bit int").
    **kwargs: passed to :func:`jaxcomp.compress`: ``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback`` (on by
      default: 1-bit SGD needs it).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(OneBit(sample=sample, rng=rng, per=per), **kwargs)
