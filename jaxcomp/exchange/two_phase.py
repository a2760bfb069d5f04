"""Two-phase compressed all-reduce: reduce-scatter of compressed chunks, then all-gather.

The default exchange (:func:`jaxcomp.exchange.allgather.exchange`) hands
every worker's whole payload of ``P`` bytes to ``lax.all_gather``, so each
worker receives ``(N − 1)·P`` bytes, a figure that grows with the number of
workers ``N``; a float ring all-reduce receives ``2(N − 1)/N·4n``. The
systems that made compression pay at scale reduce in two phases (Dryden et
al. §3.4: "gradient updates are quantized and then split up and scattered.
These slices are then unquantized, summed, and the result is quantized again
... distributed using the allgather"; 3LC's compressed gradient pushes and
compressed model pulls, §3 and Fig. 1). Per tensor, on worker ``w`` of ``N``:

1. **split**: the (error-corrected) tensor, flattened in C order and padded
   with zeros, is cut into ``N`` chunks of ``c`` values (:func:`split`);
2. **phase 1, reduce-scatter**: every chunk is encoded (what the compressor
   agrees on, e.g. TernGrad's shared scalar, is agreed per chunk with one
   ``pmax`` of ``N`` values); chunk ``j`` goes to worker ``j`` with
   ``lax.all_to_all``; worker ``j`` reduces the ``N`` payloads it received
   (by default :meth:`~jaxcomp.core.Compressor.aggregate`, their decoded
   mean): its *shard* of the mean;
3. **phase 2, all-gather**: worker ``j`` re-encodes its shard (a compressor's
   per-tensor scalars are now per shard, computed by the one worker that
   encodes it, so no agreement round) and ``lax.all_gather`` gives every
   worker all ``N`` shards, which it decodes and concatenates.

Each worker receives ``N − 1`` chunk payloads and ``N − 1`` shard payloads:
``≈ 2(N − 1)/N·P`` bytes plus per-chunk scalars (:func:`jaxcomp.exchange.plan.traffic`).

Semantics (tested in ``tests/test_two_phase.py``):

* **Unbiased compressors** (TernGrad, QSGD, stochastic ternary) stay
  unbiased end to end: the second quantization is stochastic with a key
  independent of the first phase's (split from the worker's key), so
  ``E[result] = E[shard] = mean of the inputs`` (TernGrad: of the inputs
  clipped per chunk; exactly unbiased with ``clip_sigma=None``).
* **Error feedback**: the usual residual ``r_w = x_w − decode(own chunks)``
  covers phase 1 (the caller keeps it, as for the all-gather); the worker that
  re-encodes shard ``j`` keeps a **second residual** for it (Dryden §3.4's
  reducer keeps its own error): it encodes ``shard_j + s_j`` and keeps
  ``s_j ← shard_j + s_j − decode(shard payload)``. So over any number of
  steps, ``mean_w(Σ_t x_w,t) = Σ_t result_t + mean_w(r_w) + s`` exactly up
  to float rounding (``s``: the shard residuals laid end to end).
* **The shard residual's shape**: the number of workers is known only at
  trace time, so the buffer is **full-size** (the tensor's shape, float32)
  on every worker, of which worker ``j`` uses the positions of its own shard
  ``j`` (the rest stays zero). It needs no ``num_workers`` at init and works
  for any ``N``, at the cost of one more tensor-sized buffer per worker.
* **signSGD**: phase 1 reduces to the exact integer vote counts; phase 2
  sends their sign (``{−1, 0, +1}``: a tie is 0) in base-3^5, 1.6 bits a
  value, so the result equals the all-gather's majority vote exactly.
  (A compressor supplies such a reduction with the hooks ``reduce_chunks``
  and ``shard_compressor``, see :func:`reduce_chunks`.)
* **Chunks are flat slices**: compressors with a per-column view (1-bit SGD,
  adaptive quantization) see each chunk as one column; QSGD's buckets never
  straddle two chunks (``c`` is a multiple of the bucket size).
* **Padding**: the last chunk's zero padding is encoded with it (it can shift
  that chunk's statistics, e.g. TernGrad's ``σ``) and its decoded values
  are dropped.
* **3LC** compresses its pulls this way, as the paper does (its servers
  compress the model deltas workers pull, §3): with the default error
  feedback both phases keep residuals. With ``capacity`` (the zero-run stream
  on the wire in a fixed buffer) both phases send the buffers, with a plain
  base-3^5 round where a stream did not fit (see :func:`two_phase_exchange`).
* **Refused**: compressors with their own exchange (``custom_exchange``:
  PowerSGD, whose all-reduces of the float factors already move
  ``≈ 2(N − 1)/N`` of them per worker) raise with ``exchange="two_phase"``
  and keep their own exchange with ``"auto"``.
* **Too small to split**: a tensor with fewer than ``N`` aligned blocks
  (:func:`split` returns ``None``) stays on the all-gather.
* **A bucket at once**: for a compressor that encodes buckets (TernGrad,
  QSGD, int8, 3LC), :func:`bucket_steps` runs a bucket's tensors through
  both phases with one encode, one collective and one decode per phase; what
  is per chunk and per shard stays so (a chunk and a shard are each a tensor
  to the encoder), and the numbers are each tensor's alone (int8 and QSGD:
  within 2 ulp, where XLA:CPU fuses a bucket's decode differently).

References:
  Dryden, Moon, Jacobs, Van Essen. *Communication Quantization for
  Data-parallel Training of Deep Neural Networks*. MLHPC 2016, §3.4.
  Lim, Andersen, Kaminsky. *3LC: Lightweight and Effective Traffic
  Compression for Distributed Machine Learning*. MLSys 2019, §3, Fig. 1.
  Thakur, Rabenseifner, Gropp. *Optimization of Collective Communication
  Operations in MPICH*. IJHPCA 2005 (reduce-scatter + all-gather).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.codecs import base243
from jaxcomp.exchange import allgather
from jaxcomp.exchange import layout as layout_lib
from jaxcomp.exchange import transport

# Chunk lengths are a multiple of 40 = lcm(4, 5, 8): whole bytes for 2-bit,
# base-3^5 and 1-bit codes, so no chunk pays for a partly filled byte.
ALIGN = 40


def unsupported(compressor: core.Compressor) -> Optional[str]:
  """Why ``compressor`` has no two-phase form, or ``None`` if it has one."""
  if compressor.custom_exchange and _plain(compressor) is None:
    return (f"{type(compressor).__name__} runs its own exchange (custom_exchange), which "
            "exchange='two_phase' cannot split into chunks. (PowerSGD's all-reduces of its "
            "float factors already move about 2(N-1)/N of them per worker.) Use "
            "exchange='all_gather' or 'auto', which keeps its own exchange.")
  return None


# -- the static layout ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Split:
  """How a tensor of ``n`` values is cut for ``workers``: ``workers`` chunks of ``chunk``."""

  n: int
  workers: int
  chunk: int

  @property
  def padded(self) -> int:
    return self.workers * self.chunk


def alignment(compressor: core.Compressor) -> int:
  """Chunk lengths are multiples of this: :data:`ALIGN`, or for a compressor with buckets (QSGD) of
  ``lcm(bucket_size, 8)`` (whole buckets, whatever the bits per value: 8 values of ``b`` bits are whole bytes)."""
  block = compressor.chunk_block()
  return math.lcm(8, block) if block else ALIGN


def split(compressor: core.Compressor, n: int, workers: int) -> Optional[Split]:
  """The chunks of a tensor of ``n`` values, or ``None`` if it is too small to split.

  ``c = ceil(n / N)`` rounded up to :func:`alignment`; too small means
  ``n < N·alignment`` (some worker would get no aligned block of real values),
  or a single worker.
  """
  a = alignment(compressor)
  if workers < 2 or n < workers * a:
    return None
  chunk = -(-n // workers)
  chunk = -(-chunk // a) * a
  return Split(n=n, workers=workers, chunk=chunk)


# -- per-compressor hooks -----------------------------------------------------


def reduce_chunks(compressor: core.Compressor, received: core.Payload, chunk: int) -> jax.Array:
  """Phase 1's reduction of the ``N`` payloads of one chunk (leading worker axis).

  :meth:`~jaxcomp.core.Compressor.reduce_chunks`: by default the mean of the
  decoded payloads; signSGD's integer vote counts.
  """
  return compressor.reduce_chunks(received, (chunk,))


def shard_compressor(compressor: core.Compressor) -> core.Compressor:
  """The compressor phase 2 re-encodes shards with (the compressor's ``shard_compressor``, else itself)."""
  return compressor.shard_compressor or compressor


class TernaryPayload(NamedTuple):
  codes: jax.Array  # uint8[ceil(n/5)]: base-3^5 bytes of values in {-1, 0, +1}


@dataclasses.dataclass(frozen=True)
class Ternary(core.Compressor):
  """Exact codec of values in ``{−1, 0, +1}`` (the sign of its input), base-3^5: 1.6 bits a value.

  Phase 2 of signSGD's majority vote: the shard holds vote counts and this
  sends their sign, ties (0) included, which one sign bit could not.
  """

  def encode(self, x, key, agreed):
    del key, agreed
    return TernaryPayload(codes=base243.base243_encode(jnp.sign(x.reshape(-1)).astype(jnp.int8)))

  def decode(self, payload, shape):
    return base243.base243_decode(payload.codes, core.size_of(shape)).astype(jnp.float32).reshape(shape)


# -- the exchange ---------------------------------------------------------------


class TwoPhaseResult(NamedTuple):
  """What :func:`two_phase_exchange` returns (its bytes: the transport counts its messages).

  Attributes:
    mean: float32, the tensor's shape: the decoded shards, the same on every worker.
    own: float32, what this worker's phase-1 chunks decode to (``None`` unless
      asked): error feedback's ``x − own`` is the phase-1 residual.
    payload: this worker's phase-1 payload, ``N`` chunk payloads stacked.
    shard_residual: the new full-size phase-2 residual (``None`` if none was given).
    metrics: the encoders' counters, summed over the chunks and the shard.
  """

  mean: jax.Array
  own: Optional[jax.Array]
  payload: core.Payload
  shard_residual: Optional[jax.Array]
  metrics: dict[str, jax.Array]


def _plain(compressor: core.Compressor) -> Optional[core.Compressor]:
  """The compressor's fixed-size fallback wire (3LC's base-3^5 behind its zero-run buffer), if any."""
  return compressor.plain_compressor


def _decode_all(compressor: core.Compressor, payloads: core.Payload, chunk: int) -> jax.Array:
  """Decodes stacked payloads of ``chunk`` values each and lays them end to end (flat)."""
  return jax.vmap(lambda p: compressor.decode(p, (chunk,)))(payloads).reshape(-1)


def _encoded(compressor: core.Compressor, payloads: core.Payload, chunk: int) -> Optional[jax.Array]:
  """The exact variable-length size of stacked chunk payloads (a message's ``encoded``), or ``None``."""

  def one(payload):
    size = compressor.encoded_bytes(payload, (chunk,))
    return None if size is None else jnp.asarray(size, jnp.uint32)

  sizes = jax.vmap(one)(payloads)
  return None if sizes is None else jnp.sum(sizes, dtype=jnp.uint32)


def _add(metrics: dict, more: dict) -> dict:
  out = dict(metrics)
  for k, v in more.items():
    out[k] = out.get(k, 0) + jnp.sum(jnp.asarray(v)).astype(jnp.int32)
  return out


class _Sent(NamedTuple):
  """One phase's message: what it decodes to here, and the encoders' counters."""

  payload: core.Payload
  decoded_here: Optional[jax.Array]  # what this worker's own message decodes to (flat), if asked
  metrics: dict


def _phase1_encode(compressor, chunks, key, axis_name, need_own):
  """Agrees per chunk (one pmax of N values), encodes every chunk with its own key."""
  workers, c = chunks.shape
  agreed = jax.vmap(compressor.agree)(chunks)
  if agreed is not None:
    agreed = yield core.Message("max", agreed)
  keys = jax.vmap(lambda j: jax.random.fold_in(key, j))(jnp.arange(workers))
  payload, metrics = jax.vmap(compressor.encode_with_metrics)(chunks, keys, agreed)
  payload = lax.optimization_barrier(payload)  # the wire: materialized once (see allgather.exchange_steps)
  # The chunks' counters summed: one scalar a counter, whatever the number of workers (the state's shape).
  metrics = _add(_add({}, metrics), jax.vmap(lambda p: compressor.extra_metrics(p, (c,)))(payload))
  plain = _plain(compressor)
  own = None
  if need_own:
    # With a fallback wire, the buffer of a stream that did not fit holds no codes; the plain
    # encoding quantizes the same way and always decodes.
    source = payload if plain is None else jax.vmap(plain.encode)(chunks, keys, agreed)
    own = _decode_all(plain or compressor, source, c)
  return _Sent(payload, own, metrics), (keys, agreed)


def _phase1_reduce(compressor, sent, chunks, keys_agreed, axis_name):
  """Scatters chunk j to worker j and reduces what arrived; with a fallback wire, a plain round if needed."""
  workers, c = chunks.shape
  received = yield core.Message("all_to_all", sent.payload, encoded=_encoded(compressor, sent.payload, c))
  plain = _plain(compressor)
  if plain is None:
    return reduce_chunks(compressor, received, c), sent
  # Every worker must take the same branch (the fallback runs a collective): agree on one flag.
  overflow = (yield core.Message("max", jnp.any(~compressor.fits(received)).astype(jnp.uint8))) > 0
  keys, agreed = keys_agreed
  encode = lambda: jax.vmap(plain.encode)(chunks, keys, agreed)  # only where a stream overflowed
  plain_payload = parallel.replicated_cond(
      overflow, encode, lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(encode)))
  plain_received = yield core.Message("all_to_all", plain_payload, when=overflow, encoded=0)
  shard = parallel.replicated_cond(overflow, lambda: reduce_chunks(plain, plain_received, c),
                                   lambda: reduce_chunks(compressor, received, c))
  return shard, sent._replace(metrics=_add(sent.metrics, {"zero_run_fallback_rounds": overflow}))


def _with_residual(shard: jax.Array, residual: Optional[jax.Array], lay: Split, start: jax.Array) -> jax.Array:
  """The shard plus this worker's part of its full-size residual (``start``: the shard's first value)."""
  if residual is None:
    return shard
  padded = jnp.pad(residual.reshape(-1).astype(jnp.float32), (0, lay.padded - lay.n))
  return shard + lax.dynamic_slice(padded, (start,), (lay.chunk,))


def _kept(y: jax.Array, sent: jax.Array, lay: Split, start: jax.Array) -> jax.Array:
  """The new full-size residual (flat): ``y − sent`` at this worker's shard, zero elsewhere."""
  return lax.dynamic_update_slice(jnp.zeros((lay.padded,), jnp.float32), y - sent, (start,))[:lay.n]


def _phase2(compressor, shard, shard_residual, lay, key, axis_name):
  """Re-encodes this worker's shard (plus its residual), gathers all shards, decodes them."""
  c = lay.chunk
  start = parallel.axis_index(axis_name) * c
  y = _with_residual(shard, shard_residual, lay, start)
  agreed = compressor.agree(y)  # one encoder per shard: its own scalars, no agreement round
  payload, metrics = compressor.encode_with_metrics(y, key, agreed)
  payload = lax.optimization_barrier(payload)
  metrics = _add(metrics, compressor.extra_metrics(payload, (c,)))
  gathered = yield core.Message("gather", payload, encoded=_encoded(compressor, _stacked(payload), c))
  plain = _plain(compressor)
  if plain is None:
    mean = _decode_all(compressor, gathered, c)
    sent_here = compressor.decode(payload, (c,)) if shard_residual is not None else None
  else:
    plain_payload = plain.encode(y, key, agreed)
    fits = jnp.all(compressor.fits(gathered))  # the same on every worker: all lengths were gathered
    plain_gathered = yield core.Message("gather", plain_payload, when=~fits, encoded=0)
    mean = parallel.replicated_cond(fits, lambda: _decode_all(compressor, gathered, c),
                                    lambda: _decode_all(plain, plain_gathered, c))
    sent_here = plain.decode(plain_payload, (c,))
    metrics = _add(metrics, {"zero_run_fallback_rounds": ~fits})
  new_residual = None
  if shard_residual is not None:
    new_residual = _kept(y, sent_here, lay, start).reshape(shard_residual.shape)
  return mean[:lay.n], new_residual, _Sent(payload, None, metrics)


def _stacked(payload: core.Payload) -> core.Payload:
  return jax.tree.map(lambda a: a[None], payload)


def reduce_scatter_steps(compressor: core.Compressor, x: jax.Array, key: jax.Array, axis_name: parallel.AxisName,
                         lay: Split, *, need_own: bool = False):
  """Phase 1 alone, a compressed reduce-scatter (messages): ``(shard, sent)``.

  ``x`` is cut into ``lay.workers`` chunks of ``lay.chunk`` (zero padded),
  each encoded with ``key`` folded with its index, chunk ``j`` sent to
  worker ``j``, and what arrives reduced (:func:`reduce_chunks`): ``shard``,
  float32 ``(lay.chunk,)``, is this worker's chunk of the mean (signSGD's:
  its vote counts). ``sent`` holds this worker's payload, its counters and,
  with ``need_own``, what its chunks decode to (flat, padded).
  """
  workers = lay.workers
  chunks = jnp.pad(x.reshape(-1).astype(jnp.float32), (0, lay.padded - lay.n)).reshape(workers, lay.chunk)
  sent, keys_agreed = yield from _phase1_encode(compressor, chunks, key, axis_name, need_own)
  shard, sent = yield from _phase1_reduce(compressor, sent, chunks, keys_agreed, axis_name)
  return shard.astype(jnp.float32), sent


def two_phase_exchange(compressor: core.Compressor, x: jax.Array, key: jax.Array, axis_name: parallel.AxisName,
                       shard_residual: Optional[jax.Array] = None, *, need_own: bool = False) -> TwoPhaseResult:
  """The two-phase exchange of one tensor, run on its own (see :func:`two_phase_steps`)."""
  return transport.run(two_phase_steps(compressor, x, key, axis_name, shard_residual, need_own=need_own),
                       axis_name)


def two_phase_steps(
    compressor: core.Compressor,
    x: jax.Array,
    key: jax.Array,
    axis_name: parallel.AxisName,
    shard_residual: Optional[jax.Array] = None,
    *,
    need_own: bool = False,
):
  """The two-phase exchange of one tensor (see the module docstring), as a generator of messages.

  It yields its collectives as :class:`~jaxcomp.core.Message` s (run them with
  :func:`jaxcomp.exchange.transport.run`, or fused with other tensors' by
  :func:`jaxcomp.exchange.buckets.run`, which count their bytes) and returns a
  :class:`TwoPhaseResult`. The fallback rounds of a compressor with a
  fallback wire are conditional messages (``Message.when``).

  With a compressor that has a fallback wire (3LC with ``capacity``: its
  zero-run stream in a fixed buffer), both phases send the buffers; if a
  stream did not fit, that phase runs a second round with the plain
  base-3^5 payloads, on every worker alike (phase 1 agrees on it with a
  one-byte ``pmax``; in phase 2 every worker sees every length). The
  fallback changes bytes, never numbers; the rounds that ran are counted in
  ``zero_run_fallback_rounds``, the streams that did not fit in
  ``zero_run_fallbacks``.

  Args:
    compressor: a compressor without its own exchange (or with a fallback wire).
    x: this worker's float32 tensor (error feedback already added).
    key: this worker's key for this tensor and step; phase 1 uses one half
      of it (folded with the chunk index), phase 2 the other.
    axis_name: the worker axis, as for :func:`jaxcomp.exchange.allgather.exchange`.
    shard_residual: the full-size phase-2 residual (the tensor's shape,
      float32), or ``None`` for no phase-2 error feedback.
    need_own: also return ``own`` (error feedback needs it).

  Returns:
    A :class:`TwoPhaseResult`.

  Raises:
    ValueError: for a compressor with its own exchange, or a tensor too small
      to split over this axis (use :func:`jaxcomp.exchange.plan.choose` first).
  """
  reason = unsupported(compressor)
  if reason:
    raise ValueError(reason)
  shape, n = x.shape, x.size
  workers = parallel.axis_size(axis_name)
  lay = split(compressor, n, workers)
  if lay is None:
    raise ValueError(f"a tensor of {n} values is too small to split over {workers} workers "
                     f"(needs >= {workers * alignment(compressor)}); use the all-gather.")
  key1, key2 = jax.random.split(key)
  shard, first = yield from reduce_scatter_steps(compressor, x, key1, axis_name, lay, need_own=need_own)
  mean, new_residual, second = yield from _phase2(shard_compressor(compressor), shard,
                                                  shard_residual, lay, key2, axis_name)
  own = None if first.decoded_here is None else first.decoded_here[:n].reshape(shape)
  return TwoPhaseResult(
      mean=mean.reshape(shape),
      own=own,
      payload=first.payload,
      shard_residual=new_residual,
      metrics=_add(first.metrics, second.metrics),
  )





# -- a bucket at once -----------------------------------------------------------


def bucket_applies(compressor: core.Compressor) -> bool:
  """Whether :func:`bucket_steps` can exchange a bucket for ``compressor``.

  A compressor that encodes buckets (``bucket_encode``), without a shard
  codec or a fallback wire. Phase 1 reduces with ``aggregate_bucket``, the
  decoded mean (``reduce_chunks``' default, which a bucket compressor keeps).
  """
  return (compressor.bucket_encode and not compressor.custom_exchange and compressor.shard_compressor is None
          and compressor.plain_compressor is None)


def bucket_steps(
    compressor: core.Compressor,
    xs: list[jax.Array],
    keys: jax.Array,
    axis_name: parallel.AxisName,
    shard_residuals: Optional[list[Optional[jax.Array]]] = None,
    *,
    need_own: bool = False,
):
  """The two-phase exchange of a bucket of tensors, each phase encoded and decoded once for all (messages).

  For a compressor with ``bucket_encode`` (:func:`bucket_applies`), tensors
  ``xs`` (each large enough to :func:`split`) with their keys stacked in
  ``keys``. Every tensor is cut into ``N`` chunks as alone; a *piece* is one
  tensor's chunk, and the bucket's chunk ``j`` is chunk ``j`` of every tensor:

  1. one :meth:`~jaxcomp.core.Compressor.encode_bucket` over the ``N·k``
     pieces, laid out by destination (chunk ``j`` of every tensor, then chunk
     ``j + 1``), so that the payload's row ``j`` is what worker ``j``
     receives: one agreement (``"max"``), one ``"all_to_all"`` and one
     :meth:`~jaxcomp.core.Compressor.aggregate_bucket` for the bucket;
  2. this worker's shards of every tensor re-encoded by one ``encode_bucket``,
     one ``"gather"``, and one ``decode_bucket`` per worker's row.

  A piece is a tensor to the encoder, so what is per tensor alone (TernGrad's
  scalar, 3LC's and int8's scale, QSGD's norms by bucket) is per chunk in
  phase 1 and per shard in phase 2, exactly as :func:`two_phase_steps` on
  each tensor alone, whose numbers and bytes this returns (one
  :class:`TwoPhaseResult` per tensor).
  """
  workers = parallel.axis_size(axis_name)
  lays = [split(compressor, x.size, workers) for x in xs]
  if any(lay is None for lay in lays):
    raise ValueError("every tensor of a two-phase bucket must be large enough to split (see split).")
  k = len(xs)
  shard_layout = layout_lib.Layout([lay.chunk for lay in lays], compressor.planes)
  piece_layout = layout_lib.Layout(list(shard_layout.sizes) * workers, compressor.planes, period=k)
  halves = jax.vmap(jax.random.split)(keys)  # per tensor: phase 1's key, phase 2's
  chunks = [jnp.pad(x.reshape(-1).astype(jnp.float32), (0, lay.padded - lay.n)).reshape(workers, lay.chunk)
            for x, lay in zip(xs, lays)]
  pieces = [chunks[i][j] for j in range(workers) for i in range(k)]
  piece_layout = _with_pieces_joined(piece_layout, chunks, workers)
  # Piece (j, i)'s key: tensor i's phase-1 key folded with j, as alone; one vectorized fold for all.
  piece_keys = jax.vmap(jax.random.fold_in)(jnp.tile(halves[:, 0], (workers,) + (1,) * (halves.ndim - 2)),
                                            jnp.repeat(jnp.arange(workers, dtype=jnp.int32), k))
  payload, parts, received = yield from _bucket_phase1(compressor, pieces, piece_keys, piece_layout, workers)
  shards = compressor.aggregate_bucket(received, shard_layout)
  residuals = shard_residuals or [None] * k
  means, kept, sent_parts = yield from _bucket_phase2(compressor, shards, residuals, lays, shard_layout,
                                                     halves[:, 1], axis_name)
  own = [None] * k
  if need_own:
    decoded = compressor.own_bucket(pieces, payload, piece_layout)
    decoded = compressor.decode_bucket(payload, piece_layout) if decoded is None else decoded
    own = [jnp.concatenate([decoded[j * k + i] for j in range(workers)])[:lay.n].reshape(x.shape)
           for i, (x, lay) in enumerate(zip(xs, lays))]
  out = []
  for i, (x, lay) in enumerate(zip(xs, lays)):
    mine = [parts[j * k + i] for j in range(workers)]
    metrics = {}
    for part in mine:
      metrics = _add(metrics, compressor.extra_metrics(part, (lay.chunk,)))
    metrics = _add(metrics, compressor.extra_metrics(sent_parts[i], (lay.chunk,)))
    out.append(TwoPhaseResult(mean=means[i].reshape(x.shape), own=own[i],
                              payload=jax.tree.map(lambda *a: jnp.stack(a), *mine),
                              shard_residual=None if residuals[i] is None else kept[i].reshape(residuals[i].shape),
                              metrics=metrics))
  return out


def _with_pieces_joined(piece_layout: layout_lib.Layout, chunks: list[jax.Array], workers: int) -> layout_lib.Layout:
  """``piece_layout`` carrying its input joined from each tensor's ``(N, chunk)`` chunks: one pad a tensor.

  :meth:`~jaxcomp.exchange.layout.Layout.join` of the ``N·k`` pieces pads and
  places each piece alone; a tensor's ``N`` pieces have one shape, so here
  they are padded and placed at once, as a ``(planes, N, chunks, CHUNK)``
  block, and the blocks of the ``k`` tensors joined along their chunks: the
  same array (chunk ``j`` of every tensor, then chunk ``j + 1``), with a
  quarter of the kernels at ``N = 4``. Where a chunk is not a whole number
  of planes (never with :func:`alignment`'s multiples of 40) the layout
  joins the pieces itself.
  """
  planes, k = piece_layout.planes, len(chunks)
  if any(c.shape[1] % planes for c in chunks):
    return piece_layout
  blocks = []
  for c, width, count in zip(chunks, piece_layout.widths[:k], piece_layout.chunks[:k]):
    block = c.reshape(workers, planes, width)
    block = jnp.pad(block, ((0, 0), (0, 0), (0, count * piece_layout.chunk - width)))
    blocks.append(block.reshape(workers, planes, count, piece_layout.chunk).transpose(1, 0, 2, 3))
  joined = jnp.concatenate(blocks, axis=2) if k > 1 else blocks[0]
  return piece_layout.with_input(joined.reshape(planes, -1, piece_layout.chunk), None)


def _bucket_phase1(compressor, pieces, piece_keys, piece_layout, workers):
  """Agrees on and encodes every piece at once; row ``j`` of the payload goes to worker ``j`` (messages).

  Returns the payload, its pieces' parts, and the ``N`` rows of this worker's chunk received.
  """
  agreed = compressor.agree_bucket(pieces, piece_layout)
  if agreed is not None:
    agreed = yield core.Message("max", agreed)
  payload = lax.optimization_barrier(compressor.encode_bucket(pieces, piece_keys, agreed, piece_layout))
  rows = jax.tree.map(lambda a: a.reshape((workers, -1) + a.shape[1:]), payload)
  shapes = [(n,) for n in piece_layout.sizes]
  parts = layout_lib.payload_parts(payload, [compressor.payload_struct(n) for n in piece_layout.sizes])
  encoded = allgather.bucket_encoded(compressor, payload, piece_layout, parts, shapes)
  received = yield core.Message("all_to_all", rows, encoded=encoded)
  return payload, parts, received


def _bucket_phase2(compressor, shards, residuals, lays, shard_layout, keys, axis_name):
  """Re-encodes this worker's shards (plus their residuals) at once, gathers all, decodes them (messages).

  Returns every tensor's mean (flat), its new shard residual (flat, or
  ``None``) and this worker's phase-2 payload cut into its tensors' parts.
  """
  index = parallel.axis_index(axis_name)
  ys = [_with_residual(shard, residual, lay, index * lay.chunk) for shard, residual, lay in zip(shards, residuals, lays)]
  agreed = compressor.agree_bucket(ys, shard_layout)  # one encoder per shard: its own scalars, no round
  payload = lax.optimization_barrier(compressor.encode_bucket(ys, keys, agreed, shard_layout))
  shapes = [(n,) for n in shard_layout.sizes]
  parts = layout_lib.payload_parts(payload, [compressor.payload_struct(n) for n in shard_layout.sizes])
  gathered = yield core.Message("gather", payload,
                                encoded=allgather.bucket_encoded(compressor, payload, shard_layout, parts, shapes))
  decoded = jax.vmap(lambda p: compressor.decode_bucket(p, shard_layout))(gathered)  # (N, chunk) a tensor
  means = [d.reshape(-1)[:lay.n] for d, lay in zip(decoded, lays)]
  kept = [None] * len(lays)
  if any(r is not None for r in residuals):
    sent = compressor.own_bucket(ys, payload, shard_layout)
    sent = compressor.decode_bucket(payload, shard_layout) if sent is None else sent
    kept = [None if residual is None else _kept(y, sent_i, lay, index * lay.chunk)
            for y, sent_i, residual, lay in zip(ys, sent, residuals, lays)]
  return means, kept, parts
