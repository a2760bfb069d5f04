"""Deep Gradient Compression: momentum correction, clipping, masking, warm-up (Lin et al., ICLR 2018).

Per worker ``k`` and tensor, every step (§3, Algorithm 1 with the momentum
correction of §3.2, as in the appendix's DGC for momentum SGD):

1. local gradient clipping (§3.2, optional ``clip_norm``): this worker's
   gradients are rescaled when their global L2 norm exceeds
   ``clip_norm · N^(−1/2)``, before they are accumulated ("we scale the
   threshold by N^(−1/2), the current node's fraction of the global
   threshold");
2. momentum correction (§3.2): ``u ← m·u + g`` (the worker's velocity), then
   ``v ← v + u`` (the accumulated velocity). ``u`` is worker-local state
   (:mod:`jaxcomp.compressors._momentum`); ``v`` **is** the shared
   error-feedback residual of :func:`jaxcomp.compress`: the exchange's input
   is ``x = u + r``, i.e. ``v``;
3. sparsification (§3.1): the threshold is the ``density``-quantile of a
   sample of ``|v|`` ("we only sample 0.1% to 1% of the gradients and
   perform top-k selection on the samples"), found as top-k does
   (:class:`jaxcomp.TopK`, :func:`jaxcomp.compressors._select.kth_largest`);
   entries with ``|v| ≥ thr`` are sent, at most ``ceil(density·n)`` of them
   (beyond that, a window of consecutive selected entries from a random
   start, as in top-k, so no position is favoured; the unsent ones are
   counted in the metric ``overflow`` and stay in ``v``);
4. momentum factor masking (§3.2): where an entry was sent, both ``v`` (the
   error feedback does it: ``r ← x − sent``) and ``u`` are zeroed;
5. the exchange: the sent entries as ``uint32`` indices and ``float32``
   values (``8·ceil(density·n)`` bytes per tensor, plus the shared
   non-finite flag); every worker gathers every payload and averages
   (``G = (1/N) Σ_k sparse_k``);
6. warm-up training (§3.3): the density falls exponentially over the
   warm-up, sparsity 75%, 93.75%, 98.4375%, 99.6% (exactly ``1 − 4^−4 =
   99.609375%``), one stage per quarter of ``warmup_steps`` (the paper: one
   epoch per stage over four epochs), then ``density`` (99.9% sparsity:
   0.001). The payload's shape depends on the density, so each stage is a
   branch of a ``lax.switch`` on the step counter (identical on every
   worker) with its own collective; ``bytes_on_wire`` counts the bytes of
   the branch taken, exactly (:class:`jaxcomp.Count`). Alternatively the
   warm-up is an optax schedule of the density (:func:`dgc_warmup_schedule`,
   through ``optax.inject_hyperparams``) within a fixed ``capacity``: one
   payload of the capacity's size at every step, ``encoded_bytes`` counting
   the entries sent.

**Where the learning rate and the momentum live.** The momentum correction
*replaces* the optimizer's momentum (the paper's SGD step is
``w ← w − η·G``): chain DGC with plain SGD::

  tx = optax.chain(jaxcomp.dgc(momentum=0.9, axis_name="workers"), optax.sgd(lr))

not with ``optax.sgd(lr, momentum=0.9)`` (that would apply momentum twice).
With ``density=1`` and ``masking=False`` this chain is exactly
``optax.sgd(lr, momentum=m)`` applied to the mean gradient.

Decisions (tested in ``tests/test_zoo_signum_dgc.py``):

* With masking (the default, §3.2) and ``density=1`` every nonzero entry is
  sent every step, so ``u`` is zeroed every step: the update is plain SGD on
  the mean gradient. Momentum factor masking stops momentum on every sent
  entry, which at density 1 is all of them.
* Tensors kept in float (``skip``, ``min_size``; the paper keeps e.g. biases
  and batch-norm parameters dense) get the momentum but neither ``v`` nor
  masking: momentum SGD on those tensors.
* The threshold is ``|v| ≥ thr`` (the paper writes ``>``; with a sampled
  threshold the two differ only on ties); zeros are never sent. A sampled
  threshold is an estimate: even ``density=1`` sends every nonzero entry
  only with an exact threshold (``sample=None``, or tensors of at most
  ``sample`` entries); what is not sent stays in ``v``.
* The step counter of the warm-up is per tensor in the exchange's state
  (identical on every worker); it saturates at ``2**31 − 1``.
* With a warm-up the exchange is the compressor's own
  (``custom_exchange``); its :class:`~jaxcomp.core.Exchanged` has no single
  payload (the shape changes by stage), so ``payload`` is ``None`` and the
  bytes are counted from the stage taken.
* ``error_feedback=False`` and exchanges other than ``"all_gather"`` are
  refused: ``v`` is the error-feedback residual, and masking reads it.
* A worker whose ``v`` is not finite for a tensor keeps ``u`` and ``v`` as
  they were (the shared ``nonfinite`` policy decides the update). With
  clipping, a non-finite gradient makes the worker's global norm, hence all
  its tensors that step, non-finite.

References:
  Lin, Han, Mao, Wang, Dally. *Deep Gradient Compression: Reducing the
  Communication Bandwidth for Distributed Training*. ICLR 2018
  (arXiv:1712.01887): §3.1 and Algorithm 1 (gradient sparsification,
  sampled threshold), §3.2 (momentum correction, local gradient clipping,
  momentum factor masking; the appendix's algorithm for momentum SGD),
  §3.3 (warm-up training).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.compressors import _momentum
from jaxcomp.compressors import _select
from jaxcomp.compressors.topk import TopK

# §3.3: sparsity 75%, 93.75%, 98.4375%, 99.6% over the warm-up: densities 4^-1 ... 4^-4.
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.00390625)


def _check_warmup(warmup_steps: Any, warmup_densities: Any) -> None:
  if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
    raise ValueError(f"warmup_steps must be an int >= 0; got {warmup_steps!r}.")
  if not isinstance(warmup_densities, tuple) or not warmup_densities:
    raise ValueError(f"warmup_densities must be a non-empty tuple of fractions; got {warmup_densities!r}.")
  for d in warmup_densities:
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 < float(d) <= 1.0:
      raise ValueError(f"warmup_densities must hold fractions in (0, 1]; got {warmup_densities!r}.")
  if 0 < warmup_steps < len(warmup_densities):
    raise ValueError(f"warmup_steps ({warmup_steps}) must give every one of the "
                     f"{len(warmup_densities)} warm-up stages a step.")


@dataclasses.dataclass(frozen=True)
class DGC(core.Compressor):
  """DGC's per-tensor compressor: sampled-threshold top-k with a warm-up schedule.

  The momentum correction, clipping and masking are worker-local steps of
  :func:`dgc` around it (see the module docstring).

  Attributes:
    density: the fraction of entries sent after the warm-up (0.001: 99.9%
      sparsity).
    warmup_steps: steps of the warm-up (0: none), split into equal stages.
    warmup_densities: the density of each warm-up stage.
    sample: values sampled to find the threshold (``None``: exact).
    rng: uniform generator for the sample.
    capacity: value slots on the wire, a fraction of ``n`` or a count
      (``None``: ``ceil(density·n)``); needed for a traced ``density``.
  """

  density: float = 0.001
  warmup_steps: int = 0
  warmup_densities: tuple[float, ...] = WARMUP_DENSITIES
  sample: Optional[int] = 4096
  rng: rng.RngImpl = "hash"
  capacity: Optional[_select.Capacity] = None

  error_feedback = True
  metric_keys = ("overflow",)

  def __post_init__(self):
    _select.check_selection(self.density, self.capacity, "density")
    _check_warmup(self.warmup_steps, self.warmup_densities)
    if hyperparams.is_traced(self.density) and self.warmup_steps:
      raise ValueError("A traced density is the warm-up itself: give warmup_steps=0 and the density as a "
                       "schedule (jaxcomp.dgc_warmup_schedule).")
    _select.check_sample(self.sample)
    rng.check_impl(self.rng)

  # -- the schedule (§3.3) ----------------------------------------------------

  @property
  def densities(self) -> tuple[float, ...]:
    """The density of every stage: the warm-up's, then ``density``."""
    return (tuple(self.warmup_densities) if self.warmup_steps else ()) + (self.density,)

  @property
  def stage_starts(self) -> tuple[int, ...]:
    """The first step of every stage after the first."""
    stages = len(self.warmup_densities)
    return tuple(-(-i * self.warmup_steps // stages) for i in range(1, stages + 1)) if self.warmup_steps else ()

  def stage(self, step: jax.Array) -> jax.Array:
    """The stage of ``step`` (int32): how many stage starts it has reached."""
    step = jnp.asarray(step, jnp.int32)
    return sum((step >= s).astype(jnp.int32) for s in self.stage_starts) + jnp.int32(0)

  def density_at(self, step: int) -> float:
    """The density at ``step`` (a Python int), on the host."""
    return self.densities[sum(step >= s for s in self.stage_starts)]

  def selector(self, density: float) -> TopK:
    """The top-k compressor of one stage: index wire, slots ``capacity`` or ``ceil(density·n)``."""
    return TopK(fraction=density, wire="index", sample=self.sample, rng=self.rng, capacity=self.capacity)

  # -- after the warm-up (or without one): the final stage's top-k --------------

  @property
  def custom_exchange(self) -> bool:  # type: ignore[override]
    return self.warmup_steps > 0

  def validate(self, shape, dtype):
    self.selector(self.density).validate(shape, dtype)

  def encode_with_metrics(self, x, key, agreed):
    return self.selector(self.density).encode_with_metrics(x, key, agreed)

  def encode(self, x, key, agreed):
    return self.encode_with_metrics(x, key, agreed)[0]

  def decode(self, payload, shape):
    return self.selector(self.density).decode(payload, shape)  # index wire: any stage's payload

  def aggregate(self, gathered, shape):
    return self.selector(self.density).aggregate(gathered, shape)

  def encoded_bytes(self, payload, shape):
    """With a traced density, 8 bytes per filled slot (:meth:`jaxcomp.TopK.encoded_bytes`); else ``None``."""
    return self.selector(self.density).encoded_bytes(payload, shape)

  # -- the warm-up: one branch per stage ------------------------------------------

  def init_state(self, shape, key):
    del shape, key
    return jnp.zeros((), jnp.int32) if self.custom_exchange else None  # the step counter

  def exchange(self, x, key, axis_name, state):
    """The exchange of the current stage's top-k: each stage's rounds run only in that stage.

    Every stage's payload has its own size, so each stage is a conditional
    message (``Message.when``) with its encode and decode in ``lax.cond`` s
    on the step counter, the same on every worker: one stage's work and bytes a step.
    """
    stage = self.stage(state)
    mean = own = jnp.zeros(x.shape, jnp.float32)
    overflow = jnp.int32(0)
    for s, density in enumerate(self.densities):
      on, sel = stage == s, self.selector(density)
      encode = lambda sel=sel: sel.encode_with_metrics(x, key, None)
      payload, metrics = parallel.replicated_cond(on, encode, lambda encode=encode: _zeros(jax.eval_shape(encode)))
      payload = lax.optimization_barrier(payload)  # as in allgather.exchange_steps: encoded once
      gathered = yield core.Message("gather", payload, when=on, encoded=sel.encoded_bytes(payload, x.shape))
      gathered = gathered if parallel.axis_names(axis_name) else None  # one worker: the mean is its own
      decode = lambda sel=sel, payload=payload, gathered=gathered: (
          sel.decode(payload, x.shape) if gathered is None else sel.aggregate(gathered, x.shape),
          sel.decode(payload, x.shape))
      mean_s, own_s = parallel.replicated_cond(on, decode, lambda: (jnp.zeros_like(mean), jnp.zeros_like(own)))
      mean, own = jnp.where(on, mean_s, mean), jnp.where(on, own_s, own)
      overflow = jnp.where(on, metrics["overflow"], overflow)
    return core.Exchanged(mean=mean, own=own, payload=None, state=optax.safe_increment(state),
                          metrics={"overflow": overflow})


def _zeros(structs: Any) -> Any:
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), structs)


def clip_locally(grads: Any, clip_norm: float, axis_name: parallel.AxisName) -> Any:
  """This worker's gradients rescaled to a global L2 norm of at most ``clip_norm · N^(−1/2)`` (§3.2).

  Float32 out; ``N`` is the number of workers on ``axis_name``.
  """
  limit = clip_norm / math.sqrt(parallel.axis_size(axis_name))  # a Python float, or a traced one
  leaves = [g.astype(jnp.float32) for g in jax.tree.leaves(grads)]
  norm = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves) + jnp.float32(0.0))
  scale = jnp.where(norm > limit, jnp.asarray(limit, jnp.float32) / norm, jnp.float32(1.0))
  return jax.tree.map(lambda g: g.astype(jnp.float32) * scale, grads)


def dgc_warmup_schedule(
    warmup_steps: int,
    density: float = 0.001,
    warmup_densities: Sequence[float] = WARMUP_DENSITIES,
) -> optax.Schedule:
  """DGC's exponential warm-up of the sparsity (§3.3) as an optax schedule of the density.

  The density falls exponentially over ``warmup_steps`` (the paper: four
  epochs), one stage per equal part, 25%, 6.25%, 1.5625%, 0.390625% (sparsity
  75%, 93.75%, 98.4375%, 99.6%), then stays at ``density`` (0.1%): the stages
  of ``DGC(warmup_steps=...)``, as a value to inject into :func:`dgc`::

    tx = optax.inject_hyperparams(jaxcomp.dgc, static_args=jaxcomp.dgc.static_args)(
        density=jaxcomp.dgc_warmup_schedule(4 * steps_per_epoch), capacity=0.25, axis_name="workers")

  With the schedule the payload keeps the capacity's size at every step
  (``bytes_on_wire``: 8 bytes per slot) and ``encoded_bytes`` counts the
  entries sent; ``dgc(warmup_steps=...)`` instead gives every stage a payload
  of its own size, so ``bytes_on_wire`` itself falls.

  Args:
    warmup_steps: steps of the warm-up, split into ``len(warmup_densities)``
      equal stages (an int ``>= 0``).
    density: the density after the warm-up.
    warmup_densities: the density of each stage.

  Returns:
    An ``optax.Schedule``: step count -> float32 density.
  """
  stages = DGC(density=density, warmup_steps=warmup_steps, warmup_densities=tuple(warmup_densities))
  densities = np.asarray(stages.densities, np.float32)

  def schedule(count):
    return jnp.asarray(densities)[stages.stage(count)]

  return schedule


@hyperparams.factory(warmup_steps="the stages of the warm-up (one payload shape each; schedule the density instead)",
                    sample="the size of the sample (a shape)", capacity="the number of value slots on the wire")
def dgc(
    density: float = 0.001,
    *,
    momentum: float = 0.9,
    clip_norm: Optional[float] = None,
    warmup_steps: int = 0,
    warmup_densities: tuple[float, ...] = WARMUP_DENSITIES,
    masking: bool = True,
    sample: Optional[int] = 4096,
    rng: rng.RngImpl = "hash",
    capacity: Optional[_select.Capacity] = None,
    **kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """Deep Gradient Compression as an optax transform (follow it with plain SGD).

  Example::

    # ImageNet in the paper: 4 warm-up epochs.
    tx = optax.chain(
        jaxcomp.dgc(momentum=0.9, warmup_steps=4 * steps_per_epoch, axis_name="workers"),
        optax.sgd(lr))

  Args:
    density: fraction of each tensor's entries sent after the warm-up
      (0.001: the paper's 99.9% sparsity).
    momentum: the momentum ``m`` of the momentum correction, in ``[0, 1)``;
      it replaces the optimizer's momentum.
    clip_norm: the global gradient-clipping threshold; each worker clips its
      own gradients at ``clip_norm · N^(−1/2)`` before accumulating them
      (§3.2). ``None``: no clipping.
    warmup_steps: steps of the warm-up (§3.3: four epochs), split into equal
      stages of ``warmup_densities``; 0 for none.
    warmup_densities: the density of each warm-up stage (default: sparsity
      75%, 93.75%, 98.4375%, 99.6%).
    masking: momentum factor masking (§3.2): zero ``u`` where sent.
    sample: values sampled to estimate the threshold (§3.1); ``None`` finds
      the exact quantile.
    rng: uniform generator for the sample, ``"hash"`` or ``"threefry"``.
    capacity: value slots on the wire per tensor, a fraction of its size or
      a count; ``None``: ``ceil(density·n)``. Needed (static) when the
      density is injected or on a schedule (``optax.inject_hyperparams``,
      e.g. :func:`dgc_warmup_schedule` with ``capacity=0.25``, its largest
      density): the payload keeps the capacity's size, the density sets how
      many entries are sent, and ``encoded_bytes`` counts 8 bytes per sent
      entry.
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``; ``error_feedback`` is on and must
      stay on: it carries ``v``).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates are the mean
    of the workers' sparse accumulated velocities.

  Raises:
    ValueError: for an argument out of range (named in the message).
  """
  _momentum.check_momentum(momentum, "momentum")
  if clip_norm is not None:
    hyperparams.check_number(clip_norm, "clip_norm", lambda c: c > 0, "None or a number > 0")
  if kwargs.get("error_feedback", True) is False:
    raise ValueError("dgc needs error_feedback: the residual is DGC's accumulated velocity v (§3.2).")
  if kwargs.get("exchange", "all_gather") != "all_gather":
    raise ValueError(f"dgc supports exchange='all_gather' only (momentum factor masking reads the "
                     f"all-gather's residual); got exchange={kwargs['exchange']!r}.")
  compressor = DGC(density=density, warmup_steps=warmup_steps, warmup_densities=tuple(warmup_densities),
                   sample=sample, rng=rng, capacity=capacity)
  axis_name = kwargs.get("axis_name")
  prepare = None if clip_norm is None else (lambda grads: clip_locally(grads, clip_norm, axis_name))
  return _momentum.with_worker_momentum(
      transforms.compress(compressor, **kwargs), momentum=momentum, dampening=1.0,
      masking=masking, prepare=prepare)
