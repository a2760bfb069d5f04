"""Worker-local momentum in front of a compressed exchange (Signum, DGC).

Signum (Bernstein et al., ICML 2018, Algorithm 2; ICLR 2019,
Algorithm 1) and Deep Gradient Compression's momentum correction (Lin et al.,
ICLR 2018, §3.2, Algorithm 2) keep a momentum **on each worker** and
compress that, not the gradient. Such a momentum differs between workers, so
it lives in a :class:`jaxcomp.core.WorkerLocal`: under ``vmap``/``pmap``/
``shard_map`` (:func:`jaxcomp.parallel.worker_axes`) it gets a worker axis,
like the shared error-feedback residual of :func:`jaxcomp.compress`.

:func:`with_worker_momentum` wraps an exchange (a :func:`jaxcomp.compress`
transform) into an optax transform whose update is a sequence of named steps,
per tensor:

1. ``prepare`` (optional, all tensors at once): e.g. DGC's local gradient
   clipping (§3.2), applied to this worker's gradients before they are
   accumulated;
2. :func:`accumulate`: ``u ← momentum·u + dampening·g`` in float32;
3. the exchange of ``u`` (cast to the gradient's dtype), with its own error
   feedback, skipping, non-finite policy and byte counting unchanged;
4. :func:`carry_momentum`: a tensor that is not finite (the exchange's input
   ``x = u + r`` holds a NaN or Inf) keeps its previous momentum, as the
   exchange keeps its previous residual; with ``masking`` (DGC's momentum
   factor masking, §3.2), ``u`` is zeroed where the exchange sent the
   tensor's entries (:func:`sent_mask`).

Where was an entry sent? The exchange's error feedback carries
``r ← x − decode(own payload)``. A sparsifier that sends exact values and
never selects zeros (top-k, :mod:`jaxcomp.compressors.topk`) leaves ``r = 0``
where it sent and ``r = x`` elsewhere, so the sent entries are exactly those
where the new residual differs from ``x`` (:func:`sent_mask`). That is read
from the exchange's state, so masking needs the exchange's error feedback.
Tensors the exchange keeps in float (``skip``, ``min_size``) have no residual:
they get the momentum but no masking (momentum SGD on those tensors), or,
with ``bypass`` (Signum), no momentum at all: their gradient is averaged as
it is.

References:
  Bernstein, Wang, Azizzadenesheli, Anandkumar. *signSGD: Compressed
  Optimisation for Non-Convex Problems*. ICML 2018 (arXiv:1802.04434),
  Algorithm 2 ("Signum"). Lin, Han, Mao, Wang, Dally. *Deep Gradient
  Compression: Reducing the Communication Bandwidth for Distributed
  Training*. ICLR 2018 (arXiv:1712.01887), §3.2.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import transforms
from jaxcomp import update_steps


class WorkerMomentumState(NamedTuple):
  """State of :func:`with_worker_momentum`."""

  local: core.WorkerLocal  # residual: this worker's float32 momentum u, params-shaped; metrics: {}
  exchange: transforms.CompressState  # the wrapped exchange's state


def check_momentum(value: Any, name: str) -> None:
  """Raises ``ValueError`` naming ``name`` unless ``0 <= value < 1``."""
  hyperparams.check_number(value, name, lambda v: 0.0 <= v < 1.0, "a number in [0, 1)")


def accumulate(u: jax.Array, g: jax.Array, momentum: float, dampening: float) -> jax.Array:
  """``momentum·u + dampening·g`` in float32 (Signum: ``β, 1 − β``; DGC: ``m, 1``)."""
  g = g.astype(jnp.float32)
  if not hyperparams.is_traced(dampening) and dampening == 1.0:
    return jnp.asarray(momentum, jnp.float32) * u + g
  return jnp.asarray(momentum, jnp.float32) * u + jnp.asarray(dampening, jnp.float32) * g


def sent_mask(x: jax.Array, new_residual: jax.Array) -> jax.Array:
  """Where the exchange sent ``x`` exactly: the new residual ``x − decode(own)`` differs from ``x``.

  Exact for sparsifiers that send the values themselves and never select a
  zero (see the module docstring): ``r = 0 ≠ x`` where sent, ``r = x`` elsewhere.
  """
  return new_residual != x


def carry_momentum(
    u_old: jax.Array, u_new: jax.Array, x: jax.Array, new_residual: Any, masking: bool
) -> jax.Array:
  """The momentum kept for the next step: rolled back if ``x`` is not finite, masked where sent."""
  bad = update_steps.is_nonfinite(x)
  u = jnp.where(bad, u_old, u_new)
  if masking and not isinstance(new_residual, optax.MaskedNode):
    u = jnp.where(jnp.logical_and(jnp.logical_not(bad), sent_mask(x, new_residual)), 0.0, u)
  return u


def with_worker_momentum(
    exchange: optax.GradientTransformationExtraArgs,
    *,
    momentum: float,
    dampening: float,
    masking: bool = False,
    prepare: Optional[Callable[[Any], Any]] = None,
    bypass: Optional[Callable[[Any], list[bool]]] = None,
) -> optax.GradientTransformationExtraArgs:
  """``exchange`` fed with each worker's momentum instead of its gradient.

  Args:
    exchange: a :func:`jaxcomp.compress` transform (its state is read for the
      residuals when ``masking``).
    momentum: the factor of the old momentum, in ``[0, 1)``.
    dampening: the factor of the gradient (Signum: ``1 − β``; DGC: 1).
    masking: zero the momentum where the exchange sent the entry (DGC's
      momentum factor masking, §3.2); needs the exchange's error feedback.
    prepare: a function of this worker's gradients (the whole tree) applied
      before they are accumulated, traced inside the worker axes (e.g. DGC's
      local gradient clipping, which needs the number of workers).
    bypass: a function of the gradients (or params) returning one boolean per
      leaf: True sends that tensor's gradient itself, with no momentum (e.g.
      the tensors the exchange keeps in float, for Signum:
      :func:`exchange_skips`). ``None``: every tensor gets the momentum.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with a
    :class:`WorkerMomentumState`; its updates are the exchange's.
  """
  check_momentum(momentum, "momentum")

  def flags(tree) -> list[bool]:
    return list(bypass(tree)) if bypass is not None else [False] * len(jax.tree.leaves(tree))

  def init_fn(params):
    leaves, treedef = jax.tree.flatten(params)
    u = treedef.unflatten([optax.MaskedNode() if b else jnp.zeros(jnp.shape(p), jnp.float32)
                           for p, b in zip(leaves, flags(params))])
    return WorkerMomentumState(local=core.WorkerLocal(residual=u, metrics={}), exchange=exchange.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    grads = prepare(updates) if prepare is not None else updates
    leaves, treedef = jax.tree.flatten(updates)
    u_old = treedef.flatten_up_to(state.local.residual)
    u_new = [u if isinstance(u, optax.MaskedNode) else accumulate(u, g, momentum, dampening)
             for u, g in zip(u_old, treedef.flatten_up_to(grads))]
    inputs = [g if isinstance(u, optax.MaskedNode) else u.astype(g.dtype) for u, g in zip(u_new, leaves)]
    out, ex_state = exchange.update(treedef.unflatten(inputs), state.exchange, params, **extra_args)
    r_old = treedef.flatten_up_to(state.exchange.local.residual)
    r_new = treedef.flatten_up_to(ex_state.local.residual)
    kept = []
    for u0, u1, inp, r0, r1 in zip(u_old, u_new, inputs, r_old, r_new):
      if isinstance(u0, optax.MaskedNode):
        kept.append(u0)
        continue
      use_ef = not isinstance(r0, optax.MaskedNode)
      x = update_steps.add_residual(inp, r0 if use_ef else None, use_ef)  # the exchange's input, bit for bit
      kept.append(carry_momentum(u0, u1, x, r1, masking))
    new_state = WorkerMomentumState(
        local=state.local._replace(residual=treedef.unflatten(kept)), exchange=ex_state)  # keeps LaidOut
    return out, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def exchange_skips(skip: Any = None, min_size: int = 0) -> Callable[[Any], list[bool]]:
  """Per leaf, whether :func:`jaxcomp.compress` with ``skip`` and ``min_size`` keeps it in float.

  The one rule of :func:`jaxcomp.compress`, for a ``bypass`` that follows it.
  """
  return lambda tree: update_steps.resolve_skip(skip, tree, min_size)

