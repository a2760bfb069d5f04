"""Laying an ``nnx.Optimizer``'s state over workers (Flax NNX).

``nnx.Optimizer(model, tx)`` keeps the optax state of ``tx`` inside the
optimizer object, its leaves wrapped in NNX variables. With a compressor in
``tx`` some of those leaves are per worker (the
:class:`~jaxcomp.core.WorkerLocal` parts: error-feedback residuals, counters)
and the rest are shared, so ``nnx.vmap`` must map the first and not the
second; mapping the optimizer as one fails with JAX's ``out_axes`` error.
The three functions here say which is which, as
:func:`jaxcomp.parallel.replicate_workers` and
:func:`~jaxcomp.parallel.worker_axes` do for a plain optax state::

  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  jaxcomp.flax_nnx.replicate_workers(optimizer, num_workers)   # in place
  opt_axes = jaxcomp.flax_nnx.worker_axes(optimizer)   # nnx.vmap's in_axes for the optimizer

and a train step that calls ``optimizer.update`` inside
``nnx.vmap(..., in_axes=(None, opt_axes, 0), axis_name="workers")`` (the
docs/nnx.md has the whole program). :func:`jaxcomp.metrics` reads
``optimizer.opt_state`` as it is.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp import update_steps


def worker_filter(optimizer: Any) -> Callable[[tuple, Any], bool]:
  """An NNX filter ``(path, value) -> bool``: the per-worker leaves of ``optimizer`` (an ``nnx.Optimizer``).

  They are the leaves under a :class:`~jaxcomp.core.WorkerLocal` of
  ``optimizer.opt_state``; the filter matches their paths exactly, so a
  module of the model named like a field of the state is not mistaken for
  one. Raises as :func:`jaxcomp.parallel.worker_axes` for an optax wrapper
  with per-worker state of its own.
  """
  state = optimizer.opt_state
  parallel.worker_axes(state)  # the same checks
  flat = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, core.WorkerLocal))[0]
  prefixes = {("opt_state",) + update_steps.key_names(path) for path, x in flat if isinstance(x, core.WorkerLocal)}

  def per_worker(path, value) -> bool:
    del value
    return any(tuple(path[:len(p)]) == p for p in prefixes)

  return per_worker


def worker_axes(optimizer: Any) -> Any:
  """``nnx.StateAxes`` for ``nnx.vmap``'s ``in_axes``: the per-worker leaves on axis 0, the rest unmapped."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  return nnx.StateAxes({worker_filter(optimizer): 0, ...: None})


def replicate_workers(optimizer: Any, num_workers: int) -> None:
  """Gives every per-worker leaf of ``optimizer`` a leading axis of ``num_workers``, in place.

  The state is marked as laid out, as :func:`jaxcomp.parallel.replicate_workers`
  marks it: under ``nnx.pmap`` the update refuses a state that is not.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  local = nnx.state(optimizer, worker_filter(optimizer))
  nnx.update(optimizer, jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers,) + jnp.shape(a)), local))
  optimizer.opt_state = parallel.mark_laid_out(optimizer.opt_state)
