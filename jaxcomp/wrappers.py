"""optax wrappers around a compressed chain: accumulate gradients, skip non-finite steps.

``optax.MultiSteps`` and ``optax.apply_if_finite`` keep state of their own
(accumulated gradients, counters of non-finite steps). Around a chain that
exchanges gradients over a worker axis that state is per worker, or decided
per worker, and neither wrapper knows about workers:

* ``optax.MultiSteps(chain, k)`` accumulates each worker's gradients (per
  worker: not a :class:`~jaxcomp.core.WorkerLocal`, so ``vmap`` refuses it)
  and runs the wrapped chain, exchange included, on *every* mini-step,
  keeping its result only on the ``k``-th: the compressed bytes cross the wire
  ``k`` times per update. :func:`multi_steps` accumulates locally and
  exchanges only on the ``k``-th step.
* ``optax.apply_if_finite(chain, n)`` decides on each worker's own gradients:
  a NaN on one worker would skip the step there only, and the replicas would
  drift apart. :func:`apply_if_finite` decides on every worker's gradients
  together (one byte per worker through a ``pmax``).

Both work under ``vmap``, ``pmap``, ``shard_map`` and several processes, with
the state laid out by :func:`jaxcomp.parallel.replicate_workers`,
:func:`~jaxcomp.parallel.worker_axes` and :func:`~jaxcomp.parallel.worker_specs`;
those refuse a state in which the optax wrappers hold a compression
transform, with the path of the wrapper's state and a pointer here.

Metrics (:func:`jaxcomp.metrics`) count what crossed the wire in the last
update: on a step where the wrapped chain did not run (a mini-step of
:func:`multi_steps`, a step :func:`apply_if_finite` skipped) every counter
of the chain is 0 (``bytes_on_wire``, ``nonfinite_tensors`` …), while
``float32_bytes`` and ``compressed_float32_bytes`` keep their per-step
sizes, so sums over steps come out right (see
:mod:`jaxcomp.compressors.local_steps`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp import update_steps
from jaxcomp.compressors.local_steps import local_steps, silence_wire, traced_wire
from jaxcomp.exchange import transport


def multi_steps(inner: optax.GradientTransformation, every_k_schedule: int) -> optax.GradientTransformationExtraArgs:
  """``optax.MultiSteps(inner, every_k_schedule)`` for a chain that exchanges gradients.

  Each worker adds its gradients to a local float32 accumulator; on every
  ``k``-th step the mean of the last ``k`` gradients goes through ``inner``
  (compressor, exchange and optimizer) once, and the update is what
  ``inner`` returns. On the other steps the update is zero, ``inner``'s state
  (error-feedback residuals, momentum) is untouched and nothing crosses the
  wire: :func:`jaxcomp.metrics` reports 0 bytes for them. As
  ``optax.MultiSteps(..., use_grad_mean=True)``, but the exchange runs only
  on the ``k``-th step (a ``lax.cond`` on the replicated step counter).

  Example::

    chain = optax.chain(jaxcomp.terngrad(axis_name="workers"), optax.sgd(0.1))
    tx = jaxcomp.multi_steps(chain, 4)   # compress and exchange every 4 steps

  Args:
    inner: the chain that compresses, exchanges and steps (its compressors
      carry the worker axis).
    every_k_schedule: ``k``, an int (schedules of ``k`` are not supported:
      the workers must agree statically on when they exchange).

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its state is a
    :class:`~jaxcomp.compressors.local_steps.LocalStepsState` whose
    ``exchange`` is ``inner``'s state.
  """
  if callable(every_k_schedule):
    raise TypeError("jaxcomp.multi_steps takes an int every_k_schedule; a schedule of k is not supported.")
  return local_steps(optax.identity(), every_k_schedule, exchange=inner)


class ApplyIfFiniteState(NamedTuple):
  """State of :func:`apply_if_finite` (the fields of ``optax.ApplyIfFiniteState``, agreed by every worker)."""

  notfinite_count: jax.Array  # int32: consecutive steps with a non-finite gradient on some worker
  last_finite: jax.Array  # bool: whether the last step's gradients were finite on every worker
  total_notfinite: jax.Array  # int32: steps with a non-finite gradient on some worker, in total
  inner_state: Any
  local: core.WorkerLocal  # metrics: the agreement flag's bytes


def apply_if_finite(
    inner: optax.GradientTransformation,
    max_consecutive_errors: int,
    *,
    axis_name: parallel.AxisName = None,
) -> optax.GradientTransformationExtraArgs:
  """``optax.apply_if_finite(inner, max_consecutive_errors)``, decided by every worker together.

  A step is skipped when some worker's gradients hold a NaN or Inf: the
  workers agree on that with a ``pmax`` of one byte each (counted in
  ``bytes_on_wire``, ``compressed_bytes_on_wire`` and ``encoded_bytes``), so
  they skip together and stay replicas. A skipped step's update is zero and
  ``inner`` does not run (nothing of it crosses the wire; its state,
  residuals included, is untouched). After more than
  ``max_consecutive_errors`` such steps in a row the update is applied
  anyway, as optax does.

  Example::

    chain = optax.chain(jaxcomp.terngrad(axis_name="workers"), optax.sgd(0.1))
    tx = jaxcomp.apply_if_finite(chain, 3, axis_name="workers")

  Args:
    inner: the chain that compresses, exchanges and steps.
    max_consecutive_errors: skipped steps in a row after which the update
      goes through.
    axis_name: the worker axis of ``inner``'s compressors (``None``: one
      worker).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with an
    :class:`ApplyIfFiniteState`.
  """
  parallel.axis_names(axis_name)  # validates
  inner = optax.with_extra_args_support(inner)

  def agree(bad):
    """Every worker's flag (one uint8, a ``"max"`` message): the step is skipped on all workers alike."""
    return (yield core.Message("max", bad)) if parallel.axis_names(axis_name) else bad

  def flag_counts(traffic: transport.Traffic) -> dict:
    return {"bytes_on_wire": traffic.sent, "compressed_bytes_on_wire": traffic.sent, "encoded_bytes": traffic.encoded}

  # The flag's bytes are the same every step (the transport counts its one message): the state holds them from init.
  static = transport.Traffic()
  transport.run(agree(jnp.uint8(0)), None, static)

  def init_fn(params):
    return ApplyIfFiniteState(
        notfinite_count=jnp.zeros((), jnp.int32),
        last_finite=jnp.array(True),
        total_notfinite=jnp.zeros((), jnp.int32),
        inner_state=silence_wire(inner.init(params)),
        local=core.WorkerLocal(residual=optax.MaskedNode(), metrics=flag_counts(static)),
    )

  def update_fn(updates, state, params=None, **extra_args):
    bad = jnp.any(jnp.array([update_steps.is_nonfinite(g) for g in jax.tree.leaves(updates)])).astype(jnp.uint8)
    traffic = transport.Traffic()
    bad = transport.run(agree(bad), axis_name, traffic)
    isfinite = bad == 0
    notfinite_count = jnp.where(isfinite, jnp.zeros((), jnp.int32), optax.safe_increment(state.notfinite_count))

    def run(updates, inner_state):
      new_updates, inner_state = inner.update(updates, inner_state, params, **extra_args)
      return new_updates, traced_wire(inner_state)

    update_types = jax.eval_shape(run, updates, state.inner_state)[0]

    def skip(updates, inner_state):
      del updates
      return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), update_types), silence_wire(inner_state)

    new_updates, inner_state = parallel.replicated_cond(
        isfinite | (notfinite_count > max_consecutive_errors), run, skip, updates, state.inner_state)
    new_state = ApplyIfFiniteState(
        notfinite_count=notfinite_count,
        last_finite=isfinite,
        total_notfinite=jnp.where(isfinite, state.total_notfinite, optax.safe_increment(state.total_notfinite)),
        inner_state=inner_state,
        local=state.local._replace(metrics=flag_counts(traffic)),
    )
    return new_updates, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
