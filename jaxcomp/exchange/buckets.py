"""Buckets: a model's tensors exchanged in a few fused collectives.

Exchanging a model tensor by tensor costs one or two collectives per tensor
(ResNet-110: about 660 a step), and each pays a fixed latency before a byte
moves. XLA combines the all-reduces of a float ``pmean`` but, on CPU, has no
such pass for all-gathers or all-to-alls. So the tensors are grouped into
buckets, as Horovod's fusion buffer and PyTorch DDP's gradient buckets group
them, and every collective round of a bucket runs once for all its tensors.

How: every exchange (:func:`jaxcomp.exchange.allgather.exchange_steps`,
:func:`jaxcomp.exchange.two_phase.two_phase_steps`, the compressors' own) is a
generator that yields a :class:`~jaxcomp.core.Message` per collective it
needs and gets the result back. :func:`run` runs the buckets in order and a
bucket's exchanges in lockstep; at each round it joins the bucket's messages
of one kind into one buffer, runs one collective on it and hands every
exchange its own part back (the agreement of the bucket two places on rides
on this bucket's all-gather: :func:`_pipelined`):

* ``"gather"`` and ``"all_to_all"`` move bytes: every array is viewed as
  bytes (``uint8``), the bucket's arrays are laid end to end, and the result
  is cut and viewed back;
* ``"max"``, ``"sum"`` and ``"mean"`` reduce element by element: arrays of
  one dtype are laid end to end and reduced by one collective per dtype (a
  ``"max"`` riding on a gather is the maximum over the gathered workers).

A gather beside a two-phase exchange's all-to-all waits one round and
travels with the shards' gather: three rounds a two-phase bucket, whatever
its tensors too small to split.

Every kind acts element by element, so a tensor's result is the same, bit
for bit, whether its messages travel alone or in a bucket, and the transport
counts each exchange's part of a fused collective as its own bytes. (A float sum over more than two processes is the one caveat: a
ring all-reduce may add a value's terms in an order that depends on where the
value sits in the buffer. And where a compressor does float matrix products around its
messages, PowerSGD, XLA:CPU may compile them with other fusions in the bucketed program than
in the per-tensor one, which round differently by a few ulp: measured with one device per
worker, not with vmap inside shard_map.) A conditional round
(``Message.when``: 3LC's zero-run fallback) travels alone, inside its ``lax.cond``.

Encoding per bucket. Fusing the collectives leaves the compute per tensor:
one encode and one decode kernel per tensor. A compressor whose encoder is
elementwise given per-tensor parameters (``bucket_encode``:
:class:`~jaxcomp.core.BucketCompressor`: TernGrad, QSGD, int8, 3LC) encodes a
bucket at once instead: :func:`jaxcomp.transforms.compress` hands the bucket's
tensors to one :func:`jaxcomp.exchange.allgather.bucket_exchange_steps`, which lays them
side by side (:mod:`jaxcomp.exchange.layout`), reduces the per-tensor statistics (a
scale, a norm, TernGrad's σ, the non-finite check) for the whole bucket at once
(by chunk, then by tensor), and encodes, gathers and aggregates the bucket as
one. The bucket's
payload is its tensors' payloads end to end, so bytes and numbers are those
of the tensors encoded one at a time (the per-tensor exchange is the same code
on a bucket of one). This applies with any ``bucket_bytes > 0``, over
``vmap``-simulated workers too (there only the collectives stay per tensor).

The buckets (:func:`assign`) are filled in reverse order of the gradient
leaves, about ``bucket_bytes`` of float32 gradient each: the last layers,
whose gradients backpropagation produces first, go first, as in DDP (Li et
al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020, §3.2.3 and §4.2).

The default, :data:`DEFAULT_BUCKET_BYTES` = 512 KiB, is half PyTorch DDP's
first bucket (``_DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB, kept small so that
communication starts early; its later buckets are 25 MiB, ``bucket_cap_mb``,
and Horovod's fusion buffer 64 MiB). Here every bucket is that small: a
compressed bucket carries a sixteenth to a thirty-second of its float bytes
(16 to 32 KiB), and the pipeline (:func:`_pipelined`) overlaps a bucket's
transfer with the next ones' encoding only if there are several; over
emulated links, ResNet-110's step was as fast or faster with 512 KiB as
with larger buckets (docs/design.md, "Choices in the code"). The price is more collectives on large models
(GPT-2 small: several hundred a step), which fast interconnects may not
repay: pass a larger ``bucket_bytes`` there. The two-phase exchange waits for
every worker three times a bucket (agreement, all-to-all, gather): one
bucket for a whole model speeds TernGrad's and 3LC's two-phase step over a
slow link but slows QSGD's and int8's, whose larger payloads gain from the
pipeline (docs/design.md, "Choices in the code"): the default stays.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.exchange import transport

DEFAULT_BUCKET_BYTES = 2**19


def check_bucket_bytes(bucket_bytes: Any) -> None:
  """Raises a clear error unless ``bucket_bytes`` is an int >= 0."""
  if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) or bucket_bytes < 0:
    raise ValueError(f"bucket_bytes must be an int >= 0 (0: one exchange per tensor); got {bucket_bytes!r}.")


def assign(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
  """Tensors' indices grouped into buckets of about ``bucket_bytes`` (static).

  Args:
    sizes: every tensor's size in bytes (of float32 gradient), in leaf order.
    bucket_bytes: a bucket is closed once it holds at least this many bytes;
      a tensor larger than that fills one alone. ``0``: every tensor alone,
      in leaf order (the per-tensor exchange).

  Returns:
    The buckets in the order they are exchanged, each a list of leaf indices:
    leaves are taken from the last to the first.
  """
  check_bucket_bytes(bucket_bytes)
  if bucket_bytes == 0:
    return [[i] for i in range(len(sizes))]
  out, current, filled = [], [], 0
  for i in reversed(range(len(sizes))):
    current.append(i)
    filled += int(sizes[i])
    if filled >= bucket_bytes:
      out.append(current)
      current, filled = [], 0
  if current:
    out.append(current)
  return out


def run(steps: Sequence[Any], sizes: Sequence[int], bucket_bytes: int,
        axis_name: parallel.AxisName) -> tuple[list[Any], list[transport.Traffic]]:
  """Runs every exchange of ``steps`` in lockstep, with one fused collective per bucket and round.

  Args:
    steps: one exchange per tensor: a generator of
      :class:`~jaxcomp.core.Message` s that returns its result, or a result.
    sizes: every tensor's bytes of float32 gradient.
    bucket_bytes: the buckets' size (:func:`assign`); ``0``: every exchange
      runs alone, each message (each array of a payload) in its own collective.
    axis_name: the worker axis. Buckets are fused only over a device axis
      (``shard_map``, ``pmap``, several processes): over ``vmap``-simulated
      workers alone nothing crosses a wire, and every exchange runs alone.

  Returns:
    The exchanges' results, in the order of ``steps``, and the bytes each
    moved (:class:`~jaxcomp.exchange.transport.Traffic`: a fused collective
    moves the sum of its parts, each counted to its exchange).
  """
  fuse = bucket_bytes > 0 and any(
      parallel.is_device_axis(n) for n in parallel.axis_names(axis_name))
  if not fuse:
    counted = [transport.counted(s, axis_name) for s in steps]
    return [result for result, _ in counted], [traffic for _, traffic in counted]
  traffic = [transport.Traffic() for _ in steps]
  return _pipelined(steps, assign(sizes, bucket_bytes), axis_name, traffic), traffic


AHEAD = 2  # bucket k's all-gather carries the agreement of bucket k + AHEAD


def _pipelined(steps: Sequence[Any], groups: Sequence[Sequence[int]], axis_name: parallel.AxisName,
               traffic: list[transport.Traffic]) -> list[Any]:
  """Runs the buckets one after another, with one collective per bucket and round.

  A bucket's exchanges advance in lockstep: each round joins their messages
  of one kind into one collective (:func:`deliver`). A bucket's agreement
  (its first message when that is a ``"max"``: a few values per tensor that
  its encoding waits for, such as TernGrad's scalars; the non-finite flags
  travel with a bucket's own gather, see
  :func:`jaxcomp.update_steps.agree_on_nonfinite`) travels :data:`AHEAD`
  buckets early: bucket ``k``'s all-gather also carries bucket ``k + 2``'s
  values, and each worker takes their maximum over
  the gathered workers (exact, so the numbers are those of a ``pmax``). The
  first two buckets' agreements share the step's first collective.

  This orders the step as a pipeline. Bucket ``k``'s gather depends on its
  encoding, which depends on bucket ``k − 2``'s gather; so the wire starts
  with the first bucket, and while bucket ``k`` is on the wire bucket
  ``k + 1`` is encoded (its agreement came with bucket ``k − 1``), the later
  ones' statistics are computed and the earlier ones decoded. With the
  agreement one bucket ahead, the wire waited for each next encoding; with
  every bucket's agreement in one collective, the first byte waited for every
  bucket's statistics (docs/design.md, "Choices in the code").

  Who overlaps what: XLA:CPU has no scheduler for it; its runtime runs every
  operation whose inputs are ready on its thread pool, and a collective
  blocks its thread while the others compute. On GPU, XLA runs collectives
  asynchronously (NCCL on their own stream) and its latency-hiding scheduler
  (``--xla_gpu_enable_latency_hiding_scheduler=true``, set in NVIDIA's JAX
  images; JAX's "GPU performance tips") moves independent kernels into a
  collective's span; these dependencies leave it the next buckets' encoding
  to move there.
  """
  results = [None] * len(steps)
  ahead: dict[int, dict] = {}  # bucket -> its next messages, once its agreement went with an earlier round

  def advance(into: dict, i: int, reply: Any) -> None:
    message, results[i] = transport.advance(steps[i], reply)
    if message is not None:
      into[i] = message

  def start(b: int) -> dict:
    """The first message of each of bucket ``b``'s exchanges (a plain result is stored at once)."""
    first = {}
    for i in groups[b]:
      if inspect.isgenerator(steps[i]):
        advance(first, i, None)
      else:
        results[i] = steps[i]
    return first

  def riders(kind: str, b: int) -> list[tuple[int, int]]:
    """``(bucket, exchange)`` of the agreements that go with bucket ``b``'s round of ``kind``."""
    if kind not in ("max", "gather"):
      return []
    out = []
    for c in range(b + 1, min(b + AHEAD + (kind == "gather"), len(groups))):
      if c not in ahead:
        first = ahead[c] = start(c)
        out += [(c, i) for i in sorted(first) if first[i].kind == "max"]
    return out

  for b in range(len(groups)):
    pending = ahead.pop(b) if b in ahead else start(b)
    while pending:
      current, pending = pending, {}
      rounds = {}  # (kind, over): a hop over part of the axes (Message.over) is a collective of its own
      for i in sorted(current):
        if current[i].when is not None:  # a conditional round (a fallback) travels alone, inside its lax.cond
          advance(pending, i, transport.deliver(current[i], axis_name, traffic[i]))
        else:
          rounds.setdefault((current[i].kind, current[i].over), []).append(i)
      if ("all_to_all", None) in rounds and ("gather", None) in rounds:
        # A gather waits for the two-phase exchanges' gather of their shards, one round later, and
        # travels with it: one all-gather a bucket, not two (a tensor too small to split beside them).
        pending.update((i, current[i]) for i in rounds.pop(("gather", None)))
      for (kind, over), ids in rounds.items():
        axis = axis_name if over is None else over
        extra = [(c, i, ahead[c].pop(i)) for c, i in riders(kind, b)] if over is None else []
        for i, message in [(i, current[i]) for i in ids] + [(i, m) for _, i, m in extra]:
          traffic[i].add(message, parallel.axis_size(axis), kind)  # as it travels: a rider's max goes with the gather
        replies = deliver([current[i].tree for i in ids] + [m.tree for _, _, m in extra], kind, axis)
        for i, reply in zip(ids, replies):
          advance(pending, i, reply)
        for (c, i, _), reply in zip(extra, replies[len(ids):]):
          advance(ahead[c], i, jax.tree.map(parallel.max_leading, reply) if kind == "gather" else reply)
  return results


def deliver(trees: Sequence[Any], kind: str, axis_name: parallel.AxisName) -> list[Any]:
  """The results of one message of ``kind`` per tree, by one collective (per dtype for reductions).

  A payload of several arrays (codes and a scale) is joined too, even alone.
  """
  flat = [jax.tree.flatten(t) for t in trees]
  leaves = [jnp.asarray(leaf) for ls, _ in flat for leaf in ls]
  if len(leaves) <= 1:  # nothing to join
    return [transport.collective(kind, t, axis_name) for t in trees]
  # Under shard_map's varying-axes typing a joined buffer varies over every axis any of its parts
  # varies over, and so would every part of the result: only arrays typed alike are joined (a
  # hierarchy's whole tensors, the same on every device of a host, apart from its slices).
  out = [None] * len(leaves)
  typed: dict[frozenset, list[int]] = {}
  for i, a in enumerate(leaves):
    typed.setdefault(parallel.varying_axes(a), []).append(i)
  for ids in typed.values():
    for i, result in zip(ids, _joined([leaves[i] for i in ids], kind, axis_name)):
      out[i] = result
  results, start = [], 0
  for ls, treedef in flat:
    results.append(treedef.unflatten(out[start:start + len(ls)]))
    start += len(ls)
  return results


def _joined(leaves: list[jax.Array], kind: str, axis_name: parallel.AxisName) -> list[jax.Array]:
  """The results of one collective of ``kind`` over ``leaves`` joined (one per dtype for reductions)."""
  # Each array is computed as it would be alone: without the barrier XLA may fuse its producer
  # into the join, and a fused producer can round differently (XLA:CPU computes a dot fused into
  # a loop in another order than its matrix-multiply kernel: PowerSGD's P = M Q moved by 1 ulp).
  leaves = list(lax.optimization_barrier(leaves))
  if kind == "gather":
    out = _moved(leaves, lambda buf: parallel.all_gather(buf, axis_name), lead=0)
  elif kind == "all_to_all":
    out = _moved(leaves, lambda buf: parallel.all_to_all(buf, axis_name), lead=1)
  elif kind in ("max", "sum", "mean"):
    out = _reduced(leaves, kind, axis_name)
  else:
    raise ValueError(f"unknown message kind {kind!r}; expected one of {core.MESSAGE_KINDS}.")
  return list(lax.optimization_barrier(out))  # and each result is used as it would be alone


def _as_bytes(a: jax.Array, lead: int) -> jax.Array:
  """``a`` as ``uint8``, its first ``lead`` axes kept and the rest flattened into one axis of bytes."""
  head = a.shape[:lead]
  if a.dtype == jnp.bool_:
    a = a.astype(jnp.uint8)
  if a.dtype != jnp.uint8:
    a = lax.bitcast_convert_type(a, jnp.uint8)  # itemsize 1: same shape; else one more axis of bytes
  return a.reshape(head + (-1,))


def _from_bytes(b: jax.Array, like: jax.Array, lead: int) -> jax.Array:
  """The inverse of :func:`_as_bytes`: ``b``'s last axis read as ``like``'s trailing shape and dtype.

  ``b`` has the leading axes the collective produced (a new worker axis for a
  gather, the same worker axis for an all-to-all) and one axis of bytes.
  """
  head = b.shape[:-1]
  shape = head + like.shape[lead:]
  dtype = like.dtype
  if dtype == jnp.bool_:
    return b.reshape(shape).astype(jnp.bool_)
  if dtype == jnp.uint8:
    return b.reshape(shape)
  size = dtype.itemsize
  if size == 1:
    return lax.bitcast_convert_type(b, dtype).reshape(shape)
  return lax.bitcast_convert_type(b.reshape(head + (-1, size)), dtype).reshape(shape)


def _moved(leaves: list[jax.Array], collective, lead: int) -> list[jax.Array]:
  """A byte-moving collective over all ``leaves`` at once: one buffer, cut back into the leaves."""
  parts = [_as_bytes(a, lead) for a in leaves]
  moved = collective(jnp.concatenate(parts, axis=-1))
  out, start = [], 0
  for a, part in zip(leaves, parts):
    width = part.shape[-1]
    out.append(_from_bytes(lax.slice_in_dim(moved, start, start + width, axis=moved.ndim - 1), a, lead))
    start += width
  return out


def _reduced(leaves: list[jax.Array], kind: str, axis_name: parallel.AxisName) -> list[jax.Array]:
  """An elementwise reduction of all ``leaves``: one collective per dtype over their values end to end."""
  out = [None] * len(leaves)
  by_dtype = {}
  for i, a in enumerate(leaves):
    by_dtype.setdefault(a.dtype, []).append(i)
  for ids in by_dtype.values():
    joined = jnp.concatenate([leaves[i].reshape(-1) for i in ids])
    reduced = transport.collective(kind, joined, axis_name)
    start = 0
    for i in ids:
      n = leaves[i].size
      out[i] = reduced[start:start + n].reshape(leaves[i].shape)
      start += n
  return out
