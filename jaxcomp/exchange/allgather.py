"""The all-gather exchange: agree, encode, gather every worker's payload, aggregate.

The default exchange of one tensor, on every worker::

    agreed   = max over workers of compressor.agree(x)   # optional (TernGrad's scalar)
    payload  = compressor.encode(x, key, agreed)          # packed codes and scales
    gathered = all_gather(payload)                        # the wire: N payloads
    mean     = compressor.aggregate(gathered)             # decode every payload, average

Each is a generator of :class:`~jaxcomp.core.Message` s
(:mod:`jaxcomp.exchange.transport` runs and counts them); :func:`exchange`
runs one on its own. :func:`bucket_exchange_steps` is the same exchange for a
bucket of tensors encoded at once (:mod:`jaxcomp.exchange.layout`).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.exchange import layout as layout_lib
from jaxcomp.exchange import transport


def exchange_steps(
    compressor: core.Compressor,
    x: jax.Array,
    key: jax.Array,
    axis_name: parallel.AxisName,
    state: Any = None,
    *,
    need_own: bool = False,
):
  """The all-gather exchange of one tensor as a generator of messages (see :func:`exchange`)."""
  shape = x.shape
  agreed = compressor.agree(x)
  if agreed is not None and parallel.axis_names(axis_name):
    agreed = yield core.Message("max", agreed)
  payload, metrics = compressor.encode_with_metrics(x, key, agreed)
  # The payload has several consumers (the collective, this worker's own
  # decode). Without the barrier XLA may fuse the encoder into each of them and
  # run it once per consumer. The barrier prevents that, although it is gone
  # from the compiled program; it does not cut a producer from the fusion of a
  # single consumer (that is what jaxcomp.exchange.layout.materialize is for).
  payload = lax.optimization_barrier(payload)
  message = core.Message("gather", payload, encoded=compressor.encoded_bytes(payload, shape))
  if not parallel.axis_names(axis_name):  # one worker: counted as sent, decoded here
    yield message
    own = compressor.decode(payload, shape)
    return core.Exchanged(own, own if need_own else None, payload, state, metrics)
  own = compressor.decode(payload, shape) if need_own else None
  mean = compressor.aggregate((yield message), shape)
  return core.Exchanged(mean, own, payload, state, metrics)


def bucket_exchange_steps(
    compressor: core.Compressor,
    xs: Sequence[jax.Array],
    keys: jax.Array,
    axis_name: parallel.AxisName,
    *,
    layout: layout_lib.Layout,
    need_own: bool = False,
):
  """The all-gather exchange of a bucket of tensors, each encode and decode run once for all (messages).

  For a compressor with ``bucket_encode`` (:class:`~jaxcomp.core.BucketCompressor`),
  tensors ``xs`` with their keys stacked in ``keys``:
  every tensor's agreement (one message), one :meth:`~jaxcomp.core.Compressor.encode_bucket`
  over the bucket's layout (:mod:`jaxcomp.exchange.layout`), one gather of the bucket's
  payload and one aggregate; for error feedback, each tensor's own payload is
  decoded alone (see the comment below). ``layout`` is the bucket's layout in
  the compressor's planes, which may carry the bucket's input joined
  (:meth:`~jaxcomp.exchange.layout.Layout.joined_input`). Returns one :class:`~jaxcomp.core.Exchanged` per tensor, with
  the numbers of :func:`exchange_steps` on that tensor alone: the bucket's
  payload is its tensors' payloads end to end (so are its bytes), and its
  elementwise work is theirs (a bucket of one is the per-tensor exchange).
  """
  shapes = [x.shape for x in xs]
  sizes = [core.size_of(s) for s in shapes]
  flats = [x.reshape(-1) for x in xs]
  agreed = compressor.agree_bucket(flats, layout)
  if agreed is not None and parallel.axis_names(axis_name):  # one message of every tensor's values: the maximum is elementwise
    agreed = yield core.Message("max", agreed)
  payload = compressor.encode_bucket(flats, keys, agreed, layout)
  payload = lax.optimization_barrier(payload)  # as in exchange_steps: encoded once, for every consumer
  parts = layout_lib.payload_parts(payload, [compressor.payload_struct(n) for n in sizes])
  own = [None] * len(xs)
  if need_own:
    # Each tensor's own decode stays per tensor: the residual x − own fuses with it, and XLA:CPU
    # contracts that product and difference into a fused multiply-add where they share a loop; a
    # bucket-wide decode would be a loop of its own in some buckets and not in others, and a
    # tensor's residual must not depend on its bucket. A compressor whose decode is exact
    # computes it from the tensor (own_bucket: 3LC's round(x/m)·m); otherwise its part is decoded.
    # Either way after the encode: the wire waits for the encode, not for this.
    filled = [a for a in jax.tree.leaves(payload) if a.size]
    own = compressor.own_bucket(core.after(flats, filled[0].reshape(-1)[0] != 0) if filled else flats,
                                payload, layout)
    own = ([compressor.decode(part, s) for part, s in zip(parts, shapes)] if own is None
           else [o.reshape(s) for o, s in zip(own, shapes)])
  message = core.Message("gather", payload, encoded=bucket_encoded(compressor, payload, layout, parts, shapes))
  if not parallel.axis_names(axis_name):  # one worker: the mean is its own bucket decoded
    yield message
    means = [m.reshape(s) for m, s in zip(compressor.decode_bucket(payload, layout), shapes)]
  else:
    means = [m.reshape(s) for m, s in zip(compressor.aggregate_bucket((yield message), layout), shapes)]
  return [core.Exchanged(m, o, p, None, {}) for m, o, p in zip(means, own, parts)]


def bucket_encoded(compressor: core.Compressor, payload: core.Payload, layout: layout_lib.Layout,
                   parts: Sequence[core.Payload], shapes: Sequence[Any]) -> Any:
  """The exact size of a bucket's variable-length payload (a message's ``encoded``), or ``None``.

  ``parts`` are the tensors' payloads in ``payload`` and ``shapes`` their shapes.
  """
  encoded = compressor.encoded_bytes_bucket(payload, layout)  # every tensor's, in one pass
  if encoded is None:
    encoded = [compressor.encoded_bytes(part, s) for part, s in zip(parts, shapes)]
    encoded = None if any(e is None for e in encoded) else jnp.stack([jnp.asarray(e, jnp.uint32) for e in encoded])
  return None if encoded is None else jnp.sum(jnp.asarray(encoded, jnp.uint32), dtype=jnp.uint32)


def exchange(compressor: core.Compressor, x: jax.Array, key: jax.Array, axis_name: parallel.AxisName,
             state: Any = None, *, need_own: bool = False) -> core.Exchanged:
  """Compresses ``x`` on every worker and returns the mean of all workers (the all-gather exchange, alone).

  It has the signature of :meth:`Compressor.exchange <jaxcomp.core.Compressor.exchange>`
  with the compressor in front.

  Args:
    compressor: the per-tensor compressor.
    x: this worker's tensor, float32.
    key: this worker's key for this tensor and step.
    axis_name: the worker axis (``None``: a single worker, quantize and
      dequantize locally).
    state: the compressor's per-tensor state; passed through unchanged.
    need_own: also return ``decode(own payload)`` (error feedback needs it).

  Returns:
    A :class:`~jaxcomp.core.Exchanged`: the float32 mean of every worker's
    decoded tensor, this worker's own decoded tensor (``None`` unless
    ``need_own``), its payload, ``state``, and the counters of
    :meth:`Compressor.encode_with_metrics`.
  """
  return transport.run(exchange_steps(compressor, x, key, axis_name, state, need_own=need_own), axis_name)
