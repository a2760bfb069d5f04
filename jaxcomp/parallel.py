"""Named worker axes: their collectives, and optimizer states laid out over them.

The exchange itself (:mod:`jaxcomp.exchange`) uses only the named-axis
collectives of this module, so the same code runs under

* ``jax.vmap(..., axis_name="workers")``: N simulated workers on one device,
* ``jax.pmap(..., axis_name="workers")`` (legacy, still supported),
* ``jax.jit(jax.shard_map(..., mesh=...))`` (the modern path),
* combinations, with a tuple of axis names, e.g. ``("devices", "workers")``
  for ``vmap`` inside ``shard_map``: workers are numbered major to minor,
  ``index = i_devices * n_workers + i_workers``,
* multi-process JAX (``jax.distributed.initialize``) over a global mesh.

Under ``vmap`` the gathered payload is not batched (it is the same for every
worker), so JAX decodes and averages it once, not once per simulated worker.

Under ``shard_map`` with its default ``check_vma=True``, take gradients with
respect to :func:`vary` ``(params, axis_name)``: ``jax.grad`` of parameters
passed in replicated returns them already summed over the devices (a float
all-reduce), which the transforms refuse with an error that says so. Collectives
over a ``vmap`` axis inside ``shard_map`` need ``shard_map(..., check_vma=False)``
in JAX 0.10 (its varying-axes check does not know vmap axis names).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import jax
import jax.numpy as jnp
from jax import lax
import optax

from jaxcomp import core

AxisName = Union[None, str, Sequence[str]]


def axis_names(axis_name: AxisName) -> tuple[str, ...]:
  """``axis_name`` as a tuple of names (empty for ``None``); raises TypeError on anything else."""
  if axis_name is None:
    return ()
  if isinstance(axis_name, str):
    return (axis_name,)
  names = tuple(axis_name)
  if not all(isinstance(n, str) for n in names):
    raise TypeError(f"axis_name must be None, a string or a tuple of strings; got {axis_name!r}.")
  return names


def axis_size(axis_name: AxisName) -> int:
  """Number of workers along ``axis_name`` (1 for ``None``)."""
  size = 1
  for n in axis_names(axis_name):
    size *= lax.axis_size(n)
  return size


def axis_index(axis_name: AxisName) -> jax.Array:
  """This worker's index, major to minor over a tuple of names (0 for ``None``)."""
  index = jnp.int32(0)
  for n in axis_names(axis_name):
    index = index * lax.axis_size(n) + lax.axis_index(n)
  return index


def varying_axes(x: Any) -> frozenset:
  """The manual (``shard_map``) axes ``x`` is typed as varying over; empty elsewhere.

  ``x`` is an array, a tracer or a ``ShapeDtypeStruct``. Under
  ``shard_map(..., check_vma=False)`` nothing is typed as varying.
  """
  mat = getattr(x, "manual_axis_type", None)  # a ShapeDtypeStruct
  if mat is None:
    mat = getattr(jax.typeof(x), "manual_axis_type", None)
  return frozenset(getattr(mat, "varying", None) or ())


def vary_over(x: jax.Array, axes: frozenset) -> jax.Array:
  """``x`` typed as varying over the manual ``axes`` (a no-op where it already is)."""
  missing = tuple(sorted(axes - varying_axes(x)))
  return lax.pcast(x, missing, to="varying") if missing else x


def checked_axes(axis_name: AxisName) -> frozenset:
  """The names of ``axis_name`` that are ``shard_map`` axes with its varying-axes check on.

  Only over these does a value's type say whether it differs between workers
  (``check_vma=True``, ``shard_map``'s default): ``lax.axis_index`` varies over
  such an axis, and over nothing else.
  """
  names = [n for n in axis_names(axis_name) if is_device_axis(n)]
  return frozenset(n for n in names if n in varying_axes(lax.axis_index(n)))


def vary(tree: Any, axis_name: AxisName) -> Any:
  """``tree`` typed as differing between the workers of ``axis_name``: take gradients with it.

  Under ``jax.shard_map`` with ``check_vma=True`` (the default), parameters
  passed in replicated (``P()``) are typed as the same on every device, and
  ``jax.grad`` with respect to them returns the gradient *summed over the
  devices* (the transpose of replication is a float ``psum``): the full-size
  float all-reduce that compression is there to avoid, and a gradient N times
  the mean. Differentiating with respect to ``vary(params, axis_name)``
  instead gives each worker its own gradient, which the compressed exchange
  then averages. Apply the updates to the original ``params``::

    grads = jax.grad(loss_fn)(jaxcomp.parallel.vary(params, "workers"), batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)

  A no-op under ``vmap``, ``pmap``, ``shard_map(..., check_vma=False)`` and
  with ``axis_name=None``, so one step function serves every layout.
  """
  axes = checked_axes(axis_name)
  if not axes:
    return tree
  return jax.tree.map(lambda a: vary_over(a, axes), tree)


def replicated_cond(pred: jax.Array, true_fn, false_fn, *operands: Any) -> Any:
  """``lax.cond(pred, true_fn, false_fn, *operands)`` for a ``pred`` identical on every worker.

  The collectives in the branch taken run on every worker alike, so this works
  under ``vmap``, ``pmap``, ``shard_map`` and their combinations. Under
  ``shard_map`` both branches must also agree on which manual axes each output
  varies over (a fresh mean is invarying, a carried worker-local leaf varying):
  every output gets the union of both branches'.
  """
  varying = jax.tree.map(lambda a, b: varying_axes(a) | varying_axes(b),
                         jax.eval_shape(true_fn, *operands), jax.eval_shape(false_fn, *operands))

  def branch(fn):
    return lambda *ops: jax.tree.map(vary_over, fn(*ops), varying)

  return lax.cond(pred, branch(true_fn), branch(false_fn), *operands)


def check_not_reduced(leaves: Sequence[Any], paths: Sequence[str], axis_name: AxisName, who: str) -> None:
  """Raises if a gradient arrives already summed over the worker axis (``shard_map``'s typing says so).

  Exchanging such a gradient again would send what was already all-reduced
  in float, and average a sum. Only checkable where the check is on (see
  :func:`checked_axes`); elsewhere it passes.
  """
  axes = checked_axes(axis_name)
  for leaf, path in zip(leaves, paths):
    missing = sorted(axes - varying_axes(leaf))
    if missing:
      raise ValueError(
          f"{who}: the gradient {path!r} is the same on every worker of {missing[0]!r} "
          "(shard_map's check_vma typing): jax.grad with respect to parameters passed in "
          "replicated (P()) has already summed it over the devices with a float all-reduce, so "
          "there is nothing left to compress and the mean would be N times too large. Take the "
          "gradient with respect to jaxcomp.parallel.vary(params, axis_name) and apply the "
          "updates to the original params (see that function), or use "
          "shard_map(..., check_vma=False).")


def all_gather(tree: Any, axis_name: AxisName) -> Any:
  """``lax.all_gather`` of every array in ``tree`` with one leading worker axis.

  A tuple of names is gathered minor first, so the leading axis follows
  :func:`axis_index`.
  """
  names = axis_names(axis_name)
  if not names:
    return jax.tree.map(lambda a: a[None], tree)

  manual = set(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()))

  def gather(a):
    shape = a.shape
    a = a.reshape(-1)
    for n in reversed(names):
      # Under shard_map the gathered value is the same on every device: say so
      # ("invarying"), so that shard_map's replication check accepts the mean.
      to = "invarying" if n in manual else "varying"
      one = lambda piece, n=n, to=to: lax.all_gather(piece, n, to=to)
      a = in_pieces(one, a, a.nbytes) if is_device_axis(n) else one(a)
    return a.reshape((-1,) + shape)

  return jax.tree.map(gather, tree)


def all_to_all(tree: Any, axis_name: AxisName) -> Any:
  """``lax.all_to_all`` over the leading axis of every array in ``tree``.

  On entry the leading axis (of size ``N``, the number of workers) is indexed
  by destination; on return by source: worker ``w`` gets at ``[v]`` what
  worker ``v`` held at ``[w]``. Workers are numbered as
  :func:`jaxcomp.parallel.axis_index` numbers them; over a tuple of names the
  leading axis is split into one axis per name and each is exchanged over its
  own name (``out[a][m] = in[m][a]`` coordinate by coordinate).
  """
  names = axis_names(axis_name)
  if not names:
    return tree
  sizes = tuple(lax.axis_size(n) for n in names)

  def exchange(a):
    rest = a.shape[1:]
    a = a.reshape(sizes + (-1,))
    for i, n in enumerate(names):
      if is_device_axis(n):
        one = lambda piece, i=i, n=n: lax.all_to_all(piece, n, split_axis=i, concat_axis=i, tiled=True)
        a = in_pieces(one, a, a.nbytes // sizes[i])
      else:
        # A vmap axis of simulated workers: gather (free under vmap: the
        # workers' values are already stacked) and take this worker's slot.
        # (JAX 0.10's batching rule of all_to_all mishandles an operand that
        # is the same on every worker, such as the agreed per-chunk scalars:
        # it returned N times too many values.)
        stacked = lax.all_gather(a, n)
        mine = lax.dynamic_index_in_dim(stacked, lax.axis_index(n), axis=i + 1, keepdims=False)
        a = jnp.moveaxis(mine, 0, i)
    return a.reshape((-1,) + rest)

  return jax.tree.map(exchange, tree)


# XLA:CPU's collectives (gloo over TCP) move one large buffer well below the
# link's rate, and pieces of at most 256 KiB at the wire's rate (docs/design.md,
# "Choices in the code"). So on CPU the device collectives of the exchange go in pieces of at most
# PIECE_BYTES per message. GPU and TPU collectives (NCCL, ICI) pipeline large
# buffers themselves; there the plain single call is kept (one piece).
PIECE_BYTES = 256 * 1024


def pieces_for(message_bytes: int) -> int:
  """How many pieces a collective whose messages are ``message_bytes`` long is split into."""
  if jax.default_backend() != "cpu":
    return 1
  return max(1, -(-int(message_bytes) // PIECE_BYTES))


def in_pieces(collective, a: jax.Array, message_bytes: int) -> jax.Array:
  """``collective(a)``, applied to slices of ``a``'s last axis and joined on it.

  ``collective`` must act on the last axis elementwise (an all-gather or an
  all-to-all over a leading axis does): then the joined result equals
  ``collective(a)`` exactly. The number of slices is :func:`pieces_for`
  ``(message_bytes)``: one (the plain call) except on CPU.
  """
  m = a.shape[-1]
  k = min(pieces_for(message_bytes), m)
  if k <= 1:
    return collective(a)
  bounds = [m * i // k for i in range(k + 1)]
  parts = [collective(lax.slice_in_dim(a, lo, hi, axis=a.ndim - 1)) for lo, hi in zip(bounds, bounds[1:])]
  return jnp.concatenate(parts, axis=-1)


def max_leading(x: jax.Array) -> jax.Array:
  """The maximum over ``x``'s leading axis (a gathered worker axis), by halving: exact, as ``lax.pmax``."""
  while x.shape[0] > 1:
    if x.shape[0] % 2:
      x = jnp.concatenate([jnp.maximum(x[:1], x[-1:]), x[1:-1]])
      continue
    h = x.shape[0] // 2
    x = jnp.maximum(x[:h], x[h:])
  return x[0]


def is_device_axis(name: str) -> bool:
  """Whether worker axis ``name`` spans devices (a collective crosses a wire) or ``vmap``'s workers.

  ``shard_map`` and (in JAX 0.10) ``pmap`` axes are manual mesh axes; any
  other axis bound here is a ``vmap`` axis of simulated workers.
  """
  return name in set(getattr(jax.sharding.get_abstract_mesh(), "axis_names", ()))


def _reduce(kind: str, tree: Any, axis_name: AxisName) -> Any:
  # Minor axis first: under shard_map with vmap inside, reducing over the vmap
  # axis first means the device collective moves one value per device, not one
  # per simulated worker. Over a vmap axis the workers' values are stacked
  # (all_gather is free there) and reduced with vectorized halving, because
  # lax.psum's vmap rule becomes a slow major-axis reduce on XLA:CPU.
  collective = {"sum": lax.psum, "mean": lax.pmean, "max": lax.pmax}[kind]
  for n in reversed(axis_names(axis_name)):
    if is_device_axis(n):
      def device(a, n=n):
        if kind != "max" and a.dtype == jnp.bfloat16 and jax.default_backend() == "cpu":
          total = _bfloat16_sum_on_cpu(a, n)
          return total / lax.axis_size(n) if kind == "mean" else total
        return collective(a, n)
      tree = jax.tree.map(device, tree)
    else:
      def local(a, n=n):
        stacked = lax.all_gather(a, n)
        if kind == "max":
          return max_leading(stacked)
        total = core.sum_leading(stacked).astype(a.dtype)
        return total / stacked.shape[0] if kind == "mean" else total
      tree = jax.tree.map(local, tree)
  return tree


def _bfloat16_sum_on_cpu(a: jax.Array, name: str) -> jax.Array:
  """``lax.psum(a, name)`` of a bfloat16 array over a device axis, moving 16-bit values.

  XLA:CPU promotes a bfloat16 all-reduce to float32 (the collective then
  moves 4 bytes a value, twice what the caller counts). On CPU the sum is
  therefore built from collectives that move bits: a reduce-scatter (an
  all-to-all of the bfloat16 bits as uint16, in chunks of ``1/N``), each
  worker's chunk summed in float32 and rounded to bfloat16 once, and an
  all-gather of the summed chunks' bits. Each worker sends and receives
  ``2(N − 1)/N`` of the array's bytes, as a ring all-reduce does. GPU and TPU
  reduce bfloat16 natively (NCCL, ICI): there :func:`psum` keeps ``lax.psum``.
  """
  workers = lax.axis_size(name)
  size = a.size
  chunk = -(-size // workers)
  bits = lax.bitcast_convert_type(jnp.pad(a.reshape(-1), (0, workers * chunk - size)), jnp.uint16)
  bits = bits.reshape(workers, chunk)  # row j: the chunk worker j sums
  scatter = lambda piece: lax.all_to_all(piece, name, split_axis=0, concat_axis=0, tiled=True)
  received = in_pieces(scatter, bits, bits.nbytes // workers)  # row v: worker v's values of my chunk
  values = lax.bitcast_convert_type(received, jnp.bfloat16).astype(jnp.float32)
  mine = lax.bitcast_convert_type(core.sum_leading(values).astype(jnp.bfloat16), jnp.uint16)
  manual = set(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()))
  to = "invarying" if name in manual else "varying"
  gather = lambda piece: lax.all_gather(piece, name, to=to)
  summed = in_pieces(gather, mine, mine.nbytes)  # (workers, chunk)
  return lax.bitcast_convert_type(summed.reshape(-1)[:size], jnp.bfloat16).reshape(a.shape)


def pmax(tree: Any, axis_name: AxisName) -> Any:
  """``lax.pmax`` over every axis in ``axis_name``."""
  return _reduce("max", tree, axis_name)


def pmean(tree: Any, axis_name: AxisName) -> Any:
  """``lax.pmean`` over every axis in ``axis_name``."""
  return _reduce("mean", tree, axis_name)


def psum(tree: Any, axis_name: AxisName) -> Any:
  """``lax.psum`` over every axis in ``axis_name``.

  A bfloat16 array over a device axis on CPU is summed by
  :func:`_bfloat16_sum_on_cpu` (16-bit values on the wire, where XLA:CPU's
  all-reduce would move float32).
  """
  return _reduce("sum", tree, axis_name)


# -- laying optimizer states over workers -----------------------------------


def _is_local(x: Any) -> bool:
  return isinstance(x, core.WorkerLocal)


# optax wrappers whose own state is per worker around a compression transform,
# and what to use instead (jaxcomp.wrappers).
_PER_WORKER_WRAPPERS = {
    optax.MultiStepsState: (
        "optax.MultiSteps accumulates each worker's own gradients (acc_grads) and runs the wrapped "
        "chain, exchange included, on every mini-step; use jaxcomp.multi_steps(chain, k), which "
        "accumulates locally and exchanges every k-th step"),
    optax.ApplyIfFiniteState: (
        "optax.apply_if_finite decides on each worker's own gradients, so a NaN on one worker "
        "would skip the step there only; use jaxcomp.apply_if_finite(chain, n, axis_name=...), "
        "which decides on every worker's gradients together"),
}


def _check_wrappers(state: Any) -> None:
  """Raises if an optax wrapper with per-worker state of its own wraps a compression transform."""
  kinds = tuple(_PER_WORKER_WRAPPERS)
  found = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, kinds))[0]
  for path, x in found:
    if isinstance(x, kinds) and any(map(_is_local, jax.tree.leaves(x, is_leaf=_is_local))):
      raise ValueError(
          f"opt_state{jax.tree_util.keystr(path)} is the state of an optax wrapper "
          f"({type(x).__name__}) around a compression transform: its own state is per worker, which "
          f"a state laid over workers cannot hold. {_PER_WORKER_WRAPPERS[type(x)]}.")


def worker_axes(state: Any) -> Any:
  """``in_axes``/``out_axes`` for ``vmap``/``pmap`` of an optimizer state.

  Leaves inside a :class:`~jaxcomp.core.WorkerLocal` (residuals, per-worker
  counters) get ``0``; every other leaf (step counters, keys, momentum of the
  optimizer that follows) is the same on every worker and gets ``None``.
  ``vmap`` refuses an output mapped ``None`` that differs between workers;
  ``pmap`` does not (it returns device 0's), so a compression transform's
  update refuses a worker-local part that :func:`replicate_workers` did not
  lay out (:func:`jaxcomp.worker_layout.check_laid_out`). Raises a ValueError
  naming the path of an ``optax.MultiSteps`` or ``optax.apply_if_finite``
  state around a compression transform (use :mod:`jaxcomp.wrappers`
  instead), or of a laid-out leaf that lost its worker axis (a checkpoint of
  one worker's view: :func:`from_checkpoint`).

  Under ``pmap``, as the Flax examples write their steps::

    state = jaxcomp.parallel.replicate_workers(state, jax.local_device_count())
    axes = jaxcomp.parallel.worker_axes(state)
    p_train_step = jax.pmap(train_step, axis_name="batch", in_axes=(axes, 0), out_axes=(axes, 0))
  """
  _check_wrappers(state)
  worker_layout.check_rows(state)

  def axes(x):
    if _is_local(x):
      return jax.tree.map(lambda _: 0, x)
    return None

  return jax.tree.map(axes, state, is_leaf=_is_local)


def worker_specs(state: Any, axis: Union[str, tuple[str, ...]]) -> Any:
  """``shard_map`` partition specs: worker-local leaves split over ``axis`` (checked as :func:`worker_axes`)."""
  _check_wrappers(state)
  from jax.sharding import PartitionSpec as P

  def spec(x):
    if _is_local(x):
      return jax.tree.map(lambda _: P(axis), x)
    return P()

  return jax.tree.map(spec, state, is_leaf=_is_local)


def worker_shardings(state: Any, mesh: Any, axis: Union[str, tuple[str, ...]]) -> Any:
  """``NamedSharding`` s of ``state`` on ``mesh`` as :func:`worker_specs` lays it out.

  ``jax.device_put(state, worker_shardings(state, mesh, axis))`` before the
  first step gives the state the layout a jitted ``shard_map`` step returns
  it in. The state of :func:`jaxcomp.per_shard` is split over its model axes
  as well. A state straight from ``init`` sits on one device, a layout of its
  own: the step would compile once for it and again for every later step.
  """
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  from jaxcomp import sharded  # pylint: disable=g-import-not-at-top

  def place(x, specs):
    if isinstance(x, sharded.PerShardState):  # every leaf split over the model axes, after the worker axis
      # spelt as a jitted step returns it (Explicit axes: to the leaf's rank), or the step's fast
      # path would miss its cache on the second call
      pad = not set(x.axes) <= set(mesh.auto_axes)
      specs = jax.tree.map(lambda s, a: P(*s, x.axes, *[None] * ((jnp.ndim(a) - len(s) - 1) * pad)), specs, x)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)

  return jax.tree.map(place, state, worker_specs(state, axis), is_leaf=lambda x: isinstance(x, sharded.PerShardState))


def replicate_workers(state: Any, num_workers: int) -> Any:
  """Gives every worker-local leaf a leading axis of ``num_workers`` (checked as :func:`worker_axes`).

  Each :class:`~jaxcomp.core.WorkerLocal` comes back marked as laid out
  (:class:`~jaxcomp.core.LaidOut`): the update that sees it under ``pmap``
  knows it was mapped a row per worker. A :class:`~jaxcomp.core.ShardLocal`
  (a sharded optimizer state) has its rows already: it is checked
  (:func:`check_state`), not broadcast.
  """
  _check_wrappers(state)
  is_shards = lambda x: isinstance(x, core.ShardLocal)
  check_state([x for x in jax.tree.leaves(state, is_leaf=is_shards) if is_shards(x)], num_workers)

  def lay_out(x):
    if not _is_local(x) or is_shards(x):
      return x
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers,) + jnp.shape(a)), x)

  return mark_laid_out(jax.tree.map(lay_out, state, is_leaf=_is_local))


def mark_laid_out(state: Any) -> Any:
  """``state`` with every :class:`~jaxcomp.core.WorkerLocal` marked as laid out (:class:`~jaxcomp.core.LaidOut`)."""
  mark = lambda x: core.LaidOut(*x) if _is_local(x) and not isinstance(x, core.LaidOut) else x
  return jax.tree.map(mark, state, is_leaf=_is_local)


def _map_local(fn, state: Any) -> Any:
  def apply(x):
    return jax.tree.map(fn, x) if _is_local(x) else x

  return jax.tree.map(apply, state, is_leaf=_is_local)


def worker_slice(state: Any, index: int) -> Any:
  """The state as worker ``index`` sees it (worker-local leaves indexed).

  With one worker per device under ``shard_map`` (each device holds a worker
  axis of size 1), ``worker_slice(state, 0)`` is that device's worker;
  :func:`expand_workers` puts the axis back before returning.
  """
  return _map_local(lambda a: a[index], state)


def expand_workers(state: Any) -> Any:
  """Adds a leading worker axis of size 1 to every worker-local leaf."""
  return _map_local(lambda a: a[None], state)


def check_state(state: Any, num_workers: int) -> Any:
  """``state`` unchanged, once every worker-local leaf's leading axis is checked to be ``num_workers``.

  A state straight from ``tx.init`` has no worker axis: split over the
  devices as it is, each device would get a slice of one residual (or of a
  tensor's rows) instead of its own, and the parameters would come back
  reshaped. This raises a ValueError naming the leaf and the fix instead.
  """
  found = jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_local)[0]
  for path, local in found:
    for sub, leaf in (jax.tree_util.tree_flatten_with_path(local)[0] if _is_local(local) else ()):
      shape = tuple(jnp.shape(leaf))
      if not shape or shape[0] != num_workers:
        raise ValueError(
            f"opt_state{jax.tree_util.keystr(path)}{jax.tree_util.keystr(sub)} has shape {shape}: a "
            f"worker-local leaf needs a leading axis of {num_workers}, one row per worker (the state "
            "straight from tx.init has none). Make the state with step.init(params) (jaxcomp."
            f"data_parallel), or jaxcomp.parallel.replicate_workers(tx.init(params), {num_workers}).")
  return state


# -- batches laid over workers ----------------------------------------------


def _check_leading(batch: Any, expected: int, where: str) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]:
    shape = jnp.shape(leaf)
    if not shape or shape[0] != expected:
      raise ValueError(
          f"batch{jax.tree_util.keystr(path)} has shape {tuple(shape)} {where}; the leading axis must "
          f"be {expected}: one row per worker, each row that worker's whole batch (reshape "
          f"[workers * b, ...] to [workers, b, ...]).")


def check_batch(batch: Any, num_workers: int) -> Any:
  """``batch`` unchanged, once every leaf's leading axis is checked to be ``num_workers``.

  A batch laid over workers has one row per worker (``[num_workers, b, ...]``),
  what ``vmap(..., in_axes=0)`` maps and ``shard_map(..., in_specs=P(axis))``
  splits. A leading size that is a multiple of the workers would be split
  silently (each device getting several rows, of which a recipe indexing
  ``b[0]`` uses one): this raises a ValueError naming the leaf instead.
  """
  _check_leading(batch, num_workers, f"for {num_workers} workers")
  return batch


def worker_batch(batch: Any) -> Any:
  """This worker's batch inside ``shard_map`` with one worker per device.

  Each device holds a leading axis of size 1 of a batch laid over workers
  (``in_specs=P(axis)``); this drops it, as ``jax.tree.map(lambda b: b[0],
  batch)`` does, but raises a ValueError naming the leaf if a device holds
  more rows than one (the batch's leading size was not the number of
  workers). With several workers per device (``vmap`` inside ``shard_map``)
  ``vmap`` maps the rows instead.
  """
  _check_leading(batch, 1, "on this device (its share of the global batch)")
  return jax.tree.map(lambda b: b[0], batch)


# Checkpoints of laid-out states (and the check an update makes) live in jaxcomp.worker_layout.
from jaxcomp import worker_layout  # pylint: disable=g-import-not-at-top
from jaxcomp.worker_layout import from_checkpoint, to_checkpoint  # pylint: disable=g-import-not-at-top
