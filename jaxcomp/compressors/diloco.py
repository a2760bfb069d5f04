"""DiLoCo: local inner steps, an exchanged pseudo-gradient, an outer optimizer.

Douillard et al., *DiLoCo: Distributed Low-Communication Training of Language Models*
(arXiv:2311.08105), Alg. 1: every worker ``i`` starts an outer step from the shared parameters
``θ^(t−1)``, runs ``H`` steps of the inner optimizer (AdamW) on its own data without any
communication, giving ``θ_i^(t)``; the workers then average the *outer gradient* (pseudo-gradient)
``Δ_i = θ^(t−1) − θ_i^(t)``, and the outer optimizer (SGD with Nesterov momentum 0.9, lr 0.7 in
the paper, §3) applies the average to ``θ^(t−1)``. Streaming DiLoCo (Douillard et al.,
arXiv:2501.18512) exchanges the outer gradients in low precision (4-bit floats, accumulated in
float32); here any jaxcomp compressor can exchange them (float32 ``pmean`` by default).

In jaxcomp's layout the parameters ``θ`` passed to the train step are the shared (replicated)
ones; a worker's local parameters are ``θ + offset``, the ``offset`` (``Σ`` of its inner updates
since the last outer step, float32) and the inner optimizer's state being per worker
(:class:`~jaxcomp.core.WorkerLocal`, so :func:`jaxcomp.parallel.worker_axes` lays them over the
workers). **Take the gradient at** :func:`local_params` ``(opt_state, params)``, which is
``params`` on the first inner step of every outer step::

  tx = jaxcomp.diloco(optax.adamw(1e-3, weight_decay=0.1), inner_steps=8, axis_name="workers")

  def worker_step(params, opt_state, batch):
    grads = jax.grad(loss_fn)(jaxcomp.local_params(opt_state, params), batch)
    updates, opt_state = tx.update(grads, opt_state, params)   # zero but on every 8th step
    return optax.apply_updates(params, updates), opt_state

Decisions (tested in ``tests/test_diloco.py``):

* **Updates.** On inner steps ``1 … H−1`` of an outer step the update of the shared parameters
  is zero (they stay ``θ^(t−1)``, as in Alg. 1); on step ``H`` it is the outer optimizer's
  update. The inner optimizer receives the worker's gradient and its local parameters (for
  weight decay); its state persists across outer steps (Alg. 1 keeps it per worker).
* **The pseudo-gradient** ``Δ_i = −offset_i`` is cast to the gradients' dtype and exchanged by
  the exchange transform; with error feedback (e.g. ``exchange="int8"``) the residual is kept on
  the pseudo-gradient, so ``Σ`` over outer steps of the averaged ``Δ`` equals
  ``mean_i (Σ Δ_i − residual_i)``.
* **Bytes**: as :func:`jaxcomp.local_steps`: the exchange's counters on the outer step, 0 on
  the silent inner steps (the reference sizes ``float32_bytes`` stay per step), so sums over
  steps are the real traffic: ``H`` times less than a float all-reduce per step with a float
  exchange.
* **H = 1** with a float exchange and outer SGD at lr 1 applies the mean of the workers' inner
  updates: data-parallel training exactly when the inner optimizer is linear in the gradient
  (SGD), or when the workers' gradients agree; with AdamW and differing gradients the mean of
  normalised updates is not AdamW's update of the mean gradient.
* **Norms** (:func:`jaxcomp.metrics`, :data:`NORMS`): on the outer step, the global L2 norms
  of this worker's pseudo-gradient, of the averaged one, of the outer optimizer's state (its
  momentum) after the step, and of the outer update; 0 on the silent inner steps, as the wire
  counters are.
* The branch is a ``lax.cond`` on the replicated inner-step counter, so the collectives run only
  on outer steps, on every worker alike (``vmap``, ``pmap``, ``shard_map`` and their mixes).

References:
  Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen. *DiLoCo:
  Distributed Low-Communication Training of Language Models*. arXiv:2311.08105, Alg. 1, §3.
  Douillard, Donchev, Rush, et al. *Streaming DiLoCo with overlapping communication: Towards a
  Distributed Free Lunch*. arXiv:2501.18512 (quantized outer gradients).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp.compressors import local_steps as local_steps_lib


# The outer step's norms (jaxcomp.metrics; 0 on the silent steps), each a mean over workers.
NORMS = {
    "diloco_pseudo_grad_norm": "‖Δ_i‖ of a worker's pseudo-gradient θ^(t−1) − θ_i^(t)",
    "diloco_outer_grad_norm": "‖mean_i Δ_i‖ of the averaged pseudo-gradient the outer optimizer receives",
    "diloco_outer_state_norm": "‖outer optimizer state‖ after the step (Nesterov SGD: its momentum)",
    "diloco_outer_update_norm": "‖outer update‖ applied to the shared parameters",
}


def _norms(pseudo=None, averaged=None, outer_state=None, outer_updates=None) -> dict[str, jax.Array]:
  """:data:`NORMS` of an outer step; zeros (a silent step, or the initial state) without arguments."""
  trees = (pseudo, averaged, outer_state, outer_updates)
  if pseudo is None:
    return {k: jnp.zeros((), jnp.float32) for k in NORMS}
  floats = lambda t: [x for x in jax.tree.leaves(t) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
  return {k: optax.tree.norm(floats(t)).astype(jnp.float32) for k, t in zip(NORMS, trees)}


class DiLoCoState(NamedTuple):
  """State of :func:`diloco`."""

  inner_step: jax.Array  # int32 in [0, H): inner steps since the last outer step, the same on every worker
  offset: core.WorkerLocal  # residual: this worker's local parameters minus the shared ones (float32)
  inner: core.WorkerLocal  # residual: this worker's inner optimizer state
  exchange: Any  # the pseudo-gradient exchange's state
  outer: Any  # the outer optimizer's state (shared)


def _is_state(x: Any) -> bool:
  return isinstance(x, DiLoCoState)


def local_params(opt_state: Any, params: Any) -> Any:
  """This worker's local parameters under DiLoCo (``params + offset``), else ``params`` itself.

  Call it inside the per-worker step, on this worker's ``opt_state``: take the gradient there.
  """
  states = [s for s in jax.tree.leaves(opt_state, is_leaf=_is_state) if _is_state(s)]
  if not states:
    return params
  if len(states) > 1:
    raise ValueError(f"opt_state holds {len(states)} DiLoCo states; a chain may hold one.")
  return jax.tree.map(lambda p, o: (p + o).astype(p.dtype), params, states[0].offset.residual)


@hyperparams.factory(inner_steps="the inner steps per outer step, which the step's control flow is built from")
def diloco(
    inner: optax.GradientTransformation,
    inner_steps: int = 500,
    *,
    outer: Optional[optax.GradientTransformation] = None,
    outer_learning_rate: float = 0.7,
    outer_momentum: float = 0.9,
    axis_name: parallel.AxisName = None,
    exchange: Union[None, str, optax.GradientTransformation] = None,
    **exchange_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """DiLoCo (arXiv:2311.08105, Alg. 1) around the inner optimizer ``inner``.

  Example::

    tx = jaxcomp.diloco(optax.adamw(4e-4, weight_decay=0.1), inner_steps=500, axis_name="workers")
    # 8-bit pseudo-gradients with error feedback, as in Streaming DiLoCo:
    tx = jaxcomp.diloco(optax.adamw(4e-4), 100, axis_name="workers", exchange="int8")
    # from a config:
    tx = jaxcomp.make_optimizer("diloco", optax.adamw(4e-4), inner_steps=100, axis_name="workers")

  Args:
    inner: the inner optimizer (the paper: AdamW), run by every worker on its own gradients.
    inner_steps: ``H``, inner steps per outer step (the paper: 500). ``H = 1`` exchanges every step.
    outer: the outer optimizer; default SGD with Nesterov momentum (§3: lr 0.7, momentum 0.9).
    outer_learning_rate: the default outer optimizer's learning rate.
    outer_momentum: the default outer optimizer's Nesterov momentum (0: plain SGD).
    axis_name: the named worker axis (see :func:`jaxcomp.compress`).
    exchange: how the pseudo-gradients are averaged: ``None`` (default) a float ``pmean``, a
      registered compressor's name (built with ``axis_name`` and ``**exchange_kwargs``), or an
      optax transform that averages over ``axis_name`` itself.
    **exchange_kwargs: keyword arguments of the named compressor; for the float exchange only
      :func:`jaxcomp.compress`'s ``seed``, ``skip``, ``min_size``, ``nonfinite``, ``bucket_bytes``,
      ``within``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates of the shared parameters are zero
    except on every ``H``-th step. Take gradients at :func:`local_params`.
  """
  if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
    raise ValueError(f"inner_steps must be an int >= 1; got {inner_steps!r}.")
  if outer is None:
    if hyperparams.is_traced(outer_momentum):  # injected: Nesterov's trace is kept even at 0, where it is plain SGD
      outer = optax.sgd(outer_learning_rate, momentum=outer_momentum, nesterov=True)
    else:
      outer = optax.sgd(outer_learning_rate, momentum=outer_momentum or None, nesterov=bool(outer_momentum))
  elif not (hyperparams.is_traced(outer_learning_rate) or hyperparams.is_traced(outer_momentum)) and (
      outer_learning_rate != 0.7 or outer_momentum != 0.9):
    raise TypeError("outer_learning_rate and outer_momentum set the default outer optimizer; "
                    "pass them or `outer`, not both.")
  ex = local_steps_lib.make_exchange(exchange, axis_name, exchange_kwargs, "diloco", "the pseudo-gradients")
  inner = optax.with_extra_args_support(inner)
  outer = optax.with_extra_args_support(outer)
  h = inner_steps

  def init_fn(params):
    return DiLoCoState(
        inner_step=jnp.zeros((), jnp.int32),
        offset=core.WorkerLocal(residual=jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params),
                                metrics=_norms()),
        inner=core.WorkerLocal(residual=inner.init(params), metrics={}),
        exchange=local_steps_lib.silence_wire(ex.init(params)),
        outer=outer.init(params),
    )

  def update_fn(updates, state, params=None, **extra_args):
    local = None if params is None else local_params(state, params)
    inner_updates, inner_state = inner.update(updates, state.inner.residual, local, **extra_args)
    offset = jax.tree.map(lambda o, u: o + u.astype(jnp.float32), state.offset.residual, inner_updates)

    def outer_step(offset, ex_state, outer_state):
      pseudo = jax.tree.map(lambda o, g: (-o).astype(g.dtype), offset, updates)  # θ^(t−1) − θ_i^(t)
      averaged, ex_state = ex.update(pseudo, ex_state, params, **extra_args)
      new_updates, outer_state = outer.update(averaged, outer_state, params, **extra_args)
      norms = _norms(pseudo, averaged, outer_state, new_updates)
      return ((new_updates, norms), jax.tree.map(jnp.zeros_like, offset),
              local_steps_lib.traced_wire(ex_state), outer_state)

    (new_updates, norms), offset, ex_state, outer_state = local_steps_lib.on_last_step(
        h, state.inner_step, outer_step, (offset, state.exchange, state.outer))
    new_state = DiLoCoState(
        inner_step=(state.inner_step + 1) % h,
        offset=state.offset._replace(residual=offset, metrics=norms),  # keeps LaidOut
        inner=state.inner._replace(residual=inner_state),
        exchange=ex_state,
        outer=outer_state,
    )
    return new_updates, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
