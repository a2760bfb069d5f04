"""Adaptive quantization with error feedback (Dryden, Moon, Jacobs, Van Essen 2016, §3.3).

Per tensor, column by column (the column view of
:mod:`jaxcomp.compressors._select`: one column per output unit or channel, a
single column for vectors and scalars), on every worker, after the shared
error feedback has added the residual (``x = g + r``):

1. the thresholds: with ``k+`` non-negative and ``k−`` negative entries in the
   column, ``τ+`` is the ``ceil(π·k+)``-th largest non-negative entry and
   ``τ−`` the ``ceil(π·k−)``-th smallest (largest in magnitude) negative
   entry, found by selection (:func:`jaxcomp.compressors._select.kth_largest`, no sort);
2. the entries ``x ≥ τ+`` and ``x ≤ τ−`` are sent, each as a 32-bit word of
   one value bit and its row index (:mod:`jaxcomp.codecs.sparse`);
3. reconstruction values: the mean of the sent entries above ``τ+`` and the
   mean of those below ``τ−`` ("the means of the values greater than τ+ and
   less than τ−, analogously to one-bit quantization"), two float32 per column;
4. error feedback (the shared mechanism of :func:`jaxcomp.compress`).

Decisions (tested in ``tests/test_column_compressors.py``):

* **The proportion.** §3.3 says "we want to send the largest k/π of them" and
  footnote 1 that it "actually sends a proportion π of each of the
  non-negative and negative updates". With ``π = 1/64`` the literal ``k/π =
  64k`` exceeds ``k``, so the text means ``k`` divided by ``1/π``: here
  ``proportion = π`` (default 1/64) and each side of each column sends
  ``ceil(π·k±)`` entries. Rounding up means every non-empty side sends at
  least one entry (with rounding down, a column of fewer than ``1/π`` entries
  would never send anything).
* **Zeros** count in ``k+`` (the paper's non-negative class) but are never
  sent (they carry nothing), so an all-zero tensor sends nothing and decodes to
  zeros; a side with nothing sent has mean 0.
* **Sampling** (``sample=s``, §3.3 "we can also approximate the parameters we
  need by randomly sampling the data"): the thresholds come from ``s`` entries
  per column drawn uniformly with replacement (``k±`` counted in the sample,
  ``ceil(π·k±)``-th of the sample); the selection then applies them to the
  whole column. The default is ``s = 128`` (as in DR-T1's configuration):
  the paper uses sampling throughout ("Sampling is crucial for good
  performance in our adaptive quantization ... we do not ... use variants
  without sampling", §4.2). ``sample=None`` or ``s >= rows`` selects exactly
  over the whole column (a selection over every row instead of ``s``, much
  slower on long columns). The means are always those of the
  entries actually sent (one masked pass; the paper estimates them from the
  partially sorted sample only to save CPU time).
* **Fixed-size payload.** Per column, with exact thresholds, ``cap =
  min(rows, ceil(π·rows) + 1)`` word slots: ``ceil(π·k+) + ceil(π·k−) <=
  ceil(π·rows) + 1`` always, so exact selection never overflows unless values
  tie at a threshold. Sampled thresholds let through ``π`` of each side only
  on average, so with sampling the default is twice that, ``min(rows,
  ceil(2π·rows) + 1)``; more still may pass. Then, as in threshold
  quantization, every selected entry of the column has the same chance,
  ``cap/S``, to be sent: the sent ones are consecutive in row order among
  the ``S`` selected, from a rank drawn uniformly from the encode key
  (:func:`jaxcomp.compressors._select.compact_words`), so no row has a
  standing advantage (the first in row order would send the same rows at
  every overflowing step); the rest stay in the residual and are counted in
  the metric ``overflow``. Empty slots hold the word ``0xFFFFFFFF`` (no
  entry), so no counts travel; the fixed slots per column replace the paper's "special
  separator" between columns. ``bytes_on_wire = 4·cols·cap + 8·cols``. ``capacity`` (a
  fraction of the rows or a count) sets ``cap`` explicitly, e.g. 1/32 for
  sampled thresholds: one-bit's byte budget (Dryden Fig. 3: adaptive's data
  volume "closely follows one-bit").
* ``encoded_bytes`` is the exact size of the paper's variable-length stream:
  per column two float32 means, 4 bytes per sent word and one 32-bit
  separator, i.e. ``12·cols + 4·sent``.
* The per-column means differ between workers, so the aggregate scales every
  worker's words by that worker's means, then scatters all workers' values
  into one tensor (one pass, not one dense decode per worker) and averages.

References:
  Dryden, Moon, Jacobs, Van Essen. *Communication Quantization for
  Data-parallel Training of Deep Neural Networks*. MLHPC 2016, §3.3 and
  footnote 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.codecs import sparse
from jaxcomp.compressors import _select


class AdaptivePayload(NamedTuple):
  words: jax.Array  # uint32[cap, cols]: value bit (1 = above τ+) and row index; 0xFFFFFFFF = empty
  means: jax.Array  # float32[2, cols]: per column, the mean of the sent entries above τ+ and below τ−


@dataclasses.dataclass(frozen=True)
class Adaptive(core.Compressor):
  """Adaptive quantization's per-tensor compressor (see the module docstring).

  Attributes:
    proportion: ``π``, the proportion of each side of each column to send.
    sample: entries per column sampled to find the thresholds (default 128;
      ``None``: the whole column).
    rng: uniform generator for the sample.
    capacity: word slots per column, a fraction of its rows or a count
      (``None``: ``ceil(π·rows) + 1``, enough for exact thresholds, or
      ``ceil(2π·rows) + 1`` with sampled ones).
  """

  proportion: float = 1 / 64
  sample: Optional[int] = 128
  rng: rng.RngImpl = "hash"
  capacity: Optional[_select.Capacity] = None

  error_feedback = True
  metric_keys = ("overflow",)

  def __post_init__(self):
    _select.check_fraction(self.proportion, "proportion")
    _select.check_sample(self.sample)
    rng.check_impl(self.rng)
    if self.capacity is not None:
      _select.check_capacity(self.capacity)


  def slots(self, rows: int) -> int:
    """Word slots per column: ``capacity`` of the rows, else ``min(rows, ceil(m·π·rows) + 1)``.

    ``m`` is 1 for exact thresholds and 2 for sampled ones (see the module docstring).
    """
    if self.capacity is not None:
      return max(1, _select.capacity_count(self.capacity, rows))
    m = 2 if _select.uses_sample(self.sample, rows) else 1
    return min(rows, math.ceil(m * self.proportion * rows) + 1)

  def validate(self, shape, dtype):
    _select.check_word_rows(_select.column_shape(shape)[0], "adaptive quantization: a column")

  def thresholds(self, x2: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per column ``(τ+, τ−)``; ``+inf`` / ``−inf`` where a side has no entry."""
    pool = _select.sample_rows(x2, key, self.sample, self.rng) if _select.uses_sample(self.sample, x2.shape[0]) else x2
    kmax = math.ceil(self.proportion * pool.shape[0])
    nonneg = pool >= 0
    k_pos = jnp.sum(nonneg, axis=0, dtype=jnp.int32)
    k_neg = pool.shape[0] - k_pos

    def rank(k):
      return jnp.ceil(k.astype(jnp.float32) * self.proportion).astype(jnp.int32)

    tau_pos = _select.kth_largest(pool, nonneg, rank(k_pos), kmax)
    tau_neg = -_select.kth_largest(-pool, jnp.logical_not(nonneg), rank(k_neg), kmax)
    return tau_pos, tau_neg

  def encode_with_metrics(self, x, key, agreed):
    del agreed
    x2 = _select.as_columns(x)
    tau_pos, tau_neg = self.thresholds(x2, key)
    above = jnp.logical_and(x2 >= tau_pos, x2 > 0)
    below = jnp.logical_and(x2 <= tau_neg, x2 < 0)
    s = _select.compact_rows(jnp.logical_or(above, below), self.slots(x2.shape[0]), sparse.MAX_INDEX, key)
    values = s.values(x2)  # (slots, cols): the sent entries, 0 in empty slots
    sent_pos = values > 0
    sent_neg = values < 0
    # The four column sums (values and counts of each side) as one contraction
    # over the slots, which XLA:CPU runs faster than four reductions (counts in
    # float32 are exact: at most 2**24 slots per column).
    sides = jnp.stack([jnp.where(sent_pos, values, 0.0), jnp.where(sent_neg, values, 0.0),
                       sent_pos.astype(jnp.float32), sent_neg.astype(jnp.float32)])
    tot = jnp.einsum("s,ksc->kc", jnp.ones((values.shape[0],), jnp.float32), sides,
                     precision=lax.Precision.HIGHEST)
    means = jnp.stack([_select.safe_mean(tot[0], tot[2]), _select.safe_mean(tot[1], tot[3])])
    return AdaptivePayload(words=_select.slot_words(x2, s), means=means), {"overflow": s.overflow}

  def encode(self, x, key, agreed):
    return self.encode_with_metrics(x, key, agreed)[0]

  def decode(self, payload, shape):
    rows, positive, _ = _select.read_words(payload.words)
    values = jnp.where(positive, payload.means[0], payload.means[1])
    return _select.scatter_columns(rows, values, _select.column_shape(shape)).reshape(shape)

  def aggregate(self, gathered, shape):
    rows, positive, _ = _select.read_words(gathered.words)  # (workers, slots, cols)
    workers, slots, cols = rows.shape
    values = jnp.where(positive, gathered.means[:, :1, :], gathered.means[:, 1:, :])
    total = _select.scatter_columns(rows.reshape(workers * slots, cols), values.reshape(workers * slots, cols),
                                    _select.column_shape(shape))
    return (total / workers).reshape(shape)

  def encoded_bytes(self, payload, shape):
    _, _, used = _select.read_words(payload.words)
    return 12 * payload.means.shape[1] + 4 * jnp.sum(used, dtype=jnp.int32)


@hyperparams.factory(proportion="the word slots per column and the selection's rank bound", sample="the size of the sample (a shape)", capacity="the number of word slots on the wire")
def adaptive(
    proportion: float = 1 / 64,
    sample: Optional[int] = 128,
    *,
    rng: rng.RngImpl = "hash",
    capacity: Optional[_select.Capacity] = None,
    **kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """Dryden et al.'s adaptive quantization (§3.3) as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.adaptive(1 / 64, sample=256, axis_name="workers"), optax.sgd(0.1))

  Args:
    proportion: ``π``, the proportion of the non-negative and of the negative
      entries of each column to send (default 1/64).
    sample: entries per column sampled to estimate the thresholds (default
      128, as the paper samples); ``None`` selects exactly over the whole column.
    rng: uniform generator for the sample, ``"hash"`` or ``"threefry"``.
    capacity: word slots per column, a fraction of its rows or a count
      (default ``ceil(π·rows) + 1`` for exact thresholds, ``ceil(2π·rows) + 1``
      for sampled ones). Entries beyond it stay in the residual and are
      counted in the metric ``overflow``.
    **kwargs: passed to :func:`jaxcomp.compress`: ``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback`` (on by
      default).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(Adaptive(proportion=proportion, sample=sample, rng=rng, capacity=capacity),
                             **kwargs)
