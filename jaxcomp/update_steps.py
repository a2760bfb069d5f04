"""The named steps of one update of :func:`jaxcomp.compress`, for one tensor or all.

Each is a small pure function (or a generator of the exchange's messages)
that :class:`jaxcomp.compress_update.Compress` calls in turn: add the residual
(:func:`add_residual`), set aside non-finite input (:func:`set_aside_nonfinite`,
:func:`agree_on_nonfinite`), send a skipped tensor in float (:func:`send_float`),
carry the residual (:func:`carry_residual`), refuse a state or gradient laid out
wrongly (:func:`check_gradients_vary`, :func:`check_not_sharded`,
:func:`check_one_worker`) and count (:func:`count_tensor`, :func:`count_all`).
Also here: the state (:class:`CompressState`), the plan of an update
(:class:`UpdatePlan`), which tensors stay in float (:func:`resolve_skip`) and the
names of tensors' paths (:func:`path_str`).
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp import sharded
from jaxcomp.count import Count
from jaxcomp.exchange import layout as layout_lib
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


class UpdatePlan(NamedTuple):
  """The static facts of one update: the tensors, and what happens to each."""

  leaves: list[Any]
  treedef: Any
  skipped: list[bool]  # True: the tensor stays in float
  tracked: dict[int, str]  # leaf index -> path, for tensor_metrics
  two_phase: frozenset = frozenset()  # the tensors that take the two-phase exchange (chosen per bucket)
  scattered: Any = None  # leaf index -> two_phase.Split: the tensors reduce-scattered (jaxcomp.exchange.scatter)


class TensorResult(NamedTuple):
  """What one tensor's step produces."""

  update: jax.Array  # the averaged tensor, in the gradient's dtype
  residual: Any  # the new error-feedback residual (or the old one, or MaskedNode)
  inner: Any  # the new per-tensor compressor state (or MaskedNode)
  shard: Any  # the new two-phase shard residual (or the old one, or MaskedNode)
  counts: dict[str, Any]  # metric name -> int, int32 array or Count, summed over tensors



def resolve_skip(skip: SkipSpec, tree: Any, min_size: int, everything: bool = False) -> list[bool]:
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


def dtype_of(leaf: Any) -> Any:
  return leaf.dtype if hasattr(leaf, "dtype") else jnp.asarray(leaf).dtype


def is_float(leaf: Any) -> bool:
  return jnp.issubdtype(dtype_of(leaf), jnp.floating)


def check_float(leaf: Any, path: str) -> None:
  if not is_float(leaf):
    raise TypeError(
        f"jaxcomp compresses floating-point gradients; got a leaf of dtype {dtype_of(leaf)} at {path!r}. "
        "Mark it in `skip` (it then passes through untouched) or leave it out of the gradients.")


def metric_keys(compressor: Optional[core.Compressor], exchange: str = "all_gather") -> tuple[str, ...]:
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
    # Not a round that may not run, nor a hop over part of the workers (Message.over).
    if agreed is None and message.kind == "gather" and message.when is None and message.over is None:
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


def check_one_worker(p: UpdatePlan, residuals: list[Any], metrics: dict[str, Count]) -> None:
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


def count_all(keys: tuple[str, ...], results: list[TensorResult], plan: UpdatePlan,
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

