"""One call from a per-worker training step to the compiled data-parallel step.

A user writes the step of one worker, as for plain optax, with the gradient
taken at :func:`jaxcomp.parallel.vary` ``(params, axis_name)`` (a no-op but
under ``shard_map``, where it keeps each device's gradient its own)::

  def worker_step(params, opt_state, batch):
    grads = jax.grad(loss_fn)(jaxcomp.parallel.vary(params, "workers"), batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state   # (..., aux) also: aux per worker

  step = jaxcomp.data_parallel(worker_step, tx, mesh=mesh)     # or workers=8: simulated on one device
  params, opt_state = step.init(params)                        # the state laid out over the workers
  for batch in batches:                                        # [workers, b, ...]: a row per worker
    params, opt_state = step(params, opt_state, batch)

:func:`data_parallel` does what a hand-written step needs eight helpers of
:mod:`jaxcomp.parallel` for (they stay public for steps built by hand):

* the layout: the worker-local leaves (residuals, counters) get a leading
  worker axis (:func:`~jaxcomp.parallel.replicate_workers`), mapped by
  ``vmap`` (:func:`~jaxcomp.parallel.worker_axes`) or split over the devices
  (:func:`~jaxcomp.parallel.worker_specs`); everything else is shared;
* the placement: parameters replicated (or, model-sharded, as they are),
  the state as the step returns it (:func:`~jaxcomp.parallel.worker_shardings`),
  so the step compiles once; an input laid out otherwise is moved there first;
* the slicing around ``worker_step``: it sees one worker's state and batch
  (:func:`~jaxcomp.parallel.worker_slice`, :func:`~jaxcomp.parallel.worker_batch`,
  :func:`~jaxcomp.parallel.expand_workers`);
* the checks, when the step is traced and before an input is moved (not
  at every call): a batch with one row per worker
  (:func:`~jaxcomp.parallel.check_batch`), a state with its worker axis
  (:func:`~jaxcomp.parallel.check_state`), a compressor exchanging over the step's worker axes;
* ``jax.jit`` with the parameters and state donated (updated in place);
* with a chain of :func:`jaxcomp.shard_optimizer` ``(..., shard_params=True)``
  (ZeRO-3), the parameters between steps are each worker's chunks
  (:class:`~jaxcomp.zero_params.ShardedParams`, also as a part of a tuple such
  as ``(params, batch_stats)``): they are gathered whole for ``worker_step``
  and cut again after it.

The layouts, by what ``mesh`` holds (the compressor's ``axis_name`` names the
same axes):

* ``workers=N``, no mesh: ``N`` simulated workers on one device, ``vmap`` over
  ``axis_name``;
* ``mesh=``: one worker per device, ``shard_map`` over the mesh's axes (a tuple:
  workers numbered major to minor). A compressor with ``within=`` (hosts of
  devices, :mod:`jaxcomp.exchange.hierarchy`) names part of them; a chain wrapped in
  :func:`jaxcomp.per_shard` leaves its model axes out (the workers are over
  the others, each worker's devices splitting the model). A mesh over the
  devices of several processes (``jax.distributed``) is laid out the same
  way; there the batch must be the global one, the same in every process;
* both: ``workers / devices`` simulated workers on each device, ``vmap``
  over ``axis_name`` inside the ``shard_map`` (the compressor's ``axis_name``
  is then the mesh's axes and this one, e.g. ``("devices", "workers")``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax

from jaxcomp import parallel
from jaxcomp import sharded
from jaxcomp import zero
from jaxcomp import zero_params


def data_parallel(worker_step: Callable[..., Any], tx: optax.GradientTransformation, *,
                  workers: Optional[int] = None, mesh: Optional[jax.sharding.Mesh] = None,
                  axis_name: str = "workers", donate: bool = True) -> "DataParallel":
  """The jitted data-parallel step of ``worker_step(params, opt_state, batch)`` (see the module docstring).

  Args:
    worker_step: one worker's step: ``(params, opt_state, batch) -> (params,
      opt_state)`` or ``(params, opt_state, aux)``; ``aux`` (a loss, metrics)
      comes back per worker, with a leading worker axis.
    tx: the optax chain ``worker_step`` updates with (its compressor's
      ``axis_name`` names the worker axes).
    workers: the number of simulated workers (``vmap``): on one device, or
      with ``mesh``, ``workers / devices`` on each device.
    mesh: the devices, one worker per device (``shard_map``) unless ``workers``.
    axis_name: the ``vmap`` axis of ``workers=``; a mesh's axes are its own.
    donate: donate the parameters and state (they are updated in place; do
      not use what was passed in after the call).

  Returns:
    A :class:`DataParallel`: ``step.init(params)`` makes the laid-out
    ``(params, opt_state)``, ``step(params, opt_state, batch)`` runs a step.
  """
  if workers is None and mesh is None:
    raise TypeError("data_parallel takes workers=N (N simulated workers, vmap on one device), mesh= "
                    "(one worker per device, shard_map), or both (N / devices workers on each device).")
  if workers is not None and (not isinstance(workers, int) or workers < 1):
    raise ValueError(f"workers must be a positive int (simulated workers); got {workers!r}.")
  return DataParallel(worker_step, tx, workers, mesh, axis_name, donate)


@dataclasses.dataclass
class _Plan:
  """How one structure of ``(params, opt_state, batch)`` is laid out and stepped."""

  shardings: Any  # (params, opt_state, batch) NamedShardings; None under vmap
  step: Callable[..., Any]  # the jitted step


class DataParallel:
  """A compiled data-parallel step and its initial state; made by :func:`data_parallel`."""

  def __init__(self, worker_step, tx, workers, mesh, axis_name, donate):
    self.worker_step, self.tx, self.mesh, self.donate = worker_step, tx, mesh, donate
    self._workers, self._axis_name = workers, axis_name
    self._plans: dict[Any, _Plan] = {}

  def device_axes(self, opt_state: Any) -> tuple[str, ...]:
    """The mesh axes the workers are split over: all but a :func:`~jaxcomp.per_shard` model's (none under ``vmap``)."""
    if self.mesh is None:
      return ()
    return tuple(a for a in self.mesh.axis_names if a not in _model_axes(opt_state))

  def worker_axes(self, opt_state: Any) -> tuple[str, ...]:
    """Every axis the workers are numbered over, major to minor: :meth:`device_axes`, then the ``vmap`` axis if any."""
    simulated = (self._axis_name,) if self._workers is not None else ()
    return self.device_axes(opt_state) + simulated

  def num_workers(self, opt_state: Any) -> int:
    """How many workers the step runs: ``workers=``, or the devices along :meth:`device_axes`."""
    devices = math.prod(self.mesh.shape[a] for a in self.device_axes(opt_state)) if self.mesh else 1
    if self._workers is None:
      return devices
    if self._workers % devices:
      raise ValueError(f"workers={self._workers} is not a multiple of the {self.device_axes(opt_state)} "
                       f"devices {dict(self.mesh.shape)}: every device runs workers / devices of them.")
    return self._workers

  def mapped(self, params: Any, opt_state: Any, batch: Any) -> Any:
    """The step unjitted, to trace inside a step of one's own (``jax.jit`` of more than this).

    The same ``vmap``/``shard_map`` and checks as a call, without the
    placement, the donation and the ``jit``: the caller's ``jax.jit`` gives
    those. Returns ``(params, opt_state, aux)`` (``aux`` None without one).
    """
    if self.mesh is None:
      return self._vmapped(params, opt_state, batch)
    return self._sharded(params, opt_state, batch)

  def init(self, params: Any) -> tuple[Any, Any]:
    """``(params, opt_state)`` at step 0, laid out and placed as the step returns them.

    The parameters are copied (the step donates them, and must not delete
    the caller's arrays); model-sharded parameters keep their shardings.
    """
    opt_state = self.tx.init(params)
    opt_state = parallel.replicate_workers(opt_state, self.num_workers(opt_state))
    params = jax.tree.map(jnp.array, params)  # a copy (device_put would alias the caller's buffers)
    if zero.shards_params(self.tx):  # ZeRO-3: each worker's chunks (jaxcomp.zero_params)
      params = self.tx.shard_params(params)
    if self.mesh is None:  # committed, as the step's outputs and a restored checkpoint are: one compile
      return jax.device_put((params, opt_state), _default_device())
    return jax.device_put((params, opt_state), self._shardings(params, opt_state, None)[:2])

  def abstract(self, params: Any) -> tuple[Any, Any]:
    """What :meth:`init` returns, as ``jax.ShapeDtypeStruct`` leaves with their shardings; nothing is computed.

    The target to restore a checkpoint of ``(params, opt_state)`` into
    (orbax's ``StandardRestore``): it follows from the parameters' shapes and
    the step's layout, not from a state in memory, so a fresh process (or
    each process of several) builds the same one. Under ``vmap`` (no mesh)
    every array is on the default device, as :meth:`init` puts them.
    """
    params_shape, state_shape = jax.eval_shape(self.init, params)
    if self.mesh is None:
      shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(_default_device()),
                               (params_shape, state_shape))
    else:
      shardings = self._shardings(params_shape if _sharded_params(params_shape) else params, state_shape, None)[:2]
    return jax.tree.map(lambda s, where: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=where),
                        (params_shape, state_shape), shardings)

  def __call__(self, params: Any, opt_state: Any, batch: Any) -> Any:
    """One step over every worker: ``(params, opt_state)``, and ``aux`` per worker if ``worker_step`` returns one."""
    plan, args = self._prepare(params, opt_state, batch)
    params, opt_state, aux = plan.step(*args)
    return (params, opt_state) if aux is None else (params, opt_state, aux)

  def lower(self, params: Any, opt_state: Any, batch: Any) -> jax.stages.Lowered:
    """The step lowered for these inputs (``.compile().as_text()`` shows its collectives)."""
    plan, args = self._prepare(params, opt_state, batch)
    return plan.step.lower(*args)

  def compiles(self) -> int:
    """How many times the step has compiled (once, for inputs laid out as it returns them)."""
    return sum(plan.step._cache_size() for plan in self._plans.values())  # pylint: disable=protected-access

  def _prepare(self, params, opt_state, batch) -> tuple[_Plan, tuple[Any, Any, Any]]:
    """The plan for this structure of inputs, and the inputs placed as it lays them out."""
    key = jax.tree.structure((params, opt_state, batch))
    plan = self._plans.get(key)
    if plan is None:
      plan = self._plans[key] = self._plan(params, opt_state, batch)
    args = (params, opt_state, batch)
    if plan.shardings is not None and not _is_placed(args, plan.shardings):
      self._checked(params, opt_state, batch)  # first: moved as it is, a wrong shape fails in JAX's words
      args = _place(args, plan.shardings)
    return plan, args

  def _plan(self, params, opt_state, batch) -> _Plan:
    donate = (0, 1) if self.donate else ()
    if self.mesh is None:
      return _Plan(None, jax.jit(self.mapped, donate_argnums=donate))
    shardings = self._shardings(params, opt_state, batch)
    step = jax.jit(self.mapped, donate_argnums=donate, out_shardings=(shardings[0], shardings[1], None))
    return _Plan(shardings, step)

  def _shardings(self, params, opt_state, batch) -> tuple[Any, Any, Any]:
    """Where the step's inputs live: parameters replicated unless sharded over a model axis, the
    state split over the workers (:func:`jaxcomp.parallel.worker_shardings`), the batch a row a worker."""
    axes = self.device_axes(opt_state)
    model = _model_axes(opt_state)

    def param(a):
      s = getattr(a, "sharding", None)
      if model and isinstance(s, NamedSharding) and s.mesh == self.mesh:
        return s
      return NamedSharding(self.mesh, P())

    rows = NamedSharding(self.mesh, P(axes))
    placed = (parallel.worker_shardings(params, self.mesh, axes) if _sharded_params(params)
              else jax.tree.map(param, params))
    return (placed, parallel.worker_shardings(opt_state, self.mesh, axes),
            None if batch is None else jax.tree.map(lambda _: rows, batch))

  def _checked(self, params, opt_state, batch) -> None:
    n = self.num_workers(opt_state)
    parallel.check_state(opt_state, n)
    parallel.check_batch(batch, n)
    if zero.shards_params(self.tx) != bool(_sharded_params(params)):
      raise ValueError("data_parallel: the parameters are " + ("whole" if zero.shards_params(self.tx) else "sharded")
                       + " but the optimizer " + ("shards them" if zero.shards_params(self.tx) else "does not")
                       + " (jaxcomp.shard_optimizer(shard_params=...)): make them with step.init(params).")
    parallel.check_state(params, n)

  def _vmapped(self, params, opt_state, batch):
    self._checked(params, opt_state, batch)
    return _explained(self._simulated, self.worker_axes(opt_state))(params, opt_state, batch)

  def _simulated(self, params, opt_state, batch):
    """Simulated workers (all of them, or a device's): ``vmap`` over the rows of the state and batch."""
    axes, param_axes = parallel.worker_axes(opt_state), _param_axes(params)
    return jax.vmap(self._one_worker, in_axes=(param_axes, axes, 0), out_axes=(param_axes, axes, 0),
                    axis_name=self._axis_name)(params, opt_state, batch)

  def _sharded(self, params, opt_state, batch):
    """``shard_map`` over :meth:`device_axes`: a worker per device, or ``vmap`` over each device's workers."""
    self._checked(params, opt_state, batch)
    axes = self.device_axes(opt_state)
    specs, param_specs = parallel.worker_specs(opt_state, axes), parallel.worker_specs(params, axes)
    simulated = self._workers is not None

    def device(params, state, batch):  # one worker per device: its slice of the state and batch
      if simulated:  # several: vmap over this device's rows
        return self._simulated(params, state, batch)
      params, state = parallel.worker_slice((params, state), 0)
      batch = parallel.worker_batch(batch)
      params, state, aux = _model_axes_auto(self._one_worker, self.mesh, params, state)(params, state, batch)
      params, state = parallel.expand_workers((params, state))
      return params, state, jax.tree.map(lambda a: a[None], aux)

    # Collectives over a vmap axis inside shard_map need its varying-axes check off (jaxcomp.parallel).
    step = jax.shard_map(device, mesh=self.mesh, in_specs=(param_specs, specs, P(axes)),
                         out_specs=(param_specs, specs, P(axes)), axis_names=set(axes), check_vma=not simulated)
    return _explained(step, self.worker_axes(opt_state))(params, opt_state, batch)

  def _one_worker(self, params, opt_state, batch):
    sharded = _sharded_params(params)
    if sharded:  # ZeRO-3: worker_step sees the whole parameters, gathered; its new chunks are kept
      params, opt_state = self._gathered(*sharded, opt_state)
    out = self.worker_step(params, opt_state, batch)
    if not isinstance(out, tuple) or len(out) not in (2, 3):
      raise TypeError("worker_step must return (params, opt_state) or (params, opt_state, aux); got "
                      f"{type(out).__name__}{'' if not isinstance(out, tuple) else f' of {len(out)}'}.")
    params, opt_state, aux = out if len(out) == 3 else (*out, None)
    if sharded:
      params = self._kept(*sharded, params)
    return params, opt_state, jax.tree.map(jnp.asarray, aux)

  def _gathered(self, places: list, treedef: Any, where: int, opt_state: Any) -> tuple[Any, Any]:
    """The parameters with their sharded part gathered whole (:meth:`jaxcomp.zero.ShardedTransformation.gather_params`)."""
    whole, opt_state = self.tx.gather_params(places[where], opt_state)
    return treedef.unflatten(places[:where] + [whole] + places[where + 1:]), opt_state

  def _kept(self, places: list, treedef: Any, where: int, params: Any) -> Any:
    """The new parameters with their sharded part cut to this worker's chunks again."""
    new = treedef.flatten_up_to(params)
    return treedef.unflatten(new[:where] + [self.tx.keep_shard(new[where])] + new[where + 1:])

  def __repr__(self):
    where = ", ".join(([f"workers={self._workers}"] if self._workers is not None else [])
                      + ([f"mesh={dict(self.mesh.shape)}"] if self.mesh is not None else []))
    return f"DataParallel({getattr(self.worker_step, '__name__', 'worker_step')}, {where})"


def _default_device() -> jax.Device:
  """Where JAX puts an array it is not told where to put (``jax_default_device``, else this process' first)."""
  device = jax.config.jax_default_device
  if isinstance(device, str):  # a platform's name
    return jax.local_devices(backend=device)[0]
  return device or jax.local_devices()[0]


def _sharded_params(params: Any) -> Optional[tuple[list, Any, int]]:
  """Where ``params`` holds its :class:`~jaxcomp.zero_params.ShardedParams` (the whole tree, or a part of it, as
  ``(params, batch_stats)``): the tree flattened down to it, its treedef and its index, or ``None`` (refused:
  more than one)."""
  is_sharded = lambda x: isinstance(x, zero_params.ShardedParams)
  leaves, treedef = jax.tree.flatten(params, is_leaf=is_sharded)
  where = [i for i, x in enumerate(leaves) if is_sharded(x)]
  if len(where) > 1:
    raise ValueError(f"data_parallel: the parameters hold {len(where)} jaxcomp ShardedParams; a step gathers one.")
  return (leaves, treedef, where[0]) if where else None


def _param_axes(params: Any) -> Any:
  """``vmap`` axes of the parameters: shared (``None``), or a row a worker where sharded (ZeRO-3)."""
  return parallel.worker_axes(params) if _sharded_params(params) else None


def _per_shard_states(opt_state: Any) -> list[sharded.PerShardState]:
  leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, sharded.PerShardState))
  return [x for x in leaves if isinstance(x, sharded.PerShardState)]


def _model_axes(opt_state: Any) -> set[str]:
  return {a for s in _per_shard_states(opt_state) for a in s.axes}


def _model_axes_auto(fn: Callable[..., Any], mesh: jax.sharding.Mesh, params: Any, opt_state: Any):
  """``fn`` run with the mesh's Explicit model axes (:func:`jaxcomp.per_shard`'s) as Auto ones.

  On Explicit axes a model's own code must say how every ambiguous product is
  sharded (a Megatron row-split ``Dense`` contracts a sharded dimension, which
  JAX refuses without ``out_sharding``); a model written for Auto axes would
  not run. Inside ``worker_step`` the model axes are therefore Auto, and the
  parameters and state come back in the layout they came in with.
  """
  explicit = tuple(a for a in _model_axes(opt_state) if a in mesh.explicit_axes)
  if not explicit:
    return fn
  spec = lambda a: jax.typeof(a).sharding.spec
  out = (jax.tree.map(spec, params), jax.tree.map(spec, opt_state), P())
  return jax.sharding.auto_axes(fn, axes=explicit, out_sharding=out)


def _is_placed(tree: Any, shardings: Any) -> bool:
  """Whether every leaf of ``tree`` is laid out as ``shardings`` says."""
  leaves, treedef = jax.tree.flatten(tree)
  return all(getattr(a, "sharding", None) == s for a, s in zip(leaves, treedef.flatten_up_to(shardings)))


def _place(tree: Any, shardings: Any) -> Any:
  """``tree`` with every leaf not laid out as ``shardings`` says moved there."""
  leaves, treedef = jax.tree.flatten(tree)
  targets = treedef.flatten_up_to(shardings)
  return treedef.unflatten([a if getattr(a, "sharding", None) == s else jax.device_put(a, s)
                            for a, s in zip(leaves, targets)])


def _explained(fn: Callable[..., Any], axes: tuple[str, ...]) -> Callable[..., Any]:
  """``fn``, with JAX's errors about the exchange's axes retold as what to change.

  An axis name the step does not bind (a compressor built for other axes),
  and parameters that come out different on each worker (a chain that
  exchanges nothing over the workers: ``axis_name=None``) are raised by
  ``vmap``/``shard_map`` in their own terms; this names the fix.
  """
  name = axes[0] if len(axes) == 1 else axes

  def run(*args):
    try:
      return fn(*args)
    except NameError as e:
      if "unbound axis name" not in str(e):
        raise
      raise ValueError(
          f"{e}: the step's workers are over the axes {axes}, but the compressor (or worker_step) uses "
          f"another: build it with axis_name={name!r} (or give data_parallel the mesh or axis_name it "
          "names).") from None
    except ValueError as e:
      text = str(e)
      if not ("mapped output" in text or ("out_specs" in text and "replicat" in text)):
        raise
      raise ValueError(
          f"worker_step returned parameters or optimizer state (not worker-local) that differ between "
          f"the workers of {axes}: nothing in the chain averaged the gradients over them. Build the "
          f"compressor with axis_name={name!r} (jaxcomp.terngrad(axis_name={name!r}), or "
          f"jaxcomp.get_transform('none', axis_name={name!r}) for the float mean).") from None

  return run
