"""One :func:`jaxcomp.compress` transform: its static options, and ``init`` and ``update`` as named steps.

The steps themselves are in :mod:`jaxcomp.update_steps`; the exchange's
algorithms in :mod:`jaxcomp.exchange`. See :class:`Compress`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import re
from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.count import Count
from jaxcomp.exchange import allgather
from jaxcomp.exchange import buckets
from jaxcomp.exchange import hierarchy
from jaxcomp.exchange import layout as layout_lib
from jaxcomp.exchange import plan as plan_lib
from jaxcomp.exchange import scatter
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase
from jaxcomp.update_steps import (  # pylint: disable=g-multiple-import
    CompressState, NonFinitePolicy, SkipSpec, TensorResult, UpdatePlan, add_residual, agree_on_nonfinite,
    carry_residual, check_gradients_vary, check_not_sharded, check_one_worker, count_all, count_tensor,
    count_two_phase_tensor, metric_keys, path_str, resolve_skip, send_float, set_aside, set_aside_nonfinite)

# Set by a caller that drops the state init makes (see :func:`state_discarded`).
_DISCARDED: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxcomp_state_discarded", default=False)


@contextlib.contextmanager
def state_discarded() -> Iterator[None]:
  """While active, a compression transform's ``init`` leaves its counters empty: its caller drops that state.

  The counters (:meth:`Compress.static_metrics`) cost an abstract trace of a
  whole update; a caller that inits a chain only for the state of its other
  transforms (:func:`jaxcomp.shard_optimizer`, per worker's chunk) skips it.
  The arrays and the rest of the state are as always.
  """
  token = _DISCARDED.set(True)
  try:
    yield
  finally:
    _DISCARDED.reset(token)


@dataclasses.dataclass(frozen=True, eq=False)
class Compress:
  """One :func:`compress` transform: its static options, and ``init`` and ``update`` as named steps.

  An update (:meth:`update`): 0. with ``within``, the host's mean and this
  device's slices (:mod:`jaxcomp.exchange.hierarchy`); 1. each compressed tensor's
  input ``x = g + r`` and its non-finite check (:meth:`inputs`); 2. one
  generator of messages per tensor, or per bucket encoded at once
  (:meth:`tensor_steps`), run together by the transport
  (:func:`jaxcomp.exchange.buckets.run`); 3. the counters (:meth:`metrics`); 4. the
  updates and the new state (:meth:`new_state`).
  """

  compressor: Optional[core.Compressor]
  axis_name: parallel.AxisName
  within: parallel.AxisName
  skip: SkipSpec
  min_size: int
  seed: int
  nonfinite: NonFinitePolicy
  exchange: plan_lib.Exchange
  bucket_bytes: int
  use_ef: bool  # a residual per tensor (error feedback)
  tracked_re: Optional[re.Pattern]  # tensor_metrics
  # static_metrics' counts, per _signature of the parameters (each: key -> (static, is_static))
  counts: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

  @property
  def worker_axes(self) -> tuple[str, ...]:
    return parallel.axis_names(self.axis_name)

  @property
  def exchange_axes(self) -> parallel.AxisName:
    """The axes the update's messages travel over: ``axis_name``; reduce-scattered with ``within``, the
    host's axes too (every device a worker of the sharded layout, its hops over each: :meth:`scatter_tensor`)."""
    if self.within is not None and scatter.active() is not None:
      return self.worker_axes + parallel.axis_names(self.within)
    return self.axis_name

  @property
  def replicated_over_hosts(self) -> bool:
    """Reduce-scattered over ``within`` alone (hybrid sharding: :func:`jaxcomp.shard_optimizer`'s ``within``):
    every host keeps a whole copy, cut over its devices."""
    context = scatter.active()
    return (self.within is not None and context is not None and context.axis_name is not None
            and parallel.axis_names(context.axis_name) == parallel.axis_names(self.within))

  @property
  def routed(self) -> bool:
    """Whether a tensor may take the two-phase exchange (``exchange`` other than ``"all_gather"``)."""
    return self.compressor is not None and self.exchange != "all_gather"

  @property
  def agree(self) -> bool:
    """Whether the workers agree on non-finite tensors (a flag byte each travels)."""
    return self.nonfinite == "propagate" and bool(self.worker_axes)

  @property
  def use_shard(self) -> bool:
    """Whether the state keeps the two-phase exchange's shard residuals (reduce-scattered with ``within``:
    the second hop's, :func:`~jaxcomp.exchange.scatter.two_hop_steps`)."""
    two_hops = self.within is not None and self.compressor is not None and scatter.active() is not None
    return (self.routed or two_hops) and self.use_ef and not two_phase.unsupported(self.compressor)

  @property
  def keys(self) -> tuple[str, ...]:
    return metric_keys(self.compressor, "two_phase" if scatter.active() is not None else self.exchange)

  # -- what happens to each tensor ---------------------------------------------------------------

  def plan(self, tree) -> UpdatePlan:
    leaves, treedef = jax.tree.flatten(tree)  # all float: see _pass_through_skipped_nonfloat
    skipped = resolve_skip(self.skip, tree, self.min_size, self.compressor is None)
    tracked = {}
    if self.tracked_re is not None:
      paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
      tracked = {i: p for i, p in enumerate(paths) if not skipped[i] and self.tracked_re.search(p)}
    return UpdatePlan(leaves, treedef, skipped, tracked)

  def routes(self, p: UpdatePlan, topology) -> UpdatePlan:
    """``p`` with the tensors that take the two-phase exchange, chosen per bucket (:func:`~jaxcomp.exchange.plan.choose_buckets`),
    or inside :func:`jaxcomp.exchange.scatter.scattering` those reduce-scattered."""
    context = scatter.active()
    if context is not None:
      return self.scattered(p, context)
    if not self.routed:
      return p
    groups = [[i for i in ids if not p.skipped[i]] for ids in self.groups(p, topology)]
    routes = plan_lib.choose_buckets(self.compressor, [core.size_of(jnp.shape(g)) for g in p.leaves], groups,
                                     parallel.axis_size(self.axis_name), self.exchange)
    return p._replace(two_phase=frozenset(i for i, r in enumerate(routes) if r == "two_phase"))

  def scattered(self, p: UpdatePlan, context: scatter.Scattering) -> UpdatePlan:
    """``p`` with the tensors that :func:`jaxcomp.exchange.scatter.split` cuts over the workers."""
    if self.within is not None and self.compressor is not None:
      scatter.check_two_hops(self.compressor)
    axes, align = parallel.axis_names(self.exchange_axes), context.align
    cut_over = None if context.axis_name is None else parallel.axis_names(context.axis_name)
    if cut_over is not None and cut_over != axes and not self.replicated_over_hosts:
      raise ValueError(f"jaxcomp.shard_optimizer(axis_name={context.axis_name!r}) cuts over other axes than its "
                       f"compressor exchanges over ({axes!r}: axis_name, then within): pass axis_name={axes!r} "
                       f"(or within={self.within!r} to cut over a host's devices only).")
    workers = parallel.axis_size(self.within if self.replicated_over_hosts else self.exchange_axes)
    lays = {i: scatter.split(core.size_of(jnp.shape(g)), workers, align) for i, g in enumerate(p.leaves)}
    lays = {i: lay for i, lay in lays.items() if lay is not None}
    for i, lay in lays.items():
      if not p.skipped[i]:
        scatter.check_compressor(self.compressor, lay, align)
    return p._replace(scattered=lays)

  def groups(self, p: UpdatePlan, topology) -> list[list[int]]:
    """The buckets (leaf ids, :func:`jaxcomp.exchange.buckets.assign`), a host's split and whole leaves apart."""
    return topology.separate(buckets.assign(_sizes(p), self.bucket_bytes))

  def policy_mean(self, mean: jax.Array, anywhere: jax.Array) -> jax.Array:
    """The mean under the non-finite policy: all-NaN where some worker's tensor was not finite (``"propagate"``)."""
    return jnp.where(anywhere, jnp.full_like(mean, jnp.nan), mean) if self.nonfinite == "propagate" else mean

  # -- one tensor's (or bucket's) exchange: generators of messages returning TensorResult s -------

  def exchange_steps(self, x, key, inner):
    """Agree, encode, exchange, decode: the compressor's own exchange or the default one (messages)."""
    if self.compressor.custom_exchange:
      out = self.compressor.exchange(x, key, self.exchange_axes, _from_masked(inner))
      if not inspect.isgenerator(out):
        raise TypeError(f"{type(self.compressor).__name__}.exchange must be a generator that yields its "
                        "collectives as jaxcomp.core.Message s (the transport runs and counts them).")
      return (yield from out)
    return (yield from allgather.exchange_steps(self.compressor, x, key, self.exchange_axes, inner,
                                                need_own=self.use_ef))

  def two_phase_tensor(self, g, x, bad, residual, inner, shard, key, tracked_path):
    anywhere, tp = yield from agree_on_nonfinite(
        bad[None], two_phase.two_phase_steps(self.compressor, x, key, self.axis_name, _from_masked(shard),
                                             need_own=self.use_ef or tracked_path is not None), self.agree)
    return self.two_phase_result(g, x, bad, anywhere[0], residual, shard, tp, tracked_path, inner)

  def two_phase_result(self, g, x, bad, anywhere, residual, shard, tp, tracked_path, inner):
    """A tensor's result from its two-phase exchange's :class:`~jaxcomp.exchange.two_phase.TwoPhaseResult`."""
    mean = self.policy_mean(tp.mean, anywhere)
    residual = carry_residual(x, tp.own, residual, bad) if self.use_ef else residual
    if self.use_shard:  # a step whose mean is NaN on every worker leaves the shard residual as it was
      shard = jnp.where(anywhere, shard, tp.shard_residual) if self.nonfinite == "propagate" else tp.shard_residual
    counts = count_two_phase_tensor(tp, g, bad, tracked_path)
    return self.tracked_route(TensorResult(mean.astype(g.dtype), residual, inner, shard, counts), tracked_path)

  def gathered_tensor(self, g, x, bad, anywhere, residual, shard, ex, tracked_path):
    """A tensor's result from its all-gather exchange's :class:`~jaxcomp.core.Exchanged`."""
    mean = self.policy_mean(ex.mean, anywhere)
    residual = carry_residual(x, ex.own, residual, bad) if self.use_ef else residual
    counts = count_tensor(self.compressor, ex, g, bad, tracked_path)
    return self.tracked_route(TensorResult(mean.astype(g.dtype), residual, _or_masked(ex.state), shard, counts),
                              tracked_path)

  def tracked_route(self, result, tracked_path):
    if self.routed and tracked_path is not None:
      counts = dict(result.counts)
      counts[f"two_phase:{tracked_path}"] = counts.get("two_phase_tensors", 0)
      result = result._replace(counts=counts)
    return result

  def compress_tensor(self, g, x, bad, residual, inner, shard, key, tracked_path, split):
    """One compressed tensor's step (``split``: by the two-phase exchange)."""
    if split:
      return (yield from self.two_phase_tensor(g, x, bad, residual, inner, shard, key, tracked_path))
    anywhere, ex = yield from agree_on_nonfinite(bad[None], self.exchange_steps(x, key, inner), self.agree)
    return self.gathered_tensor(g, x, bad, anywhere[0], residual, shard, ex, tracked_path)

  def compress_bucket(self, ids, gs, xs, bad, residuals, shards, keys, tracked, layout):
    """A bucket's compressed tensors encoded at once: their results, a list.

    ``bucket_encode``; ``keys`` stacked; ``layout`` the bucket's, carrying its join where the check made one.
    """
    anywhere, exs = yield from agree_on_nonfinite(
        jnp.stack([bad[i] for i in ids]),
        allgather.bucket_exchange_steps(self.compressor, [xs[i] for i in ids], keys, self.axis_name, layout=layout,
                                       need_own=self.use_ef), self.agree)
    return [self.gathered_tensor(gs[i], xs[i], bad[i], a, residuals[i], shards[i], ex, tracked.get(i))
            for i, a, ex in zip(ids, anywhere, exs)]

  def two_phase_bucket(self, ids, gs, xs, bad, residuals, shards, keys, tracked):
    """A bucket's two-phase tensors, each phase encoded at once (:func:`~jaxcomp.exchange.two_phase.bucket_steps`)."""
    need_own = self.use_ef or any(i in tracked for i in ids)
    anywhere, tps = yield from agree_on_nonfinite(
        jnp.stack([bad[i] for i in ids]),
        two_phase.bucket_steps(self.compressor, [xs[i] for i in ids], keys, self.axis_name,
                               [_from_masked(shards[i]) for i in ids], need_own=need_own), self.agree)
    return [self.two_phase_result(gs[i], xs[i], bad[i], a, residuals[i], shards[i], tp, tracked.get(i),
                                  optax.MaskedNode())  # a bucket compressor keeps no state of its own
            for i, a, tp in zip(ids, anywhere, tps)]

  def float_tensor(self, g, residual, inner, shard, lay=None):
    """One tensor kept in float (``lay``: reduce-scattered, its mean's shard)."""
    if lay is None:
      mean = yield from send_float(g)
    elif self.replicated_over_hosts:
      mean = yield from scatter.float_steps(g, lay, self.axis_name, self.within)
    else:
      mean = yield from scatter.float_steps(g, lay)
    return TensorResult(mean, residual, inner, shard, {})

  def scatter_tensor(self, g, x, bad, residual, inner, shard, key, tracked_path, lay):
    """One compressed tensor reduce-scattered (:func:`jaxcomp.exchange.scatter.compressed_steps`; with
    ``within``, in two hops: :func:`~jaxcomp.exchange.scatter.two_hop_steps`): its mean's shard."""
    need_own = self.use_ef or tracked_path is not None
    if self.within is None:
      steps = scatter.compressed_steps(self.compressor, x, key, self.axis_name, lay, need_own=need_own)
    else:
      steps = scatter.two_hop_steps(self.compressor, x, key, lay, self.axis_name, self.within, _from_masked(shard),
                                    need_own=need_own, replicated=self.replicated_over_hosts)
    anywhere, tp = yield from agree_on_nonfinite(bad[None], steps, self.agree)
    residual = carry_residual(x, tp.own, residual, bad) if self.use_ef else residual
    if tp.shard_residual is not None:  # two hops: the re-encoding's error (a step with NaN anywhere keeps it)
      shard = jnp.where(anywhere[0], shard, tp.shard_residual) if self.nonfinite == "propagate" else tp.shard_residual
    counts = count_two_phase_tensor(tp, g, bad, tracked_path)
    counts["two_phase_tensors"] = 0
    return TensorResult(self.policy_mean(tp.mean, anywhere[0]).astype(g.dtype), residual, inner, shard, counts)

  # -- an update, step by step ---------------------------------------------------------------------

  def update_fn(self, updates, state, params=None, **extra_args):
    del params, extra_args
    if not core.is_traced((updates, state)):
      # Called eagerly (outside jit, vmap, shard_map): one compiled program instead of hundreds of
      # operations dispatched one by one (docs/design.md, "Host devices").
      return self.compiled_update(updates, state)
    return self.update(updates, state)

  @functools.cached_property
  def compiled_update(self):
    return jax.jit(self.update)

  def update(self, updates, state):
    p = self.plan(updates)
    check_gradients_vary(updates, self.worker_axes + parallel.axis_names(self.within), self.compressor)
    check_not_sharded(updates)
    residuals = p.treedef.flatten_up_to(state.local.residual)
    parallel.worker_layout.check_laid_out(state, self.worker_axes + parallel.axis_names(self.within), "jaxcomp")
    check_one_worker(p, residuals, state.local.metrics)
    inners = p.treedef.flatten_up_to(state.inner)
    shards = (p.treedef.flatten_up_to(state.shard.residual) if self.use_shard
              else [optax.MaskedNode()] * len(p.leaves))
    topology = self.topology(p)  # 0. with `within`, the host's mean and this device's slices
    p = self.routes(p._replace(leaves=topology.scatter(p.leaves)), topology)
    residuals, shards = topology.take(residuals), topology.take(shards)
    next_key, step_key = jax.random.split(state.key)
    compressed = [i for i, s in enumerate(p.skipped) if not s]
    together, split, in_order = self.encoded_together(p, topology)
    xs, bad, layouts = self.inputs(p, residuals, in_order, compressed)
    layouts = topology.host_flags(xs, bad, layouts, together, compressed, set_aside)
    keys = self.leaf_keys(step_key, compressed, topology)
    steps = self.tensor_steps(p, xs, bad, residuals, inners, shards, together, split, layouts, keys)
    results, traffic = self.run(steps, p, together + split)
    whole = topology.whole([r.update for r in results], [r.inner for r in results],
                           [r.residual for r in results], [r.shard for r in results])
    metrics = topology.count(self.metrics(p, results, traffic))
    return self.new_state(p, state, next_key, whole, metrics)

  def topology(self, p: UpdatePlan):
    """The devices around a worker (:mod:`jaxcomp.exchange.hierarchy`): a host's (``within``), or none."""
    if self.within is None or scatter.active() is not None:  # reduce-scattered: every device a worker
      return hierarchy.Flat()
    return hierarchy.Local(self.within, [jnp.shape(g) for g in p.leaves], self.compressor, p.skipped)

  def encoded_together(self, p: UpdatePlan, topology) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The buckets (leaf ids) whose tensors a compressor with ``bucket_encode`` encodes at once.

    Three lists: the all-gathered tensors' buckets, the two-phase tensors'
    (:func:`~jaxcomp.exchange.two_phase.bucket_steps`, where it applies), and
    both kinds in the order they are exchanged (the same lists).
    """
    if (self.compressor is None or not self.compressor.bucket_encode or self.compressor.custom_exchange
        or p.scattered is not None):
      return [], [], []
    applies = two_phase.bucket_applies(self.compressor)
    together, split, in_order = [], [], []
    for group in self.groups(p, topology):
      gathered = [i for i in group if not p.skipped[i] and i not in p.two_phase]
      halves = [i for i in group if i in p.two_phase] if applies else []
      for ids, kind in ((gathered, together), (halves, split)):
        if ids:
          kind.append(ids)
          in_order.append(ids)
    return together, split, in_order

  def inputs(self, p: UpdatePlan, residuals, buckets, compressed):
    """1. Each compressed tensor's ``x = g + r``, its non-finite tensors set aside: ``(xs, bad, layouts)``.

    A bucket encoded at once (``buckets``, all-gathered or two-phase, in the
    order they are exchanged) is checked together (elsewhere a tensor's ``x``
    may be computed in another loop with its check than alone, and XLA:CPU's
    contraction of a momentum's multiply-add into an FMA differs between
    loops), and its kernels start after the previous bucket's check
    (:func:`jaxcomp.core.after`: otherwise every bucket's residual add and
    check ran before the first collective; docs/design.md, "Choices in the
    code", has the profile). With one worker per device an
    all-gathered bucket is joined once, in its encoder's layout, for the check
    and the encoder (``layouts`` carry the join, one per all-gathered bucket,
    in order). With vmap-simulated workers the join is every simulated
    worker's, and its copy with the set-aside tensors zeroed cost more than a
    second join (docs/design.md, "Choices in the code"). Decided here, where the axes are
    bound: a device axis is one of the mesh that ``shard_map`` traces under.
    """
    one_join = bool(self.worker_axes) and all(map(parallel.is_device_axis, self.worker_axes))
    covered = {i for ids in buckets for i in ids}
    xs, bad, layouts = {}, {}, []
    for k, ids in enumerate(buckets + [[i] for i in compressed if i not in covered]):
      x_ids = [add_residual(p.leaves[i], residuals[i], self.use_ef) for i in ids]
      if 0 < k < len(buckets):  # a bucket's kernels start after the previous bucket's check
        x_ids = core.after(x_ids, bad[buckets[k - 1][-1]])
      bucket_layout = None
      if k < len(buckets) and ids[0] not in p.two_phase:  # an all-gathered bucket
        bucket_layout = layout_lib.Layout([core.size_of(jnp.shape(p.leaves[i])) for i in ids], self.compressor.planes)
      xs_ids, bad_ids, joined_layout = set_aside_nonfinite(x_ids, bucket_layout if one_join else None)
      if bucket_layout is not None:
        layouts.append(bucket_layout if joined_layout is None else joined_layout)
      xs.update(zip(ids, xs_ids))
      bad.update(zip(ids, bad_ids))
    return xs, bad, layouts

  def leaf_keys(self, step_key, compressed, topology):
    """``(rows, row)``: tensor ``i``'s key is ``rows[i][row[i]]``; a bucket draws alike from its first tensor's rows."""
    return topology.leaf_keys(step_key, compressed, self.exchange_axes), {i: j for j, i in enumerate(compressed)}

  def tensor_steps(self, p: UpdatePlan, xs, bad, residuals, inners, shards, together, split, layouts, keys):
    """2. Every tensor's generator of messages; a bucket encoded at once is one, at its first tensor."""
    rows, row = keys
    covered = {i for ids in together + split for i in ids}
    steps = [None] * len(p.leaves)
    bucket_keys = lambda ids: rows[ids[0]][np.array([row[i] for i in ids])]
    for ids, bucket_layout in zip(together, layouts):
      steps[ids[0]] = self.compress_bucket(ids, p.leaves, xs, bad, residuals, shards, bucket_keys(ids), p.tracked,
                                           bucket_layout)
    for ids in split:
      steps[ids[0]] = self.two_phase_bucket(ids, p.leaves, xs, bad, residuals, shards, bucket_keys(ids), p.tracked)
    lays = p.scattered or {}
    for i, (g, r, inner, shard) in enumerate(zip(p.leaves, residuals, inners, shards)):
      if p.skipped[i]:
        steps[i] = self.float_tensor(g, r, inner, shard, lays.get(i))
      elif i in lays:
        steps[i] = self.scatter_tensor(g, xs[i], bad[i], r, inner, shard, rows[i][row[i]], p.tracked.get(i), lays[i])
      elif i not in covered:
        steps[i] = self.compress_tensor(g, xs[i], bad[i], r, inner, shard, rows[i][row[i]], p.tracked.get(i),
                                        i in p.two_phase)
    return steps

  def run(self, steps, p: UpdatePlan, together):
    """The steps run by the transport, in buckets (:func:`jaxcomp.exchange.buckets.run`): ``(results, traffic)``.

    A bucket's results spread to its tensors; ``traffic`` is the bytes of the
    compressed tensors' messages and of the float tensors', as counted.
    """
    results, traffic = buckets.run(steps, _sizes(p), self.bucket_bytes, self.exchange_axes)
    for ids in together:
      for i, result in zip(ids, results[ids[0]]):
        results[i] = result
    compressed, floats = transport.Traffic(), transport.Traffic()
    for t, skipped in zip(traffic, p.skipped):
      if skipped:
        floats += t
      else:
        compressed += t
    return results, (compressed, floats)

  def metrics(self, p: UpdatePlan, results, traffic) -> dict[str, Count]:
    """3. The update's counters (reduce-scattered with ``within``: its hops inside a host as ``local_bytes``)."""
    local = None
    if self.within is not None and p.scattered is not None:
      (compressed, local), (floats, local_floats) = (t.apart(self.within) for t in traffic)
      traffic, local = (compressed, floats), local + local_floats
    metrics = count_all(self.keys, results, p, *traffic)
    if local is not None:
      metrics["local_bytes"] = local.sent
    if "received_bytes" in metrics:
      # With a routed exchange, the counts that depend on the axis size (bytes received, which
      # route each tensor took, its bytes) are kept in their traced form: init's abstract trace
      # has one worker, and the state must keep one structure whatever the axis size.
      n_dependent = ["received_bytes", "bytes_on_wire", "compressed_bytes_on_wire", "encoded_bytes",
                     "two_phase_tensors"] + [f"two_phase:{path}" for path in p.tracked.values()]
      n_dependent += ["float_bytes", "local_bytes"] if p.scattered is not None else []  # the float chunks' padding
      for name in n_dependent:
        if name in metrics:  # reduce-scattered (jaxcomp.exchange.scatter), no two_phase:<path> is counted
          metrics[name] = metrics[name].traced()
    return metrics

  def new_state(self, p: UpdatePlan, state: CompressState, next_key, whole, metrics):
    """4. The updates and the new state (``whole``: with ``within``, whole tensors on every device of the host)."""
    updates, inners, residuals, shards = whole
    new_state = CompressState(
        count=optax.safe_increment(state.count),
        key=next_key,
        inner=p.treedef.unflatten(inners),
        local=state.local._replace(residual=p.treedef.unflatten(residuals), metrics=metrics),  # keeps LaidOut
        shard=state.shard._replace(residual=p.treedef.unflatten(shards)) if self.use_shard else None,
    )
    return p.treedef.unflatten(updates), new_state

  # -- init ----------------------------------------------------------------------------------------

  def init(self, params):
    p = self.plan(params)
    if self.compressor is not None:
      for leaf, s in zip(p.leaves, p.skipped):
        if not s:
          self.compressor.validate(tuple(jnp.shape(leaf)), jnp.asarray(leaf).dtype)
    residual = [
        optax.MaskedNode() if (s or not self.use_ef) else jnp.zeros(jnp.shape(leaf), jnp.float32)
        for leaf, s in zip(p.leaves, p.skipped)
    ]
    key = jax.random.PRNGKey(self.seed)
    inner = [
        optax.MaskedNode() if (s or self.compressor is None)
        else _or_masked(self.compressor.init_state(tuple(jnp.shape(leaf)), jax.random.fold_in(key, i)))
        for i, (leaf, s) in enumerate(zip(p.leaves, p.skipped))
    ]
    shard = None
    if self.use_shard:  # full-size: the number of workers, hence the shard, is known only at trace time
      shard = core.WorkerLocal(residual=p.treedef.unflatten(
          [optax.MaskedNode() if s else jnp.zeros(jnp.shape(leaf), jnp.float32)
           for leaf, s in zip(p.leaves, p.skipped)]), metrics={})
    state = CompressState(
        count=jnp.zeros((), jnp.int32),
        key=jax.random.fold_in(key, len(p.leaves)),
        inner=p.treedef.unflatten(inner),
        local=core.WorkerLocal(residual=p.treedef.unflatten(residual), metrics={}),
        shard=shard,
    )
    if _DISCARDED.get():
      return state
    return state._replace(local=state.local._replace(metrics=self.static_metrics(params, state)))

  def static_metrics(self, params, state: CompressState) -> dict[str, Count]:
    """The counters before the first update: the sizes that are static per step, zero for the rest.

    They are the same before and after every update, so that the state keeps
    one pytree structure (for jit caches, ``lax.scan``, checkpoints): one
    update is traced abstractly (nothing runs) and its static counts kept.
    The static counts are kept per :func:`_signature` of ``params``: an init
    repeated for the same shapes (a run's abstract state, then its state)
    traces once.
    """
    key = _signature(params)
    counts = self.counts.get(key) if key is not None else None
    if counts is None:
      traced = jax.eval_shape(_with_axes(self.update_fn, self.worker_axes + parallel.axis_names(self.within)),
                              params, state)[1].local.metrics
      counts = {k: (v.static, v.is_static) for k, v in traced.items()}
      if key is not None:
        self.counts[key] = counts
    return {k: Count(static) if is_static else Count(static) + Count.of(jnp.uint32(0))
            for k, (static, is_static) in counts.items()}


def _signature(params: Any) -> Optional[tuple]:
  """What an update's static counts follow: the parameters' tree, shapes and dtypes, and the enclosing
  :func:`jaxcomp.exchange.scatter.scattering`'s cut; ``None`` (nothing kept) inside a sharded update."""
  context = scatter.active()
  if context is not None and context.lays is not None:
    return None
  leaves, treedef = jax.tree.flatten(params)
  return (treedef, tuple((jnp.shape(a), jnp.result_type(a)) for a in leaves),
          None if context is None else (context.align, context.axis_name))


def _sizes(p: UpdatePlan) -> list[int]:
  """Each tensor's float32 bytes (what fills a bucket)."""
  return [4 * core.size_of(jnp.shape(g)) for g in p.leaves]

def _with_axes(fn: Callable[..., Any], axis_name: parallel.AxisName) -> Callable[..., Any]:
  """``fn`` with every name of ``axis_name`` bound to a worker axis of size 1 (for tracing)."""
  for name in parallel.axis_names(axis_name):
    fn = jax.vmap(fn, in_axes=None, out_axes=0, axis_name=name, axis_size=1)
  return fn


def _or_masked(x: Any) -> Any:
  return optax.MaskedNode() if x is None else x


def _from_masked(x: Any) -> Any:
  return None if isinstance(x, optax.MaskedNode) else x


