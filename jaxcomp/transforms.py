"""optax transforms that compress, exchange and average gradients.

:func:`compress` wires one per-tensor :class:`~jaxcomp.core.Compressor` into an
``optax.GradientTransformationExtraArgs`` together with the machinery every
compressor shares:

* **error feedback** (Seide et al. 2014; 3LC Fig. 2): one residual buffer per
  tensor per worker, carried in the optax state. The compressor sees
  ``x = g + r``; after encoding, ``r <- x - decode(own payload)``, so over
  ``T`` steps ``sum(decoded) + r_T == sum(g)`` (conservation);
* **skipped tensors** kept in float (an ``optax.masked``-style ``skip`` tree or
  predicate, and ``min_size``); they are averaged with ``pmean``;
* **dtype handling**: any float dtype in, the same dtype out; compressors and
  residuals work in float32;
* **randomness**: a key in the state, split every step and folded with the
  tensor's position and the worker's ``lax.axis_index``;
* **non-finite input**: an explicit policy (see :func:`compress`);
* **accounting**: the bytes handed to collectives, recorded in the state as
  exact :class:`~jaxcomp.count.Count` s and read with :func:`jaxcomp.metrics`.

An update is a sequence of named steps, per tensor: add the residual
(:func:`add_residual`), set aside non-finite input (:func:`set_aside_nonfinite`,
:func:`agree_on_nonfinite`, in the exchange's messages), skip (:func:`send_float`) or exchange (agree,
encode, all_gather, decode: :func:`jaxcomp.exchange.allgather.exchange`, or the
compressor's own :meth:`~jaxcomp.core.Compressor.exchange`), carry the
residual (:func:`carry_residual`), count (:func:`count_tensor`,
:func:`count_all`). The exchange is the one step that differs between
exchange schemes: ``exchange="all_gather"`` (every worker gathers every
payload), ``"two_phase"`` (a compressed reduce-scatter and all-gather,
:mod:`jaxcomp.exchange.two_phase`) or ``"auto"`` (per bucket, whichever receives fewer
bytes for the axis size, decided at trace time: :func:`jaxcomp.exchange.plan.choose_buckets`).

With ``axis_name=None`` the transform quantizes and dequantizes locally (one
worker); with an axis name it performs the exchange, so the train step needs no
``pmean``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from typing import Any, Callable, Literal, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp import sharded
from jaxcomp.count import Count
from jaxcomp.exchange import allgather
from jaxcomp.exchange import buckets
from jaxcomp.exchange import hierarchy
from jaxcomp.exchange import layout as layout_lib
from jaxcomp.exchange import plan as plan_lib
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase

NonFinitePolicy = Literal["propagate", "zero"]
SkipSpec = Union[None, Any, Callable[[Any], Any]]
ExchangeFn = Callable[..., core.Exchanged]  # (compressor, x, key, axis_name, state, *, need_own) -> Exchanged

STANDARD_METRICS = (
    "bytes_on_wire",
    "float32_bytes",
    "compressed_bytes_on_wire",
    "compressed_float32_bytes",
    "float_bytes",
    "encoded_bytes",
    "nonfinite_tensors",
)


class CompressState(NamedTuple):
  """State of :func:`compress`."""

  count: jax.Array  # int32 step counter (saturating: optax.safe_increment)
  key: jax.Array  # PRNG key, identical on every worker
  inner: Any  # per-tensor compressor states (Compressor.init_state), identical on every worker
  local: core.WorkerLocal
  # The two-phase exchange's shard residuals (jaxcomp.exchange.two_phase: full-size, params-shaped;
  # MaskedNode where there is none), or None with exchange="all_gather" or no error feedback.
  shard: Optional[core.WorkerLocal] = None


class _Plan(NamedTuple):
  """The static facts of one update: the tensors, and what happens to each."""

  leaves: list[Any]
  treedef: Any
  skipped: list[bool]  # True: the tensor stays in float
  tracked: dict[int, str]  # leaf index -> path, for tensor_metrics
  two_phase: frozenset = frozenset()  # the tensors that take the two-phase exchange (chosen per bucket)


class _TensorResult(NamedTuple):
  """What one tensor's step produces."""

  update: jax.Array  # the averaged tensor, in the gradient's dtype
  residual: Any  # the new error-feedback residual (or the old one, or MaskedNode)
  inner: Any  # the new per-tensor compressor state (or MaskedNode)
  shard: Any  # the new two-phase shard residual (or the old one, or MaskedNode)
  counts: dict[str, Any]  # metric name -> int, int32 array or Count, summed over tensors


def _resolve_skip(skip: SkipSpec, tree: Any, min_size: int, everything: bool = False) -> list[bool]:
  """Per-leaf booleans: True keeps the leaf in float."""
  leaves, treedef = jax.tree.flatten(tree)
  if everything:
    return [True] * len(leaves)
  if skip is None:
    flags = [False] * len(leaves)
  else:
    spec = skip(tree) if callable(skip) else skip
    try:
      spec_leaves = treedef.flatten_up_to(spec)
    except (ValueError, TypeError) as e:
      raise ValueError(
          "`skip` must be a pytree of booleans with the structure of the "
          "gradients (or a prefix of it), or a callable returning one "
          f"(as optax.masked's mask): {e}"
      ) from None
    flags = []
    for s, leaf in zip(spec_leaves, leaves):
      sub = jax.tree.leaves(s)
      if not all(isinstance(b, (bool, np.bool_)) for b in sub):
        raise TypeError(
            "`skip` must hold Python booleans (it decides statically which "
            f"tensors stay in float); got {sub!r}."
        )
      flags.append(bool(all(sub)) if sub else False)
  for i, leaf in enumerate(leaves):
    if leaf is None:
      continue
    n = int(np.prod(np.shape(leaf), dtype=np.int64))
    if n == 0 or n < min_size:
      flags[i] = True
  return flags


def _dtype(leaf: Any) -> Any:
  return leaf.dtype if hasattr(leaf, "dtype") else jnp.asarray(leaf).dtype


def _is_float(leaf: Any) -> bool:
  return jnp.issubdtype(_dtype(leaf), jnp.floating)


def _check_float(leaf: Any, path: str) -> None:
  if not _is_float(leaf):
    raise TypeError(
        f"jaxcomp compresses floating-point gradients; got a leaf of dtype {_dtype(leaf)} at {path!r}. "
        "Mark it in `skip` (it then passes through untouched) or leave it out of the gradients.")


def _pass_through_skipped_nonfloat(
    tx: optax.GradientTransformationExtraArgs, skip: SkipSpec, min_size: int
) -> optax.GradientTransformationExtraArgs:
  """``tx`` with the non-float leaves that ``skip`` (or ``min_size``) keeps in float passed through untouched.

  Such a leaf (an integer counter, the ``float0`` gradient of an integer
  parameter) is neither exchanged nor counted: ``tx`` sees an empty float32
  placeholder in its place, which costs nothing. Any other non-float leaf is
  a TypeError naming its path.
  """

  def split(tree):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    through = [not _is_float(leaf) for _, leaf in flat]
    if not any(through):
      return tree, through
    for (path, leaf), kept, t in zip(flat, _resolve_skip(skip, tree, min_size), through):
      if t and not kept:
        _check_float(leaf, path_str(path))
    return treedef.unflatten([jnp.zeros((0,), jnp.float32) if t else leaf for (_, leaf), t in zip(flat, through)]), through

  def init_fn(params):
    return tx.init(split(params)[0])

  def update_fn(updates, state, params=None, **extra_args):
    inner, through = split(updates)
    new_updates, state = tx.update(inner, state, params, **extra_args)
    if not any(through):
      return new_updates, state
    leaves, treedef = jax.tree.flatten(updates)
    merged = [g if t else u for g, u, t in zip(leaves, treedef.flatten_up_to(new_updates), through)]
    return treedef.unflatten(merged), state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _metric_keys(compressor: Optional[core.Compressor], exchange: str = "all_gather") -> tuple[str, ...]:
  extra = tuple(compressor.metric_keys) if compressor is not None else ()
  routed = ("received_bytes", "two_phase_tensors") if exchange != "all_gather" else ()
  return STANDARD_METRICS + routed + extra


# -- the named steps of an update, for one tensor or all ----------------------


def add_residual(g: jax.Array, residual: Any, use_ef: bool) -> jax.Array:
  """The compressor's input: ``x = g + r`` in float32 (``g`` without error feedback)."""
  x = g.astype(jnp.float32)
  return x + residual if use_ef else x


def set_aside_nonfinite(xs: list[jax.Array], layout: Optional[layout_lib.Layout] = None):
  """``(xs, bad, layout)``: ``bad[i]`` if ``xs[i]`` holds a NaN or Inf, and then ``xs[i]`` replaced by zeros.

  A worker with a non-finite tensor sends zeros for it, so the encoders never
  see NaN; the policy of :func:`compress` decides what the mean becomes.
  ``xs`` are checked together (:func:`nonfinite_flags`). With ``layout``, a
  bucket encoded at once (:mod:`jaxcomp.exchange.buckets`), they are joined in the
  encoder's layout for the check, and the layout returned carries that join
  and every tensor's ``max|x|``, its set-aside tensors zeroed, for the encoder
  (:meth:`jaxcomp.exchange.layout.Layout.joined_input`,
  :meth:`~jaxcomp.exchange.layout.Layout.input_max_abs`); without, it is ``None``.
  """
  if layout is None:
    bad = nonfinite_flags(xs)
    carried = None
  else:
    joined = layout.join([x.reshape(-1) for x in xs])
    tops = layout.tensor_max(jnp.abs(joined))
    bad = ~jnp.isfinite(tops)  # max|x| is ±Inf or NaN exactly when a value is (tensor_max propagates NaN)
    carried = set_aside(layout.with_input(joined, tops), bad)
  return [jnp.where(b, jnp.zeros_like(x), x) for x, b in zip(xs, bad)], list(bad), carried


def set_aside(layout: layout_lib.Layout, bad: jax.Array) -> layout_lib.Layout:
  """``layout`` carrying its join and maxima with the tensors flagged in ``bad`` zeroed (a zero's max is +0)."""
  joined = jnp.where(layout.per_chunk(bad), jnp.zeros_like(layout.joined), layout.joined)
  return layout.with_input(joined, jnp.where(bad, jnp.zeros_like(layout.tops), layout.tops))


def nonfinite_flags(xs: list[jax.Array]) -> jax.Array:
  """:func:`is_nonfinite` of every tensor of ``xs`` (float32), in one reduction: bool ``(k,)``.

  Several tensors are laid end to end in chunks (:class:`jaxcomp.exchange.layout.Layout`
  with one plane, zero padding) and reduced by chunk and then by tensor: a
  reduction a tensor costs a kernel launch each (on XLA:CPU about as much as
  the reduction of a small tensor itself). The flags are the same either way.
  """
  if len(xs) == 1:
    return is_nonfinite(xs[0])[None]
  layout = layout_lib.Layout([core.size_of(jnp.shape(x)) for x in xs], 1)
  # (Reading the flags from max|x| as set_aside_nonfinite does with an encoder's layout made LeNet's
  # steps with simulated workers slower, benchmarks.step_time: there nothing shares it.)
  x = layout.join([x.reshape(-1) for x in xs])
  return jnp.isnan(layout.tensor_sum(x - x))


def is_nonfinite(x: jax.Array) -> jax.Array:
  """Whether ``x`` holds a NaN or Inf: ``not all(isfinite(x))``, as one fused sum.

  ``x − x`` is +0 for a finite value and NaN for ±Inf or NaN, and a sum is NaN
  exactly when one of its terms is, so ``isnan(sum(x − x))`` is the same flag
  (XLA does not fold ``x − x`` for floats). It is one subtract-and-reduce pass
  over ``x`` on every backend; the plain form ``~all(isfinite(x))`` writes a
  boolean per element first on XLA:CPU, and ``sum(x·0)`` writes out the
  broadcast zeros there.
  """
  return jnp.isnan(jnp.sum(x - x))


FLAG_DTYPE = jnp.uint8  # a tensor's non-finite flag on the wire: one byte


def agree_on_nonfinite(bad: jax.Array, steps: Any, agree: bool):
  """Runs exchange ``steps`` with the workers' agreement on ``bad`` in its messages.

  ``steps`` is an exchange's generator of messages; this is one too (see
  :func:`jaxcomp.exchange.transport.run`), returning ``(anywhere, result)``:
  ``anywhere[i]`` if tensor ``i``'s ``bad`` flag is set on *any* worker, and
  the exchange's result. With ``agree``, the flags (one
  :data:`FLAG_DTYPE` byte per tensor) travel with the exchange's first
  all-gather (the all-gather exchange's payload, the two-phase exchange's
  shards), and each worker takes their maximum over the gathered workers; an
  exchange without an all-gather (PowerSGD's sums) sends them in a ``"max"``
  of their own at its end. The flags are needed only once the
  exchange is done, so no collective waits for them, and a bucket's ride with
  its own payload (:mod:`jaxcomp.exchange.buckets`) instead of an all-reduce that waits
  for every tensor's check. Without ``agree`` the local flags are used as
  they are and nothing is sent.
  """
  if not agree:
    return bad, (yield from steps)
  flags = bad.astype(FLAG_DTYPE)
  agreed = None
  message, result = transport.advance(steps, None)
  while message is not None:
    if agreed is None and message.kind == "gather" and message.when is None:  # not a round that may not run
      encoded = None if message.encoded is None else Count(flags.nbytes) + Count.of(message.encoded)
      gathered, reply = yield core.Message("gather", (flags, message.tree), encoded=encoded)
      agreed = parallel.max_leading(gathered)
    else:
      reply = yield message
    message, result = transport.advance(steps, reply)
  if agreed is None:  # no gather to ride on (PowerSGD's sums)
    agreed = yield core.Message("max", flags)
  return agreed > 0, result


def send_float(g: jax.Array):
  """A skipped tensor: averaged in its own dtype with a ``"mean"`` message (a generator; one worker: ``g``)."""
  return (yield core.Message("mean", g))


def carry_residual(x: jax.Array, own: jax.Array, residual: jax.Array, bad: jax.Array) -> jax.Array:
  """Error feedback: ``r <- x - decode(own payload)``; a non-finite input keeps the old ``r``."""
  return jnp.where(bad, residual, x - own)


def check_gradients_vary(grads: Any, axis_name: parallel.AxisName, compressor: Optional[core.Compressor]) -> None:
  """Refuses gradients that ``shard_map`` types as already reduced over the worker axis.

  See :func:`jaxcomp.parallel.vary`: under ``shard_map`` with ``check_vma=True``
  the gradient of replicated parameters arrives summed over the devices.
  """
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  who = f"jaxcomp ({type(compressor).__name__ if compressor is not None else 'float'} exchange)"
  parallel.check_not_reduced([g for _, g in flat], [path_str(k) for k, _ in flat], axis_name, who)


def check_not_sharded(grads: Any) -> None:
  """Refuses gradients typed as split over a mesh axis (``AxisType.Explicit``): see :func:`jaxcomp.per_shard`."""
  for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    axes = sorted(sharded.spec_axes(getattr(getattr(jax.typeof(g), "sharding", None), "spec", None)))
    if axes:
      raise ValueError(
          f"jaxcomp: the gradient {path_str(path)!r} is split over the mesh axes {axes} (its type "
          f"{jax.typeof(g).str_short()}): a compressor encodes whole tensors. Wrap the transform in "
          f"jaxcomp.per_shard(tx, {tuple(axes)!r}), which compresses each device's shard.")


def check_one_worker(p: _Plan, residuals: list[Any], metrics: dict[str, Count]) -> None:
  """Refuses a state that still has its worker axis inside ``update`` (one worker's state is needed).

  A state laid out over workers (:func:`jaxcomp.parallel.replicate_workers`)
  has a leading worker axis on its worker-local leaves; under ``shard_map``
  each device holds a row of 1 of it, which :func:`jaxcomp.parallel.worker_slice`
  drops before ``tx.update`` and :func:`jaxcomp.parallel.expand_workers` puts
  back. Left in, a residual ``(1, *shape)`` would broadcast every update to
  that shape (the parameters come back reshaped) and the counters would lose
  the axis the step's ``out_specs`` expect: a JAX error about jaxcomp's
  internals, or a silently wrong step. Here it is jaxcomp's own error.
  """
  paths = [path_str(k) for k, _ in jax.tree_util.tree_flatten_with_path(p.treedef.unflatten(p.leaves))[0]]
  wrong = [(path, jnp.shape(r), jnp.shape(g)) for path, r, g in zip(paths, residuals, p.leaves)
           if not isinstance(r, optax.MaskedNode) and jnp.shape(r) != jnp.shape(g)]
  # The standard counters are scalars on one worker (a compressor's own may count per chunk).
  wrong += [(f"metrics/{k}", jnp.shape(leaf), ()) for k, c in metrics.items() if k in STANDARD_METRICS
            for leaf in jax.tree.leaves(c) if jnp.ndim(leaf)]
  if wrong:
    path, got, want = wrong[0]
    raise ValueError(
        f"jaxcomp: the optimizer state's {path!r} has shape {tuple(got)} where one worker's is {tuple(want)}: "
        "tx.update takes one worker's state, without the worker axis that jaxcomp.parallel.replicate_workers "
        "adds. Under shard_map pass jaxcomp.parallel.worker_slice(state, 0) and return "
        "jaxcomp.parallel.expand_workers(new_state); under vmap or pmap map the state with in_axes="
        "out_axes=jaxcomp.parallel.worker_axes(state) (not None). jaxcomp.data_parallel(worker_step, tx, ...) "
        "does both.")


def count_tensor(
    compressor: core.Compressor, ex: core.Exchanged, g: jax.Array, bad: jax.Array,
    tracked_path: Optional[str],
) -> dict[str, Any]:
  """The counters of one compressed tensor (see :func:`jaxcomp.metrics`; its bytes: the transport counts them)."""
  counts = {
      "compressed_float32_bytes": 4 * core.size_of(g.shape),
      "nonfinite_tensors": bad.astype(jnp.int32),
      **(ex.metrics or {}),
      **compressor.extra_metrics(ex.payload, g.shape),
  }
  if tracked_path is not None:
    sent = ex.own if ex.own is not None else compressor.decode(ex.payload, g.shape)
    counts[f"zeros:{tracked_path}"] = jnp.sum(sent == 0, dtype=jnp.int32)
    counts[f"elements:{tracked_path}"] = core.size_of(g.shape)
  return counts


def count_two_phase_tensor(tp: two_phase.TwoPhaseResult, g: jax.Array, bad: jax.Array,
                           tracked_path: Optional[str]) -> dict[str, Any]:
  """The counters of one tensor sent by the two-phase exchange (its bytes: the transport counts them)."""
  counts = {
      "compressed_float32_bytes": 4 * core.size_of(g.shape),
      "nonfinite_tensors": bad.astype(jnp.int32),
      "two_phase_tensors": 1,
      **tp.metrics,
  }
  if tracked_path is not None:
    counts[f"zeros:{tracked_path}"] = jnp.sum(tp.own == 0, dtype=jnp.int32)
    counts[f"elements:{tracked_path}"] = core.size_of(g.shape)
  return counts


def count_all(keys: tuple[str, ...], results: list[_TensorResult], plan: _Plan,
              compressed: transport.Traffic, floats: transport.Traffic) -> dict[str, Count]:
  """The metrics of this update (exact :class:`~jaxcomp.count.Count` s): the tensors' counters summed,
  and the bytes the transport counted for the compressed and the float tensors' messages."""
  m = {k: Count() for k in keys}
  for i in plan.tracked:
    m[f"zeros:{plan.tracked[i]}"] = m[f"elements:{plan.tracked[i]}"] = Count()
  m["float32_bytes"] = Count(sum(4 * core.size_of(jnp.shape(g)) for g in plan.leaves))
  for r in results:
    for name, value in r.counts.items():
      m[name] = m.get(name, Count()) + Count.of(value)
  m["compressed_bytes_on_wire"], m["float_bytes"] = compressed.sent, floats.sent
  m["encoded_bytes"] = compressed.encoded + floats.encoded
  m["bytes_on_wire"] = m["compressed_bytes_on_wire"] + m["float_bytes"]
  if "received_bytes" in m:
    m["received_bytes"] = compressed.received + floats.received
  return m


# -- the transform -------------------------------------------------------------


def compress(
    compressor: Optional[core.Compressor],
    *,
    axis_name: parallel.AxisName = None,
    error_feedback: Optional[bool] = None,
    skip: SkipSpec = None,
    min_size: int = 0,
    seed: int = 0,
    nonfinite: NonFinitePolicy = "propagate",
    tensor_metrics: Optional[str] = None,
    exchange: plan_lib.Exchange = "all_gather",
    bucket_bytes: int = buckets.DEFAULT_BUCKET_BYTES,
    within: parallel.AxisName = None,
) -> optax.GradientTransformationExtraArgs:
  """Compresses, exchanges and averages gradients.

  Args:
    compressor: a per-tensor compressor, or ``None`` to send every tensor as
      float (the uncompressed ``pmean`` baseline).
    axis_name: the named worker axis (a name or a tuple of names) of the
      surrounding ``vmap``/``pmap``/``shard_map``; ``None`` for one worker.
    error_feedback: keep a residual per tensor (default: the compressor's
      ``error_feedback`` class attribute).
    skip: which tensors stay in float, as ``optax.masked``'s ``mask`` but
      inverted: a pytree of booleans (True = keep in float) with the
      gradients' structure or a prefix of it, or a callable taking the
      gradients and returning one. See :func:`skip_by_path`. A non-float
      leaf (an integer counter, the ``float0`` gradient of an integer
      parameter) must be skipped: it then passes through untouched, neither
      exchanged nor counted; otherwise it is a TypeError naming its path.
    min_size: tensors with fewer elements stay in float (QSGD §5 keeps tensors
      under 10K elements in float; 3LC §4.2 the small batch-norm tensors).
    seed: seeds the state's PRNG key.
    nonfinite: what a NaN or Inf in a worker's tensor does.
      ``"propagate"`` (default): every worker's averaged tensor becomes all-NaN
      (as in uncompressed training, where the NaN would reach the mean), the
      worker's residual keeps its previous value, and a one-byte-per-tensor
      flag travels with the exchange (counted in ``bytes_on_wire``).
      ``"zero"``: the worker sends that tensor as zeros for this step and keeps
      its residual; nothing extra crosses the wire. Either way the count of
      non-finite tensors is reported as the metric ``nonfinite_tensors``.
    tensor_metrics: a regular expression (``re.search``) on tensor paths
      (see :func:`path_str`, e.g. ``"fc6/kernel"``). Every compressed tensor
      it matches reports two more counters, for this worker's own message:
      ``"zeros:<path>"``, the elements that decode to exactly 0, and
      ``"elements:<path>"``, its size; their ratio is the sparsity of what
      the worker sent (TernGrad Fig. 4(c): 71.32% of AlexNet's fc6 codes are
      0). Counted on the worker, never sent; with neither error feedback nor
      a custom exchange it costs one extra decode of each matched tensor.
      With ``exchange`` other than ``"all_gather"`` a matched tensor also
      reports ``"two_phase:<path>"``: 1 if it took the two-phase exchange.
    exchange: how each compressed tensor crosses the wire.
      ``"all_gather"`` (default): every worker gathers every worker's payload
      (each receives ``(N − 1)·P`` bytes). ``"two_phase"``: a compressed
      reduce-scatter, re-encoding and all-gather (:mod:`jaxcomp.exchange.two_phase`;
      each receives ``≈ 2(N − 1)/N·P``); tensors too small to split over the
      axis stay on the all-gather. ``"auto"``: per bucket, the one under
      which the bucket's tensors receive fewer bytes for the axis size,
      decided at trace time. A compressor with ``bucket_encode`` (TernGrad,
      QSGD, int8, 3LC) encodes a bucket's two-phase tensors at once in each
      phase (:func:`jaxcomp.exchange.two_phase.bucket_steps`). With
      either, the metric ``two_phase_tensors`` counts the tensors that took
      the two-phase exchange and ``received_bytes`` the bytes that reached
      this worker (see :func:`jaxcomp.metrics`). With error feedback, the two-phase exchange keeps a second,
      full-size residual per tensor for the shard the worker re-encodes (in
      the state's ``shard``; allocated for ``"two_phase"`` and ``"auto"``).
      Compressors with their own exchange (PowerSGD) refuse ``"two_phase"``
      and keep their own with ``"auto"``.
    bucket_bytes: tensors are exchanged in buckets of about this many bytes
      of float32 gradient, filled in reverse order (the last layers first, as
      PyTorch DDP does): each round of a bucket's exchanges (an agreement, an
      all-gather, an all-to-all, the float tensors' mean) is one collective
      per bucket instead of one per tensor (:mod:`jaxcomp.exchange.buckets`). The
      numbers (updates, states, metrics) are the same, bit for bit (PowerSGD: to a
      few ulp, see :mod:`jaxcomp.exchange.buckets`), as with
      ``0``: one exchange per tensor. Over ``vmap``-simulated workers alone
      nothing crosses a wire and tensors go one at a time whatever the value.
    within: a hierarchy (:mod:`jaxcomp.exchange.hierarchy`): the axis (a name or a
      tuple of names) of the devices of one host, over which gradients are
      averaged in float before the compressed exchange over ``axis_name``,
      which then runs once per host, each device of the host exchanging one
      slice of every tensor. ``None`` (default): every worker of
      ``axis_name`` exchanges its own compressed gradient. With ``within``
      the counters are per device and the bytes over ``within`` are counted
      apart, as ``local_bytes``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates are the
    averaged, decompressed gradients in the gradients' dtypes. Its state's
    counters (read with :func:`jaxcomp.metrics`) are those of the last
    update; before the first update they hold the sizes that are static per
    step and zero for the rest. Those sizes are part of the state's pytree
    structure and depend on the configuration (``axis_name`` counts the
    agreement bytes): initialize the state with the transform that updates it.
  """
  if nonfinite not in ("propagate", "zero"):
    raise ValueError(f"nonfinite must be 'propagate' or 'zero'; got {nonfinite!r}.")
  if min_size < 0:
    raise ValueError(f"min_size must be >= 0; got {min_size}.")
  buckets.check_bucket_bytes(bucket_bytes)
  parallel.axis_names(axis_name)  # validates
  if set(parallel.axis_names(within)) & set(parallel.axis_names(axis_name)):
    raise ValueError(f"within={within!r} and axis_name={axis_name!r} share an axis: within names the "
                     "devices of one host (averaged in float), axis_name the hosts (compressed).")
  plan_lib.check_exchange(exchange)
  if compressor is not None:
    plan_lib.check(compressor, exchange)
  if compressor is None and error_feedback:
    raise ValueError("error_feedback needs a compressor.")
  use_ef = bool(compressor is not None and (compressor.error_feedback if error_feedback is None else error_feedback))
  steps = _Compress(compressor, axis_name, within, skip, min_size, seed, nonfinite, exchange, bucket_bytes, use_ef,
                    re.compile(tensor_metrics) if tensor_metrics else None)
  return _pass_through_skipped_nonfloat(optax.GradientTransformationExtraArgs(steps.init, steps.update_fn),
                                        skip, min_size)


@dataclasses.dataclass(frozen=True, eq=False)
class _Compress:
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

  @property
  def worker_axes(self) -> tuple[str, ...]:
    return parallel.axis_names(self.axis_name)

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
    """Whether the state keeps the two-phase exchange's shard residuals."""
    return self.routed and self.use_ef and not two_phase.unsupported(self.compressor)

  @property
  def keys(self) -> tuple[str, ...]:
    return _metric_keys(self.compressor, self.exchange)

  # -- what happens to each tensor ---------------------------------------------------------------

  def plan(self, tree) -> _Plan:
    leaves, treedef = jax.tree.flatten(tree)  # all float: see _pass_through_skipped_nonfloat
    skipped = _resolve_skip(self.skip, tree, self.min_size, self.compressor is None)
    tracked = {}
    if self.tracked_re is not None:
      paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
      tracked = {i: p for i, p in enumerate(paths) if not skipped[i] and self.tracked_re.search(p)}
    return _Plan(leaves, treedef, skipped, tracked)

  def routes(self, p: _Plan, topology) -> _Plan:
    """``p`` with the tensors that take the two-phase exchange, chosen per bucket (:func:`~jaxcomp.exchange.plan.choose_buckets`)."""
    if not self.routed:
      return p
    groups = [[i for i in ids if not p.skipped[i]] for ids in self.groups(p, topology)]
    routes = plan_lib.choose_buckets(self.compressor, [core.size_of(jnp.shape(g)) for g in p.leaves], groups,
                                     parallel.axis_size(self.axis_name), self.exchange)
    return p._replace(two_phase=frozenset(i for i, r in enumerate(routes) if r == "two_phase"))

  def groups(self, p: _Plan, topology) -> list[list[int]]:
    """The buckets (leaf ids, :func:`jaxcomp.exchange.buckets.assign`), a host's split and whole leaves apart."""
    return topology.separate(buckets.assign(_sizes(p), self.bucket_bytes))

  def policy_mean(self, mean: jax.Array, anywhere: jax.Array) -> jax.Array:
    """The mean under the non-finite policy: all-NaN where some worker's tensor was not finite (``"propagate"``)."""
    return jnp.where(anywhere, jnp.full_like(mean, jnp.nan), mean) if self.nonfinite == "propagate" else mean

  # -- one tensor's (or bucket's) exchange: generators of messages returning _TensorResult s -------

  def exchange_steps(self, x, key, inner):
    """Agree, encode, exchange, decode: the compressor's own exchange or the default one (messages)."""
    if self.compressor.custom_exchange:
      out = self.compressor.exchange(x, key, self.axis_name, _from_masked(inner))
      if not inspect.isgenerator(out):
        raise TypeError(f"{type(self.compressor).__name__}.exchange must be a generator that yields its "
                        "collectives as jaxcomp.core.Message s (the transport runs and counts them).")
      return (yield from out)
    return (yield from allgather.exchange_steps(self.compressor, x, key, self.axis_name, inner, need_own=self.use_ef))

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
    return self.tracked_route(_TensorResult(mean.astype(g.dtype), residual, inner, shard, counts), tracked_path)

  def gathered_tensor(self, g, x, bad, anywhere, residual, shard, ex, tracked_path):
    """A tensor's result from its all-gather exchange's :class:`~jaxcomp.core.Exchanged`."""
    mean = self.policy_mean(ex.mean, anywhere)
    residual = carry_residual(x, ex.own, residual, bad) if self.use_ef else residual
    counts = count_tensor(self.compressor, ex, g, bad, tracked_path)
    return self.tracked_route(_TensorResult(mean.astype(g.dtype), residual, _or_masked(ex.state), shard, counts),
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

  def float_tensor(self, g, residual, inner, shard):
    """One tensor kept in float."""
    mean = yield from send_float(g)
    return _TensorResult(mean, residual, inner, shard, {})

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

  def topology(self, p: _Plan):
    """The devices around a worker (:mod:`jaxcomp.exchange.hierarchy`): a host's (``within``), or none."""
    if self.within is None:
      return hierarchy.Flat()
    return hierarchy.Local(self.within, [jnp.shape(g) for g in p.leaves], self.compressor, p.skipped)

  def encoded_together(self, p: _Plan, topology) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The buckets (leaf ids) whose tensors a compressor with ``bucket_encode`` encodes at once.

    Three lists: the all-gathered tensors' buckets, the two-phase tensors'
    (:func:`~jaxcomp.exchange.two_phase.bucket_steps`, where it applies), and
    both kinds in the order they are exchanged (the same lists).
    """
    if self.compressor is None or not self.compressor.bucket_encode or self.compressor.custom_exchange:
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

  def inputs(self, p: _Plan, residuals, buckets, compressed):
    """1. Each compressed tensor's ``x = g + r``, its non-finite tensors set aside: ``(xs, bad, layouts)``.

    A bucket encoded at once (``buckets``, all-gathered or two-phase, in the
    order they are exchanged) is checked together (elsewhere a tensor's ``x``
    may be computed in another loop with its check than alone, and XLA:CPU's
    contraction of a momentum's multiply-add into an FMA differs between
    loops), and its kernels start after the previous bucket's check
    (:func:`jaxcomp.core.after`: otherwise every bucket's residual add and
    check ran before the first collective; ResNet-110's two-phase QSGD step at
    4 processes over 100 Mbit/s waited 27 ms for its first collective, 16 ms
    chained: ``benchmarks.timeline``). With one worker per device an
    all-gathered bucket is joined once, in its encoder's layout, for the check
    and the encoder (``layouts`` carry the join, one per all-gathered bucket,
    in order). With vmap-simulated workers the join is every simulated
    worker's, and its copy with the set-aside tensors zeroed cost more than a
    second join (``benchmarks.step_time``). Decided here, where the axes are
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
    return topology.leaf_keys(step_key, compressed, self.axis_name), {i: j for j, i in enumerate(compressed)}

  def tensor_steps(self, p: _Plan, xs, bad, residuals, inners, shards, together, split, layouts, keys):
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
    for i, (g, r, inner, shard) in enumerate(zip(p.leaves, residuals, inners, shards)):
      if p.skipped[i]:
        steps[i] = self.float_tensor(g, r, inner, shard)
      elif i not in covered:
        steps[i] = self.compress_tensor(g, xs[i], bad[i], r, inner, shard, rows[i][row[i]], p.tracked.get(i),
                                        i in p.two_phase)
    return steps

  def run(self, steps, p: _Plan, together):
    """The steps run by the transport, in buckets (:func:`jaxcomp.exchange.buckets.run`): ``(results, traffic)``.

    A bucket's results spread to its tensors; ``traffic`` is the bytes of the
    compressed tensors' messages and of the float tensors', as counted.
    """
    results, traffic = buckets.run(steps, _sizes(p), self.bucket_bytes, self.axis_name)
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

  def metrics(self, p: _Plan, results, traffic) -> dict[str, Count]:
    """3. The update's counters."""
    metrics = count_all(self.keys, results, p, *traffic)
    if "received_bytes" in metrics:
      # With a routed exchange, the counts that depend on the axis size (bytes received, which
      # route each tensor took, its bytes) are kept in their traced form: init's abstract trace
      # has one worker, and the state must keep one structure whatever the axis size.
      n_dependent = ["received_bytes", "bytes_on_wire", "compressed_bytes_on_wire", "encoded_bytes",
                     "two_phase_tensors"] + [f"two_phase:{path}" for path in p.tracked.values()]
      for name in n_dependent:
        metrics[name] = metrics[name].traced()
    return metrics

  def new_state(self, p: _Plan, state: CompressState, next_key, whole, metrics):
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
    return state._replace(local=state.local._replace(metrics=self.static_metrics(params, state)))

  def static_metrics(self, params, state: CompressState) -> dict[str, Count]:
    """The counters before the first update: the sizes that are static per step, zero for the rest.

    They are the same before and after every update, so that the state keeps
    one pytree structure (for jit caches, ``lax.scan``, checkpoints): one
    update is traced abstractly (nothing runs) and its static counts kept.
    """
    traced = jax.eval_shape(_with_axes(self.update_fn, self.worker_axes + parallel.axis_names(self.within)),
                            params, state)[1].local.metrics
    return {k: Count(v.static) if v.is_static else Count(v.static) + Count.of(jnp.uint32(0))
            for k, v in traced.items()}


def _sizes(p: _Plan) -> list[int]:
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


def skip_by_path(predicate: Callable[[str], bool]) -> Callable[[Any], Any]:
  """A ``skip`` callable from a predicate on a tensor's path.

  The path is the ``/``-joined key path, e.g. ``"params/logits/kernel"``.

  Example::

    jaxcomp.terngrad(skip=jaxcomp.skip_by_path(lambda p: "logits" in p))
  """

  def skip(tree):
    return jax.tree_util.tree_map_with_path(lambda path, _: bool(predicate(path_str(path))), tree)

  return skip


def path_str(path) -> str:
  """``/``-joined names of a ``jax.tree_util`` key path."""
  return "/".join(str(part) for part in key_names(path))


def key_names(path) -> tuple[Any, ...]:
  """The names and indices of a ``jax.tree_util`` key path (as Flax NNX writes paths)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(getattr(k, attr))
        break
    else:
      parts.append(str(k))
  return tuple(parts)
