"""Threshold quantization with error feedback (Strom 2015, as Dryden et al. §3.2 describe it).

Per tensor, on every worker, after the shared error feedback has added the
residual (``x = g + r``), with a threshold ``τ`` fixed in advance:

1. ``x > τ`` is sent as ``+τ`` (value bit 1), ``x < −τ`` as ``−τ`` (value bit
   0); "updates of magnitude less than τ are not sent at all";
2. each sent entry is one 32-bit word, one bit of value and 31 bits of index
   (:mod:`jaxcomp.codecs.sparse`);
3. error feedback (the shared mechanism of :func:`jaxcomp.compress`): the
   reconstruction is ``±τ``, and everything else, including what was not sent,
   stays in the residual.

The wire. A static-shape collective needs a fixed size, so the words go in
``K`` slots (``capacity``: a fraction of the tensor's entries or a count,
default 1/32: at most the bytes of 1-bit SGD's bits). Empty slots hold the
word ``0xFFFFFFFF`` (index ``2**31 − 1``, which addresses no entry), so no
count travels: ``bytes_on_wire = 4·K``. The exact variable-length size is
reported as ``encoded_bytes``: ``4·sent`` bytes of words (the message length
is the transport's, as MPI's envelope carries it), or with ``rice=True`` the
size of Strom's delta + Golomb-Rice coding of the positions that Dryden et al.
evaluate (:func:`jaxcomp.compressors._select.rice_bits`).

Decisions (tested in ``tests/test_column_compressors.py``):

* Strict inequalities, as the paper words them: ``|x| = τ`` is not sent.
* **Over capacity** (``S`` entries over ``τ``, ``K < S`` slots), every
  entry over ``τ`` has the same chance, ``K/S``, to be sent this step: the
  ``K`` sent are consecutive in index order among the ``S``, starting at a
  rank drawn uniformly from the encode key (wrapping around;
  :func:`jaxcomp.compressors._select.compact_words`, still one cumulative
  sum and no sort). Strom's rule sends every entry over ``τ``, each as the
  same ``±τ`` whatever its excess; a capacity can only scale that down, so
  over many steps each position's sends stay proportional to the number of
  steps it was over ``τ``. Taking the first in index order instead would
  send the same low indices at every step and withhold the rest for good;
  taking the largest would need a sort and, under a persistent overflow,
  starve the smaller entries over ``τ`` (their residual grows slower than
  the level the largest are held at). The others are not sent this step,
  stay in the residual (``decode(own payload)`` excludes them, so the shared
  error feedback keeps them) and are counted in the metric ``overflow``. A
  persistently overflowing tensor is the "degenerate situation where error
  feedback builds up" that Dryden §3.3 warns of: choose ``τ`` (or the
  capacity) so that ``overflow`` stays rare. (Tested in
  ``tests/test_overflow_fairness.py``.)
* ``τ`` defaults to 0.01; the paper gives none ("requires a carefully-chosen
  threshold"), it depends on the model and the learning rate.
* The aggregate scatters every worker's words into one tensor, once.

References:
  Strom. *Scalable Distributed DNN Training Using Commodity GPU Cloud
  Computing*. Interspeech 2015.
  Dryden, Moon, Jacobs, Van Essen. *Communication Quantization for
  Data-parallel Training of Deep Neural Networks*. MLHPC 2016, §3.2.
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
from jaxcomp.codecs import sparse
from jaxcomp.compressors import _select


class ThresholdPayload(NamedTuple):
  words: jax.Array  # uint32[K]: sign bit (1 = +τ) and 31-bit flat index, in index order; 0xFFFFFFFF = empty


@dataclasses.dataclass(frozen=True)
class Threshold(core.Compressor):
  """Threshold quantization's per-tensor compressor (see the module docstring).

  Attributes:
    tau: the threshold ``τ > 0``; also the reconstruction magnitude.
    capacity: word slots per tensor, a fraction of its entries or a count.
    rice: report the delta + Golomb-Rice size as ``encoded_bytes``.
  """

  tau: float = 0.01
  capacity: _select.Capacity = 1 / 32
  rice: bool = False

  error_feedback = True
  metric_keys = ("overflow",)

  def __post_init__(self):
    hyperparams.check_number(self.tau, "tau", lambda t: t > 0, "positive")
    _select.check_capacity(self.capacity)

  def validate(self, shape, dtype):
    _select.check_word_rows(core.size_of(shape), "threshold quantization: the tensor")

  def encode_with_metrics(self, x, key, agreed):
    del agreed
    x2 = x.reshape(-1, 1)
    s = _select.compact_rows(jnp.abs(x2) > self.tau, _select.capacity_count(self.capacity, x2.shape[0]),
                             sparse.MAX_INDEX, key)
    return ThresholdPayload(words=_select.slot_words(x2, s)[:, 0]), {"overflow": s.overflow}

  def encode(self, x, key, agreed):
    return self.encode_with_metrics(x, key, agreed)[0]

  def _scatter(self, words, n):
    rows, positive, _ = _select.read_words(words.reshape(-1, 1))
    return _select.scatter_columns(rows, jnp.where(positive, self.tau, -self.tau), (n, 1))[:, 0]

  def decode(self, payload, shape):
    return self._scatter(payload.words, core.size_of(shape)).reshape(shape)

  def aggregate(self, gathered, shape):
    workers = gathered.words.shape[0]
    return (self._scatter(gathered.words, core.size_of(shape)) / workers).reshape(shape)

  def encoded_bytes(self, payload, shape):
    rows, _, used = _select.read_words(payload.words)
    count = jnp.sum(used, dtype=jnp.int32)
    if self.rice:
      return (_select.rice_bits(rows, count) + 7) // 8
    return 4 * count


@hyperparams.factory(capacity="the number of word slots on the wire")
def threshold(
    tau: float = 0.01,
    capacity: _select.Capacity = 1 / 32,
    *,
    rice: bool = False,
    **kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """Strom's threshold quantization (Dryden et al. §3.2) as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.threshold(tau=0.005, axis_name="workers"), optax.sgd(0.1))

  Args:
    tau: the threshold ``τ``; entries with ``|x| > τ`` are sent as ``±τ``.
    capacity: words per tensor on the wire: a fraction of its entries
      (default 1/32) or a count. Entries beyond it stay in the residual and
      are counted in the metric ``overflow``.
    rice: report the delta + Golomb-Rice size as ``encoded_bytes`` instead of
      4 bytes per sent word.
    **kwargs: passed to :func:`jaxcomp.compress`: ``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback`` (on by
      default: threshold quantization relies on it).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(Threshold(tau=tau, capacity=capacity, rice=rice), **kwargs)
