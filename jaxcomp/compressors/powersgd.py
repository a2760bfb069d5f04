"""PowerSGD: rank-r power iteration with warm start (Vogels, Karimireddy, Jaggi 2019).

Per tensor, viewed as a matrix ``M ∈ R^{n×m}``, on every worker ``w``
(Algorithm 1, "Rank-r PowerSGD compression"), with the warm-start ``Q`` of the
previous step (§3, "reuse of the previous low-rank approximation"):

1. ``P ← M_w Q``; ``P ← pmean(P)``         (now ``P = M̄ Q``, ``M̄`` the mean over workers)
2. ``P̂ ← orthogonalize(P)``                (Gram-Schmidt, orthonormal columns)
3. ``Q ← M_wᵀ P̂``; ``Q ← pmean(Q)``         (now ``Q = M̄ᵀ P̂``)
4. decompress: ``M̂ = P̂ Qᵀ = P̂ P̂ᵀ M̄``, the same on every worker;
5. error feedback (Algorithm 2, "Distributed Error-feedback SGD with
   Momentum"): ``e_w ← Δ_w − M̂``, through the shared residual of
   :func:`jaxcomp.compress`;
6. the new ``Q`` is kept for the next step in ``CompressState.inner`` (it is
   the all-reduced mean, so every worker keeps the same one).

The wire per worker and step: the float32 ``P`` (``n×r``) and ``Q`` (``m×r``),
``4·r·(n+m)`` bytes, moved by two ``pmean`` all-reduces (a custom exchange:
``custom_exchange = True``).

Decisions (tested in ``tests/test_powersgd.py``):

* **Matrix view**: the column view of :mod:`jaxcomp.compressors._select`,
  ``(prod(shape[:-1]), shape[-1])``. For a Flax Dense kernel ``(in, out)`` that
  is the kernel itself; for an HWIO convolution kernel it is
  ``(H·W·I, O)``: output channels are the columns and the receptive field the
  rows, the transpose of the authors' PyTorch view ``(O, I·H·W)`` (the same
  grouping; a rank-r approximation is the same either way round).
* **Rank**: ``r = min(rank, n, m)``.
* **Tensors that would not shrink** (``r·(n+m) >= n·m``; this covers every
  vector and scalar, viewed as ``(n, 1)``) are averaged uncompressed inside the
  exchange, with a float32 ``pmean`` (``4·n·m`` bytes on the wire, counted),
  and get a zero residual, as Algorithm 1 does for "vector-shaped parameters
  (biases)". To keep them out of the compressor entirely (counted as
  ``float_bytes``), use ``skip``/``min_size``.
* **Error feedback against the aggregate**: in PowerSGD compression and
  aggregation are one step, and the decompressed message a worker holds is the
  aggregated ``P̂ Qᵀ``; Algorithm 2's ``e_w ← Δ_w − DECOMPRESS(C(Δ_w))`` is
  therefore computed against it, as the authors' reference code does
  (``epfml/powersgd``: memory = local input − ``P̂ Qᵀ``). Conservation still
  holds per worker: the sum of what was applied plus the residual equals the
  sum of the inputs.
* **Warm start** (``warm_start=True``, the paper's default): ``Q`` is kept
  across steps and not re-orthogonalized before use (Algorithm 1 uses it as
  is). ``Q`` starts i.i.d. standard normal from the transform's seed, the same
  on every worker. ``warm_start=False`` draws a fresh Gaussian ``Q`` every
  step from a key kept in the same replicated state, so all workers draw the
  same ``Q``.
* **Degenerate columns**: Gram-Schmidt maps a column with zero norm to zero
  (no 0/0), so an all-zero tensor decodes to zeros. A column of the new ``Q``
  that is exactly zero (e.g. after an all-zero gradient) would freeze that
  rank forever under warm start (``P = M·0 = 0`` at every later step), so the
  previous step's column is kept instead; the decision uses only all-reduced
  values, so all workers take it alike.

References:
  Vogels, Karimireddy, Jaggi. *PowerSGD: Practical Low-Rank Gradient
  Compression for Distributed Optimization*. NeurIPS 2019, Algorithms 1 and 2,
  §3 (warm start).
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
from jaxcomp.compressors import _select


class PowerSGDPayload(NamedTuple):
  p: jax.Array  # float32[n, r]: this worker's M Q, before the all-reduce
  q: jax.Array  # float32[m, r]: this worker's Mᵀ P̂, before the all-reduce


class UncompressedPayload(NamedTuple):
  x: jax.Array  # float32: the tensor itself, for tensors that rank-r would not shrink


def orthogonalize(p: jax.Array) -> jax.Array:
  """Gram-Schmidt on the columns of ``p``; a column of zero norm becomes zero."""
  cols = []
  for i in range(p.shape[1]):
    v = p[:, i]
    for q in cols:
      v = v - jnp.dot(q, v) * q
    norm = jnp.linalg.norm(v)
    cols.append(jnp.where(norm > 0, v / jnp.where(norm > 0, norm, 1.0), 0.0))
  return jnp.stack(cols, axis=1)


@dataclasses.dataclass(frozen=True)
class PowerSGD(core.Compressor):
  """PowerSGD's per-tensor custom exchange (see the module docstring).

  Attributes:
    rank: the rank ``r`` of the approximation.
    warm_start: keep ``Q`` across steps (§3); else a fresh Gaussian ``Q``
      every step.
  """

  rank: int = 1
  warm_start: bool = True

  error_feedback = True
  custom_exchange = True

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"rank must be an int >= 1; got {self.rank!r}.")

  def matrix(self, shape) -> tuple[int, int, int]:
    """``(n, m, r)`` of a tensor's matrix view; ``r = 0`` means sent uncompressed."""
    n, m = _select.column_shape(shape)
    r = min(self.rank, n, m)
    return n, m, (r if r * (n + m) < n * m else 0)

  def init_state(self, shape, key):
    n, m, r = self.matrix(shape)
    if r == 0:
      return None
    if not self.warm_start:
      return key  # the replicated key the fresh Q of every step is drawn from
    return jax.random.normal(key, (m, r), jnp.float32)

  def exchange(self, x, key, axis_name, state):
    n, m, r = self.matrix(x.shape)
    if r == 0:
      mean = yield core.Message("mean", x)
      return core.Exchanged(mean=mean, own=x, payload=UncompressedPayload(x), state=None)
    mat = x.reshape(n, m)
    if self.warm_start:
      q_prev = state
    else:
      # A fresh Q, the same on every worker: drawn from the replicated state's key
      # (the per-worker `key` would differ between workers).
      draw, next_key = jax.random.split(state)
      q_prev = jax.random.normal(draw, (m, r), jnp.float32)
    p_local = mat @ q_prev
    p = orthogonalize((yield core.Message("mean", p_local)))
    q_local = mat.T @ p
    q = yield core.Message("mean", q_local)
    approx = (p @ q.T).reshape(x.shape)
    alive = jnp.sum(q * q, axis=0) > 0
    new_state = jnp.where(alive, q, q_prev) if self.warm_start else next_key
    payload = PowerSGDPayload(p=p_local, q=q_local)
    return core.Exchanged(mean=approx, own=approx, payload=payload, state=new_state)


@hyperparams.factory(rank="the shapes of the factors P and Q on the wire")
def powersgd(rank: int = 1, *, warm_start: bool = True, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """PowerSGD (Vogels et al. 2019) as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.powersgd(rank=2, axis_name="workers"), optax.sgd(0.1, momentum=0.9))

  Args:
    rank: the rank ``r`` of the low-rank approximation.
    warm_start: reuse the previous step's ``Q`` (§3; default on).
    **kwargs: passed to :func:`jaxcomp.compress`: ``axis_name``, ``skip``,
      ``min_size``, ``seed`` (also seeds the initial ``Q``), ``nonfinite``,
      ``error_feedback`` (on by default, Algorithm 2).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(PowerSGD(rank=rank, warm_start=warm_start), **kwargs)
