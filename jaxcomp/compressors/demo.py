"""DeMo: each worker's momentum, its top-k DCT components per chunk on the wire (Peng et al.).

DeMo (Peng, Quesnelle, Kingma, "DeMo: Decoupled Momentum Optimization", arXiv:2411.19870,
Alg. 1) keeps a momentum on every worker and sends only its fast components:

1. ``m ← β·m + g`` with this worker's gradient ``g`` (Alg. 1: the momentum accumulates the
   gradient itself);
2. ``q = ExtractFastComponents(m)``: every tensor cut into chunks, each chunk's orthonormal
   DCT-II, its ``k`` coefficients of largest magnitude kept (:class:`DCTTopK`);
3. ``m ← m − q``: what was sent leaves the momentum (error feedback);
4. ``Q`` = the mean over workers of the ``q`` (the coefficients and their indices are
   all-gathered), and the update is ``−lr·sign(Q)`` (the authors' implementation and
   experiments use the sign, as Signum; ``sign=False`` gives Alg. 1's ``−lr·Q``).

In jaxcomp the momentum **is the exchange's error-feedback residual** ``r``: DeMo feeds
:func:`jaxcomp.compress` (with :class:`DCTTopK` and error feedback) the input ``g + (β − 1)·r``,
so the exchange's ``x = r + g + (β − 1)·r`` is step 1's ``β·m + g`` (up to float32 rounding) and
the residual it keeps, ``x − decode(own payload)``, is step 3's ``m − q``. Skipping, the
non-finite policy (a non-finite tensor keeps its momentum), the byte count and every layout
are the exchange's own.

**The chunks** (the authors' ``TransformDCT``, and §3's 64×64 chunks of a matrix): a tensor of
two or more dimensions is a matrix ``(shape[0], rest)``, a vector or scalar a ``(1, n)`` matrix;
each side is cut into chunks of the largest divisor of its length that is ``<= chunk``
(64: a 768×3072 matrix in 64×64 chunks, a side of prime length 127 in chunks of 1), and each
chunk gets the separable 2-D DCT-II ``D_r·X·D_cᵀ`` with the orthonormal matrices
``D[u, i] = sqrt(2/n)·c_u·cos(π(2i + 1)u / 2n)``, ``c_0 = 1/√2``, ``c_u = 1`` (scipy's
``dct(norm="ortho")``), as a matrix product.

**The wire** per tensor: ``min(k, chunk size)`` values (float32) and their indices inside the
chunk (``uint16``; ``uint32`` for chunks over 65,536 values) for every chunk: ``6`` bytes a
kept coefficient with the defaults. The authors' code sends the values in the parameters'
dtype and int64 indices; the bytes here are what these arrays hand to the all-gather.

Decisions (tested in ``tests/test_demo.py``):

* **Defaults** are the authors' implementation's (``demo.py``: ``compression_decay=0.999``,
  ``compression_topk=32``, ``compression_chunk=64``): ``β = 0.999``, ``k = 32``, chunk 64.
* **Ties** in the top-k go to the lower index (``lax.top_k``); an all-zero chunk sends ``k``
  zeros, which decode to nothing.
* **The mean** ``Q`` is taken over the coefficients (every worker's sparse coefficients added,
  divided by ``N``, one inverse DCT), equal to the mean of the decoded ``q`` by linearity. The
  authors' code averages each coefficient over the workers that sent it
  (``scatter_reduce(..., "mean", include_self=False)``): a positive factor per coefficient, so
  with the sign the update is the same; ``sign=False`` differs there.
* **The momentum** is Alg. 1's ``β·m + g``; the authors' code adds ``lr·g``, which for a constant
  learning rate scales every term alike (the same top-k, the same signs).
* **The sign** of an exactly zero ``Q`` entry is 0 (``jnp.sign``).
* The learning rate is applied after: :func:`demo` chains ``optax.scale_by_learning_rate``;
  from a config (``config.compressor = "demo"``) the config's optimizer must only scale
  (``optimizer="sgd"``), as for 1-bit Adam.

References:
  Peng, Quesnelle, Kingma. *DeMo: Decoupled Momentum Optimization*. arXiv:2411.19870, Alg. 1
  (momentum, ExtractFastComponents, momentum subtraction, synchronisation), §3 (chunked DCT,
  top-k); the authors' code, ``demo.py`` (defaults, the sign of the synchronised update).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp import transforms
from jaxcomp.compressors import _direction

DECAY, TOPK, CHUNK = 0.999, 32, 64


def dct_matrix(n: int) -> np.ndarray:
  """The orthonormal DCT-II matrix of size ``n`` (float64): ``D[u, i] = sqrt(2/n)·c_u·cos(π(2i+1)u/2n)``."""
  u, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
  d = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * u / (2 * n))
  d[0] /= np.sqrt(2.0)
  return d


def chunk_side(length: int, chunk: int) -> int:
  """The largest divisor of ``length`` that is ``<= chunk`` (1 for an empty side)."""
  return max((d for d in range(1, min(length, chunk) + 1) if length % d == 0), default=1)


class Chunks(NamedTuple):
  """How a tensor is cut: a ``(rows, cols)`` matrix in chunks of ``(cr, cc)``."""

  rows: int
  cols: int
  cr: int
  cc: int

  @classmethod
  def of(cls, shape: tuple[int, ...], chunk: int) -> "Chunks":
    n = core.size_of(shape)
    rows = shape[0] if len(shape) >= 2 and shape[0] else 1
    cols = n // rows
    return cls(rows, cols, chunk_side(rows, chunk), chunk_side(cols, chunk))

  @property
  def count(self) -> int:
    return (self.rows // self.cr) * (self.cols // self.cc)

  @property
  def size(self) -> int:
    return self.cr * self.cc

  def matrices(self) -> tuple[jax.Array, jax.Array]:
    return jnp.asarray(dct_matrix(self.cr), jnp.float32), jnp.asarray(dct_matrix(self.cc), jnp.float32)


_HIGHEST = lax.Precision.HIGHEST  # float32 products on every backend (no TF32)


def dct(x: jax.Array, c: Chunks) -> jax.Array:
  """Every chunk's 2-D DCT-II of ``x``: ``(chunks, cr·cc)``, chunks in row-major order."""
  dr, dc = c.matrices()
  blocks = x.reshape(c.rows // c.cr, c.cr, c.cols // c.cc, c.cc).transpose(0, 2, 1, 3)
  y = jnp.einsum("ij,abjk,lk->abil", dr, blocks.astype(jnp.float32), dc, precision=_HIGHEST)
  return y.reshape(c.count, c.size)


def idct(y: jax.Array, c: Chunks, shape: tuple[int, ...]) -> jax.Array:
  """Inverse of :func:`dct` (``D_rᵀ·Y·D_c`` per chunk): float32 of ``shape``."""
  dr, dc = c.matrices()
  blocks = y.reshape(c.rows // c.cr, c.cols // c.cc, c.cr, c.cc)
  x = jnp.einsum("ji,abjk,kl->abil", dr, blocks, dc, precision=_HIGHEST)
  return x.transpose(0, 2, 1, 3).reshape(shape)


class DCTPayload(NamedTuple):
  values: jax.Array  # float32[chunks, k]: each chunk's k DCT coefficients of largest magnitude
  indices: jax.Array  # uint16[chunks, k] (uint32 for chunks over 65,536 values): their places in the chunk


@dataclasses.dataclass(frozen=True)
class DCTTopK(core.Compressor):
  """DeMo's ExtractFastComponents: per chunk, the ``k`` largest DCT-II coefficients (module docstring).

  Attributes:
    k: coefficients kept per chunk (at most the chunk's size).
    chunk: the longest side of a chunk.
  """

  k: int = TOPK
  chunk: int = CHUNK

  error_feedback = True

  def __post_init__(self):
    for name in ("k", "chunk"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1; got {value!r}.")

  def encode(self, x, key, agreed):
    del key, agreed
    c = Chunks.of(x.shape, self.chunk)
    y = dct(x.reshape(-1), c)
    _, idx = lax.top_k(jnp.abs(y), min(self.k, c.size))
    dtype = jnp.uint16 if c.size <= 2**16 else jnp.uint32
    return DCTPayload(values=jnp.take_along_axis(y, idx, axis=1), indices=idx.astype(dtype))

  def coefficients(self, payload: DCTPayload, c: Chunks) -> jax.Array:
    """The chunks' coefficients a payload holds (zeros elsewhere); a leading worker axis is summed."""
    values, idx = payload.values, payload.indices.astype(jnp.int32)
    if values.ndim == 2:  # one payload: a worker axis of 1
      values, idx = values[None], idx[None]
    rows = jnp.arange(c.count)[None, :, None]
    return jnp.zeros((c.count, c.size), jnp.float32).at[rows, idx].add(values)

  def decode(self, payload, shape):
    c = Chunks.of(shape, self.chunk)
    return idct(self.coefficients(payload, c), c, shape)

  def aggregate(self, gathered, shape):
    c = Chunks.of(shape, self.chunk)
    return idct(self.coefficients(gathered, c) / gathered.values.shape[0], c, shape)


class DeMoState(NamedTuple):
  """State of :func:`scale_by_demo`."""

  exchange: transforms.CompressState  # its error-feedback residual is each worker's momentum


def scale_by_demo(
    decay: float = DECAY,
    k: int = TOPK,
    chunk: int = CHUNK,
    *,
    sign: bool = True,
    axis_name: parallel.AxisName = None,
    **compress_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """DeMo's momentum, exchange and direction: updates are ``sign(Q)`` (or ``Q``), no learning rate.

  Args:
    decay: the momentum's ``β``, in ``[0, 1)``.
    k: DCT coefficients sent per chunk.
    chunk: the longest side of a chunk.
    sign: the update is the sign of the synchronised ``Q`` (the authors' main variant); else ``Q``.
    axis_name: the named worker axis (see :func:`jaxcomp.compress`).
    **compress_kwargs: :func:`jaxcomp.compress`'s ``skip``, ``min_size`` (those tensors are
      averaged in float, without momentum), ``seed``, ``nonfinite``, ``bucket_bytes``, ``within``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with a :class:`DeMoState`.
  """
  hyperparams.check_number(decay, "decay", lambda v: 0.0 <= v < 1.0, "a number in [0, 1)")
  if compress_kwargs.pop("error_feedback", True) is not True:
    raise ValueError("DeMo's momentum is the exchange's error feedback: error_feedback cannot be False.")
  ex = transforms.compress(DCTTopK(k=k, chunk=chunk), axis_name=axis_name, error_feedback=True,
                           **compress_kwargs)

  def init_fn(params):
    return DeMoState(exchange=ex.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    del params, extra_args
    leaves, treedef = jax.tree.flatten(updates)
    momenta = treedef.flatten_up_to(state.exchange.local.residual)
    inputs = [g.astype(jnp.float32) if isinstance(m, optax.MaskedNode) else  # kept in float: no momentum
              g.astype(jnp.float32) + (jnp.asarray(decay, jnp.float32) - 1.0) * m
              for g, m in zip(leaves, momenta)]
    mean, ex_state = ex.update(treedef.unflatten(inputs), state.exchange)
    out = [(jnp.sign(q) if sign else q).astype(g.dtype) for q, g in zip(treedef.flatten_up_to(mean), leaves)]
    return treedef.unflatten(out), DeMoState(exchange=ex_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


@hyperparams.factory(k="the coefficients per chunk (a payload's shape)", chunk="the chunks (a payload's shape)",
                     sign="the update's form")
def demo(
    learning_rate: optax.ScalarOrSchedule,
    decay: float = DECAY,
    k: int = TOPK,
    chunk: int = CHUNK,
    *,
    sign: bool = True,
    axis_name: parallel.AxisName = None,
    **compress_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """DeMo (arXiv:2411.19870, Alg. 1) as an optax optimizer; it averages over ``axis_name`` itself.

  Example::

    tx = jaxcomp.demo(1e-3, axis_name="workers")
    # inside vmap/pmap/shard_map over "workers": no pmean, no other optimizer
    updates, opt_state = tx.update(grads, opt_state, params)

  Args:
    learning_rate: a float or an optax schedule.
    decay, k, chunk, sign, axis_name, **compress_kwargs: see :func:`scale_by_demo`.

  Returns:
    ``optax.chain(scale_by_demo(...), optax.scale_by_learning_rate(learning_rate))``.
  """
  return optax.with_extra_args_support(optax.chain(
      scale_by_demo(decay, k, chunk, sign=sign, axis_name=axis_name, **compress_kwargs),
      optax.scale_by_learning_rate(learning_rate),
  ))


def wrap_optimizer(optimizer: optax.GradientTransformation, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """DeMo from a config (``jaxcomp.compressors.WRAPPERS["demo"]``): ``optimizer`` scales its direction.

  ``jaxcomp.make_optimizer("demo", optax.sgd(schedule), axis_name=...)`` is
  ``optax.chain(scale_by_demo(...), optax.sgd(schedule))``; an optimizer with moments is refused.

  Args:
    optimizer: an optimizer that only scales (``optax.sgd(learning_rate)``).
    **kwargs: :func:`scale_by_demo`'s arguments.
  """
  return _direction.optimizer_after(scale_by_demo(**kwargs), optimizer, "demo")

