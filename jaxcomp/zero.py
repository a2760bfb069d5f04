"""Sharded optimizer states: each worker keeps and updates 1/N of them (ZeRO stages 1 and 2).

A replicated optimizer keeps every parameter's state whole on every worker:
with AdamW and float32 that is 8 bytes a parameter beside the parameters'
own 4. :func:`shard_optimizer` wraps the user's chain, as written::

  tx = jaxcomp.shard_optimizer(
      optax.chain(jaxcomp.terngrad(axis_name="workers"), optax.adamw(1e-3)),
      axis_name="workers", num_workers=8)

and an update then runs, on each worker ``j`` of ``N``:

1. the compression transform at the chain's head **reduce-scatters** the
   gradients (:mod:`jaxcomp.exchange.scatter`): worker ``j`` gets chunk ``j``
   of each averaged tensor (compressed: the two-phase exchange's first phase,
   error feedback per chunk as there; float: a float reduce-scatter);
2. the rest of the chain updates **only that chunk**, with the chunk of the
   parameters (AdamW's weight decay) and its own state for it: its moments
   are ``(c,)`` per tensor, ``c ≈ n / N``;
3. the updates' chunks come back to every worker by an **all-gather**
   (``jaxcomp.metrics``' ``gather_bytes``): in float by default, so every
   replica adds the same update to the same parameters and stays the
   replicated step's; or compressed (``gather=``), with error feedback.

What is per shard (:class:`~jaxcomp.core.ShardLocal`, laid over workers
as a worker-local part: ``jaxcomp.data_parallel`` and the layout helpers of
:mod:`jaxcomp.parallel` handle it) is the whole state of every transform of
the chain but the compression transform, whose residuals are each worker's
own anyway (whole tensors: each worker encodes its whole gradient) and
whose keys and counters stay as they are. A tensor of fewer than
``num_workers · align`` values is not cut: it is averaged whole and its state
stays whole on every worker (biases, norms: a small part of a model).

On hosts of several devices the compressor takes ``axis_name="hosts",
within="local"`` and :func:`shard_optimizer` both axes: every device is a
worker of the layout, and the reduce-scatter runs in two hops, compressed
inside the host and again between hosts
(:func:`jaxcomp.exchange.scatter.two_hop_steps`, ZeRO++'s hierarchical qgZ).
With ``within=`` on :func:`shard_optimizer` too, the state (and the
parameters) is cut over a host's devices only and every host keeps a whole
copy, updated alike: only the compressed gradient crosses hosts.

The chain must start with the compression transform
(``jaxcomp.terngrad(...)``, ..., or ``jaxcomp.get_transform("none", ...)``
for float). Transforms that act element by element (SGD with momentum,
Adam(W), Lion, weight decay, learning-rate schedules) give the replicated
numbers; a global norm must be :func:`global_norm`'s
(:func:`clip_by_global_norm`); those whose state says they look across a
tensor are refused by name (Adafactor, SM3, NovoGrad, ``add_noise``,
``apply_if_finite``), and LAMB's and LARS's trust ratios, whose state is
empty, would be per chunk (docs/zero.md has the table of optax's optimizers).

References:
  Rajbhandari, Rasley, Ruwase, He. *ZeRO: Memory Optimizations Toward
  Training Trillion Parameter Models*. SC 2020, §5.1 (P_os, P_os+g).
  Wang et al. *ZeRO++: Extremely Efficient Collective Communication for
  Giant Model Training*. arXiv:2306.10209, §3 (qgZ: the gradient
  reduce-scatter compressed, as step 1 does with any jaxcomp compressor;
  §3.3, its two hops).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxcomp import compress_update
from jaxcomp import core
from jaxcomp import parallel
from jaxcomp import zero_params
from jaxcomp.count import Count
from jaxcomp.exchange import buckets
from jaxcomp.exchange import scatter
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase
from jaxcomp.transforms import CompressState

GATHER_METRICS = ("gather_bytes", "bytes_on_wire", "received_bytes")


class ShardedOptimizerState(NamedTuple):
  """State of :func:`shard_optimizer`.

  ``replicated``: the chain's state with what is the same on every worker
  (the compression transform's state, step counts, the state of tensors
  kept whole; the rest masked); ``local.residual``: the chain's state with
  the rest, each worker's shard; ``local.metrics``: the bytes of the
  updates' all-gather (and of a :func:`global_norm`'s sum).
  """

  replicated: Any
  local: core.ShardLocal
  gather: Optional["GatherState"] = None  # with gather=: the updates' all-gather compressed


class GatherState(NamedTuple):
  """The compressed all-gather's state: a key (the same on every worker) and each worker's error feedback.

  ``local.residual`` holds, per cut tensor, what this worker's chunk of the
  update lost to the codec so far (``optax.MaskedNode`` for a whole tensor).
  """

  key: jax.Array
  local: core.ShardLocal


def shard_optimizer(tx: optax.GradientTransformation, *, axis_name: parallel.AxisName, num_workers: int,
                    align: int = scatter.DEFAULT_ALIGN, bucket_bytes: int = buckets.DEFAULT_BUCKET_BYTES,
                    gather: Optional[core.Compressor] = None, seed: int = 0, shard_params: bool = False,
                    param_gather: Optional[core.Compressor] = None, within: parallel.AxisName = None,
                    host_devices: Optional[int] = None):
  """``tx`` with its state sharded over the workers (see the module docstring), and its parameters if asked.

  Args:
    tx: the chain, starting with a compression transform over ``axis_name``.
    axis_name: the worker axis (as the compressor's; with its ``within``, its
      ``axis_name`` and ``within`` axes, in that order).
    num_workers: the workers the state is cut for (the axis' size).
    align: chunks hold a multiple of this many values (a compressor's whole
      bytes and buckets: :data:`jaxcomp.exchange.scatter.DEFAULT_ALIGN` serves
      every registered one); tensors under ``num_workers · align`` stay whole.
      Where the compressors allow, an ``align`` that cuts the tensors without
      padding (512 for float or 64-value blocks and tensors of power-of-two
      sizes) spares ``shard_params`` a second copy of the gathered weights
      (docs/zero.md, "Memory per device").
    bucket_bytes: the updates' all-gather is fused in buckets of about this
      many bytes (:mod:`jaxcomp.exchange.buckets`).
    gather: a compressor for the updates' all-gather (e.g. ``jaxcomp.Int8()``:
      a chunk of ``c`` values crosses as ``c + 4`` bytes instead of ``4c``);
      ``None`` (default): float, and the replicas are the replicated step's.
      Each worker encodes its own chunks (their own scales, no agreement
      round) with error feedback: what a chunk's update lost is added to its
      next one, so the parameters lag the float ones by at most one residual.
      Every worker decodes the same payloads: the replicas stay identical.
    seed: seeds the key of a stochastic ``gather`` codec.
    shard_params: also shard the parameters (ZeRO stage 3,
      :mod:`jaxcomp.zero_params`): each worker stores its chunks only, and
      gathers the parameters at the start of a step. The updates are then
      not gathered: they come back zero outside this worker's chunks.
      ``jaxcomp.data_parallel`` runs the steps around ``worker_step``.
    param_gather: with ``shard_params``, a deterministic compressor for the
      parameters' all-gather (qwZ: ``jaxcomp.Int8()`` or a block quantizer);
      ``None``: float, and the step is the replicated one. Each worker's own
      chunk stays exact: no error feedback is needed.
    within: cut the state (and the parameters) over a host's devices only,
      the last axes of ``axis_name`` (``host_devices`` of them): every host
      keeps a whole copy, cut over its devices, and updates it alike, so that
      only the compressor's exchange crosses hosts (hybrid sharding, ZeRO++'s
      hpZ carried to the whole step). The compressor takes ``within`` too.
    host_devices: the size of ``within``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates are whole
    (the same on every worker) and whose state is a
    :class:`ShardedOptimizerState`; with ``shard_params``, a
    :class:`ShardedTransformation` (the same ``init`` and ``update``, and the
    parameters' steps).
  """
  if not isinstance(num_workers, int) or num_workers < 1:
    raise ValueError(f"num_workers must be a positive int; got {num_workers!r}.")
  _check_within(axis_name, num_workers, within, host_devices)
  scatter.split(0, 1, align)  # validates align
  buckets.check_bucket_bytes(bucket_bytes)
  for name, codec in (("gather", gather), ("param_gather", param_gather)):
    _check_gather_codec(name, codec)
  if param_gather is not None and (not shard_params or param_gather.unbiased):
    raise ValueError(f"jaxcomp.shard_optimizer(param_gather={type(param_gather).__name__}(...)) takes "
                     "shard_params=True and a deterministic codec (int8, a block quantizer): the master chunks are "
                     "encoded afresh every step, so a stochastic one would need a key of its own.")
  sharding = _Sharding(tx, axis_name, num_workers, align, bucket_bytes, gather, seed, shard_params, param_gather,
                       within, host_devices or 0)
  if shard_params:
    return ShardedTransformation(sharding.init, sharding.update, sharding.shard_params, sharding.gather_params,
                                 sharding.keep_shard, sharding.unshard)
  return optax.GradientTransformationExtraArgs(sharding.init, sharding.update)


def _check_within(axis_name: parallel.AxisName, num_workers: int, within: parallel.AxisName,
                  host_devices: Optional[int]) -> None:
  """Refuses a ``within`` that is not the last axes of ``axis_name``, or a ``host_devices`` that does not fit it."""
  if within is None and host_devices is None:
    return
  names, inner = parallel.axis_names(axis_name), parallel.axis_names(within)
  if not inner or names[-len(inner):] != inner or len(inner) == len(names):
    raise ValueError(f"jaxcomp.shard_optimizer(within={within!r}) cuts over a host's devices: the last axes of "
                     f"axis_name={axis_name!r}, not all of them (e.g. axis_name=('hosts', 'local'), within='local').")
  fits = isinstance(host_devices, int) and not isinstance(host_devices, bool) and host_devices >= 1
  if not fits or num_workers % host_devices:
    raise ValueError(f"jaxcomp.shard_optimizer(within={within!r}) takes host_devices=, the size of {within!r} "
                     f"(a divisor of num_workers={num_workers}); got {host_devices!r}.")


def shards_params(tx: Any) -> bool:
  """Whether ``tx`` shards the parameters too (:func:`shard_optimizer` with ``shard_params=True``)."""
  return isinstance(tx, ShardedTransformation)


class ShardedTransformation(NamedTuple):
  """:func:`shard_optimizer` with ``shard_params=True``: optax's ``init`` and ``update``, and the parameters' steps.

  ``jaxcomp.data_parallel`` calls them around ``worker_step``; a step built
  by hand (inside its ``vmap``/``shard_map`` over the workers) does::

    params, opt_state = tx.gather_params(sharded, opt_state)   # the whole parameters
    grads = jax.grad(loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    sharded = tx.keep_shard(optax.apply_updates(params, updates))
  """

  init: Any  # params -> ShardedOptimizerState
  update: Any  # (grads, state, params) -> (updates zero outside this worker's chunks, state)
  shard_params: Any  # whole params -> every worker's ShardedParams (rows; at init, outside a step)
  gather_params: Any  # inside a step: (ShardedParams, state) -> (whole params, state with the gather's bytes)
  keep_shard: Any  # inside a step: whole params -> this worker's ShardedParams
  unshard: Any  # every worker's ShardedParams -> whole params (outside a step: no exchange)


def _check_gather_codec(name: str, codec: Optional[core.Compressor]) -> None:
  if codec is not None and (two_phase.unsupported(codec) or codec.plain_compressor is not None):
    raise ValueError(f"jaxcomp.shard_optimizer({name}={type(codec).__name__}(...)): an all-gather takes a "
                     "compressor with a fixed-size payload of its own (int8, TernGrad, QSGD, ...).")


class _Sharding(NamedTuple):
  tx: optax.GradientTransformation
  axis_name: parallel.AxisName
  num_workers: int
  align: int
  bucket_bytes: int
  gather: Optional[core.Compressor]
  seed: int
  stage3: bool = False  # shard_params=True
  param_gather: Optional[core.Compressor] = None
  within: parallel.AxisName = None  # cut over a host's devices only (hybrid), each host a whole copy
  host_devices: int = 0  # the size of within

  @property
  def cut_workers(self) -> int:
    """How many chunks a tensor is cut into: a host's devices (``within``), or every worker."""
    return self.host_devices if self.within is not None else self.num_workers

  @property
  def copies(self) -> int:
    """How many copies of the cut rows the workers hold: one a host (``within``), else one."""
    return self.num_workers // self.cut_workers

  @property
  def cut_axis(self) -> parallel.AxisName:
    """The axes the chunks are cut over, and the parameters' and updates' all-gathers run over."""
    return self.within if self.within is not None else self.axis_name

  def lays(self, tree: Any, workers: int) -> list[Optional[two_phase.Split]]:
    """Each leaf's cut over ``workers`` (float leaves only: others pass the compressor untouched)."""
    return [scatter.split(core.size_of(jnp.shape(a)), workers, self.align)
            if jnp.issubdtype(jnp.result_type(a), jnp.floating) else None for a in jax.tree.leaves(tree)]

  # -- init ----------------------------------------------------------------------------------------

  def init(self, params: Any) -> ShardedOptimizerState:
    with scatter.scattering(self.align):
      compression = jax.jit(lambda p: _only_compression(self.tx.init(p)))(params)
      with compress_update.state_discarded():  # the compression transform's state is the one above
        rows = jax.jit(jax.vmap(lambda p: _without_compression(self.tx.init(p))))(self.rows(params))
        _check_chain(compression, rows)
        cut = self.cut(params, rows)
    try:
      replicated = _merged(compression, jax.tree.map(lambda a, c: optax.MaskedNode() if c else a[0], rows, cut))
    except ValueError as e:
      raise ValueError("jaxcomp.shard_optimizer: the chain's state has another structure for a tensor's chunk "
                       "than for the whole tensor (a transform that depends on a tensor's rank or shape, "
                       f"beyond its size); it cannot be sharded. ({str(e).splitlines()[0]})") from None
    local = jax.tree.map(lambda a, c: a if c else optax.MaskedNode(), rows, cut)
    zero = Count.of(jnp.zeros((self.num_workers,), jnp.uint32))
    keys = (("gather_bytes", "local_bytes") if self.within is not None else GATHER_METRICS) + (
        ("gather_received",) if self.stage3 else ())
    return ShardedOptimizerState(replicated, core.ShardLocal(local, {k: zero for k in keys}),
                                 self.init_gather(params))

  def init_gather(self, params: Any) -> Optional[GatherState]:
    """The compressed all-gather's key and zero residuals (a row of each cut tensor's chunk a worker)."""
    if self.gather is None:
      return None
    leaves, treedef = jax.tree.flatten(params)
    residual = [optax.MaskedNode() if lay is None else jnp.zeros((self.num_workers, lay.chunk), jnp.float32)
                for lay in self.lays(params, self.cut_workers)]
    return GatherState(jax.random.PRNGKey(self.seed), core.ShardLocal(treedef.unflatten(residual), {}))

  def cut(self, params: Any, rows: Any) -> Any:
    """Which leaves of the chain's state (not its compression transform's) follow the parameters' chunks.

    ``rows`` is the state init made from every worker's chunks (a leading
    worker axis); it is compared with an abstract init (nothing allocated)
    from chunks a value longer. A leaf whose shape moves is per shard; one
    that does not (a step count, the state of a tensor kept whole) is the
    same on every worker and stays replicated.
    """
    leaves, treedef = jax.tree.flatten(params)
    lays = self.lays(params, self.cut_workers)
    longer = treedef.unflatten([
        jax.ShapeDtypeStruct(jnp.shape(a) if lay is None else (lay.chunk + 1,), jnp.result_type(a))
        for a, lay in zip(leaves, lays)])
    longer = jax.eval_shape(lambda p: _without_compression(self.tx.init(p)), longer)
    return jax.tree.map(lambda a, b: jnp.shape(a)[1:] != b.shape, rows, longer)

  def rows(self, params: Any) -> Any:
    """Every worker's shard of ``params``, stacked: ``(num_workers, chunk)`` a cut leaf, a copy each of a whole one
    (cut over a host's devices, ``within``: the host's rows, once for each host)."""
    leaves, treedef = jax.tree.flatten(params)
    return treedef.unflatten([
        scatter.rows_of(a, lay, self.copies) if lay is not None
        else jnp.broadcast_to(a, (self.num_workers,) + jnp.shape(a))
        for a, lay in zip(leaves, self.lays(params, self.cut_workers))])

  # -- update --------------------------------------------------------------------------------------

  def update(self, updates: Any, state: ShardedOptimizerState, params: Any = None, **extra_args):
    workers, index = self.worker()
    lays = self.lays(updates, workers)
    chain_state = _merged(state.replicated, state.local.residual)
    with scatter.scattering(self.align, axis_name=self.cut_axis, lays=lays, traffic=transport.Traffic()) as context:
      shards, chain_state = self.tx.update(updates, chain_state, _shards(params, lays, index), **extra_args)
    if self.stage3:  # the parameters were gathered (gather_params): each worker keeps its chunk's update
      whole, gather = self.placed(shards, lays, updates, index), state.gather
      sent, received = state.local.metrics["gather_bytes"], state.local.metrics["gather_received"]
    else:
      whole, traffic, gather = self.gathered(shards, lays, updates, state.gather, index)
      sent, received = traffic.sent, traffic.received
    if self.within is not None:  # every collective of the wrapper stays inside the host
      metrics = {"gather_bytes": sent, "local_bytes": sent + context.traffic.sent}
    else:
      metrics = {"gather_bytes": sent, "bytes_on_wire": sent + context.traffic.sent,
                 "received_bytes": received + context.traffic.received}
    return whole, self.new_state(state, chain_state, metrics, gather)

  def worker(self) -> tuple[int, Any]:
    """Inside a step: how many chunks a tensor is cut into (the worker axis checked against ``num_workers``,
    ``within`` against ``host_devices``) and which is this worker's."""
    workers = parallel.axis_size(self.axis_name)
    if workers != self.num_workers:
      raise ValueError(f"jaxcomp.shard_optimizer(num_workers={self.num_workers}) runs over {workers} workers "
                       f"of {self.axis_name!r}: its state is cut for {self.num_workers}.")
    cut = parallel.axis_size(self.cut_axis)
    if cut != self.cut_workers:
      raise ValueError(f"jaxcomp.shard_optimizer(host_devices={self.host_devices}) runs over {cut} devices "
                       f"of {self.within!r}: its state is cut for {self.host_devices}.")
    return cut, parallel.axis_index(self.cut_axis) if cut > 1 else 0

  def placed(self, shards: Any, lays: list, like: Any, index: Any) -> Any:
    """The updates whole-shaped, each cut tensor's zero outside this worker's chunk (nothing exchanged)."""
    leaves, treedef = jax.tree.flatten(shards)
    shapes = [jnp.shape(a) for a in jax.tree.leaves(like)]
    return treedef.unflatten([u if lay is None else zero_params.placed(u, lay, shape, index)
                              for u, lay, shape in zip(leaves, lays, shapes)])

  def check_cuts(self, codec: core.Compressor, lays: list) -> None:
    """Refuses ``codec`` for an all-gather of these cuts (no two-phase form, or chunks it cannot keep whole)."""
    for lay in lays:
      if lay is not None:
        scatter.check_compressor(codec, lay, self.align)

  # -- sharded parameters (shard_params=True) -------------------------------------------------------

  def shard_params(self, params: Any) -> zero_params.ShardedParams:
    """Every worker's chunks of ``params`` (outside a step: at init, or from whole parameters restored)."""
    return zero_params.shard(params, self.lays(params, self.cut_workers), self.copies)

  def cut_lays(self, sharded: zero_params.ShardedParams, workers: int) -> list:
    """:meth:`lays` of the whole parameters ``sharded`` holds (a cut tensor by its shape and dtype)."""
    places, _, _ = zero_params.positions(sharded)
    return self.lays([jax.ShapeDtypeStruct(p.shape, p.dtype) if isinstance(p, zero_params.Cut) else p
                      for p in places], workers)

  def unshard(self, sharded: zero_params.ShardedParams) -> Any:
    """The whole parameters from every worker's rows (outside a step: no exchange)."""
    return zero_params.unshard(sharded, self.cut_lays(sharded, self.cut_workers))

  def keep_shard(self, params: Any) -> zero_params.ShardedParams:
    """Inside a step: this worker's chunks of the new whole ``params``."""
    workers, index = self.worker()
    return zero_params.own(params, self.lays(params, workers), index)

  def gather_params(self, sharded: zero_params.ShardedParams, state: ShardedOptimizerState):
    """Inside a step: the whole parameters from every worker's chunks, and ``state`` with the gather's bytes."""
    workers, index = self.worker()
    places, treedef, chunks = zero_params.positions(sharded)
    lays = self.cut_lays(sharded, workers)
    if self.param_gather is not None:
      self.check_cuts(self.param_gather, lays)
    key = jax.random.PRNGKey(self.seed)  # a deterministic codec (checked): no draw depends on it
    steps = [p if lay is None else zero_params.gather_steps(c, p, lay, self.param_gather, key, index)
             for p, c, lay in zip(places, chunks, lays)]
    sizes = [4 * core.size_of(jnp.shape(p)) for p in places]
    results, traffic = buckets.run(steps, sizes, self.bucket_bytes, self.cut_axis)
    total = sum(traffic, transport.Traffic())
    metrics = {**state.local.metrics, "gather_bytes": total.sent.traced(), "gather_received": total.received.traced()}
    return treedef.unflatten(results), state._replace(local=state.local._replace(metrics=metrics))

  def new_state(self, state: ShardedOptimizerState, chain_state: Any, metrics: dict, gather) -> ShardedOptimizerState:
    """The chain's new state split as ``state`` is (replicated, per shard), with this update's counters."""
    replicated = _like(state.replicated, chain_state, lambda r, x: r if isinstance(r, optax.MaskedNode) else x)
    local = _like(state.replicated, chain_state, lambda r, x: x if isinstance(r, optax.MaskedNode) else optax.MaskedNode())
    metrics = {**state.local.metrics, **{k: v.traced() for k, v in metrics.items()}}
    return ShardedOptimizerState(replicated, core.ShardLocal(local, metrics), gather)

  def gathered(self, shards: Any, lays: list, like: Any, gather: Optional[GatherState], index: Any):
    """Every worker's update chunks, gathered and laid back whole (messages through the transport).

    Returns ``(whole updates, traffic, the gather's new state)``.
    """
    leaves, treedef = jax.tree.flatten(shards)
    shapes = [jnp.shape(a) for a in jax.tree.leaves(like)]
    if gather is None:
      steps = [u if lay is None else _gather_steps(u, lay, shape) for u, lay, shape in zip(leaves, lays, shapes)]
    else:
      self.check_cuts(self.gather, lays)
      step_key, next_key = jax.random.split(gather.key)
      residuals = treedef.flatten_up_to(gather.local.residual)
      keys = [jax.random.fold_in(jax.random.fold_in(step_key, i), index) for i in range(len(leaves))]
      steps = [u if lay is None else _encoded_gather_steps(self.gather, u, r, k, lay, shape)
               for u, r, k, lay, shape in zip(leaves, residuals, keys, lays, shapes)]
    results, traffic = buckets.run(steps, [4 * core.size_of(s) for s in shapes], self.bucket_bytes, self.cut_axis)
    total = transport.Traffic()
    for t in traffic:
      total += t
    if gather is None:
      return treedef.unflatten(results), total, None
    kept = [r if lay is None else out[1] for r, out, lay in zip(residuals, results, lays)]
    results = [out if lay is None else out[0] for out, lay in zip(results, lays)]
    return treedef.unflatten(results), total, GatherState(next_key, core.ShardLocal(treedef.unflatten(kept), {}))


# -- transforms that look across tensors, made to see the whole of them ------------------------------

def global_norm(updates: Any) -> jax.Array:
  """The L2 norm of every value of ``updates``, as ``optax.tree.norm``; inside a sharded chain, of the whole tensors.

  In :func:`shard_optimizer`'s chain a cut tensor arrives as this worker's
  chunk: the chunks' sums of squares are summed over the workers (one
  ``"sum"`` of a float32 scalar, counted with the wrapper's bytes) and the
  whole tensors' added once. The norm is the replicated one up to the order
  of the float32 additions, and the same on every worker.
  """
  context = scatter.active()
  if context is None or context.lays is None:
    return optax.tree.norm(updates)
  leaves = jax.tree.leaves(updates)
  if len(leaves) != len(context.lays):
    raise ValueError(f"jaxcomp.global_norm inside jaxcomp.shard_optimizer: the updates have {len(leaves)} leaves, "
                     f"the parameters {len(context.lays)}; it takes updates shaped as the parameters.")
  square = lambda x: jnp.sum(jnp.square(jnp.abs(x)), dtype=jnp.float32)
  cut = sum((square(x) for x, lay in zip(leaves, context.lays) if lay is not None), jnp.float32(0))
  whole = sum((square(x) for x, lay in zip(leaves, context.lays) if lay is None), jnp.float32(0))
  total = transport.run(_sum_steps(cut), context.axis_name, context.traffic)
  return jnp.sqrt(total + whole)


def _sum_steps(x: jax.Array):
  return (yield core.Message("sum", x))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """``optax.clip_by_global_norm``, whose norm is the whole model's inside :func:`shard_optimizer` too.

  Outside a sharded chain it is optax's, number for number. Inside, the
  norm is :func:`global_norm`'s (optax's own would be this worker's chunks').

  References:
    Pascanu, Mikolov, Bengio. *On the difficulty of training recurrent
    neural networks*. ICML 2013, §3.2 (Algorithm 1).
  """

  def update_fn(updates, state, params=None):
    del params
    norm = global_norm(updates)
    keep = jnp.squeeze(norm < max_norm)
    return jax.tree.map(lambda t: jax.lax.select(keep, t, (t / norm.astype(t.dtype)) * max_norm), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _gather_steps(u: jax.Array, lay: two_phase.Split, shape: tuple[int, ...]):
  rows = yield core.Message("gather", u)
  return scatter.whole(rows, lay, shape)


def _encoded_gather_steps(codec: core.Compressor, u: jax.Array, residual: jax.Array, key: jax.Array,
                          lay: two_phase.Split, shape: tuple[int, ...]):
  """A chunk of the update plus its residual encoded, every worker's gathered and decoded: ``(whole, residual)``."""
  y = u.astype(jnp.float32) + residual
  decoded, payload = yield from zero_params.encoded_rows(codec, y, key, lay)
  return scatter.whole(decoded, lay, shape).astype(u.dtype), y - codec.decode(payload, (lay.chunk,))


def _shards(params: Any, lays: list, index: Any) -> Any:
  """This worker's chunk of every cut parameter (``None`` stays ``None``: a chain that takes no parameters)."""
  if params is None:
    return None
  leaves, treedef = jax.tree.flatten(params)
  return treedef.unflatten([a if lay is None else scatter.shard_of(a, lay, index) for a, lay in zip(leaves, lays)])


# -- the chain's state, split in two ----------------------------------------------------------------

def _is_compression(x: Any) -> bool:
  return isinstance(x, CompressState)


def _is_part(x: Any) -> bool:
  return isinstance(x, (CompressState, optax.MaskedNode))


def _only_compression(state: Any) -> Any:
  """``state`` with every leaf outside a compression transform's state masked."""
  return jax.tree.map(lambda x: x if _is_compression(x) else optax.MaskedNode(), state, is_leaf=_is_compression)


def _without_compression(state: Any) -> Any:
  """``state`` with the compression transform's state masked."""
  return jax.tree.map(lambda x: optax.MaskedNode() if _is_compression(x) else x, state, is_leaf=_is_compression)


def _merged(replicated: Any, local: Any) -> Any:
  """The chain's whole state from its two parts: ``local``'s leaves where ``replicated`` has a mask."""
  return _like(replicated, local, lambda r, l: l if isinstance(r, optax.MaskedNode) else r)


def _like(replicated: Any, other: Any, pick) -> Any:
  """``pick(r, x)`` at every leaf, mask and compression state ``r`` of ``replicated`` (``x``: ``other``'s there)."""
  return jax.tree.map(pick, replicated, other, is_leaf=_is_part)


# States of optax transforms that look across a tensor, by what names them (others, whose state is
# empty, cannot be told apart: docs/zero.md lists what was tried).
_ACROSS = {optax.FactoredState: "optax.scale_by_factored_rms's state (Adafactor's factored moments)",
           optax.ScaleBySM3State: "optax.scale_by_sm3's state (SM3's per-axis accumulators)",
           optax.ScaleByNovogradState: "optax.scale_by_novograd's state (NovoGrad's per-tensor norms)",
           optax.AddNoiseState: "optax.add_noise's state (noisy_sgd: one draw per chunk shape)",
           optax.ApplyIfFiniteState: "optax.apply_if_finite's state (each worker would decide on its chunk)"}


def _check_chain(compression: Any, rest: Any) -> None:
  """Refuses a chain with no compression transform, one that looks across a tensor, or other worker-local state."""
  if not any(map(_is_compression, jax.tree.leaves(compression, is_leaf=_is_compression))):
    raise ValueError("jaxcomp.shard_optimizer wraps a chain that starts with a compression transform over the "
                     "workers (jaxcomp.terngrad(axis_name=...), ..., or jaxcomp.get_transform('none', "
                     "axis_name=...) for float): it reduce-scatters the gradients. This chain has none.")
  for x in jax.tree.leaves(rest, is_leaf=lambda x: isinstance(x, tuple(_ACROSS))):
    if isinstance(x, tuple(_ACROSS)):
      raise ValueError(f"jaxcomp.shard_optimizer: the chain holds {_ACROSS[type(x)]}, which looks across a "
                       "tensor and would compute on each worker's chunk; it cannot be sharded.")
  others = core.worker_locals(rest)
  if others:
    raise ValueError("jaxcomp.shard_optimizer: the chain holds worker-local state outside its compression "
                     f"transform ({len(others)} part(s), e.g. jaxcomp.multi_steps, diloco, onebit_adam), which "
                     "cannot be sharded yet; use a chain of a compressor and an elementwise optimizer.")
