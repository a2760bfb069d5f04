"""Two-phase compressed all-reduce: reduce-scatter of compressed chunks, then all-gather.

The default exchange (:func:`jaxcomp.parallel.exchange`) hands
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
``≈ 2(N − 1)/N·P`` bytes plus per-chunk scalars (:func:`two_phase_bytes`).

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
from typing import Any, Literal, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.codecs import base243
from jaxcomp.count import Count

Exchange = Literal["all_gather", "two_phase", "auto"]
EXCHANGES = ("all_gather", "two_phase", "auto")

# Chunk lengths are a multiple of 40 = lcm(4, 5, 8): whole bytes for 2-bit,
# base-3^5 and 1-bit codes, so no chunk pays for a partly filled byte.
ALIGN = 40


def check_exchange(exchange: str) -> None:
  if exchange not in EXCHANGES:
    raise ValueError(f"exchange must be one of {', '.join(map(repr, EXCHANGES))}; got {exchange!r}.")


def unsupported(compressor: core.Compressor) -> Optional[str]:
  """Why ``compressor`` has no two-phase form, or ``None`` if it has one."""
  if compressor.custom_exchange and _plain(compressor) is None:
    return (f"{type(compressor).__name__} runs its own exchange (custom_exchange), which "
            "exchange='two_phase' cannot split into chunks. (PowerSGD's all-reduces of its "
            "float factors already move about 2(N-1)/N of them per worker.) Use "
            "exchange='all_gather' or 'auto', which keeps its own exchange.")
  return None


def check(compressor: core.Compressor, exchange: str) -> None:
  """Raises a clear error if ``exchange`` cannot be used with ``compressor``."""
  check_exchange(exchange)
  if exchange == "two_phase":
    reason = unsupported(compressor)
    if reason:
      raise ValueError(reason)


# -- the static layout and its bytes ------------------------------------------


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


def allreduce_received(nbytes: int, workers: int) -> int:
  """Bytes one worker receives in a bandwidth-optimal (ring) all-reduce of ``nbytes``: ``2(N−1)/N·nbytes``."""
  return -(-2 * (workers - 1) * int(nbytes) // workers) if workers > 1 else 0


def _structs(compressor: core.Compressor, n: int):
  """``(agreed, payload)`` ShapeDtypeStructs of encoding ``n`` values."""
  x = jax.ShapeDtypeStruct((n,), jnp.float32)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)
  agreed = jax.eval_shape(compressor.agree, x)
  payload = jax.eval_shape(compressor.encode, x, key, agreed)
  return agreed, payload


class Bytes(NamedTuple):
  """Static bytes of one tensor's exchange, per worker and step.

  ``handed``: bytes of the arrays this worker hands to collectives (the
  convention of ``bytes_on_wire``); ``received``: bytes that arrive at this
  worker from the others (``(N − 1)·P`` for an all-gather of ``P``-byte
  payloads; agreement all-reduces counted as a ring's ``2(N−1)/N``).
  """

  handed: int
  received: int


def all_gather_bytes(compressor: core.Compressor, n: int, workers: int) -> Bytes:
  """The all-gather exchange of ``n`` values: payload ``P`` plus the agreed scalars."""
  agreed, payload = _structs(compressor, n)
  p = core.tree_nbytes(payload)
  a = core.tree_nbytes(agreed) if (agreed is not None and workers > 1) else 0
  return Bytes(handed=p + a, received=(workers - 1) * p + allreduce_received(a, workers))


def two_phase_bytes(compressor: core.Compressor, n: int, workers: int) -> Optional[Bytes]:
  """The two-phase exchange of ``n`` values, or ``None`` if it is too small to split."""
  lay = split(compressor, n, workers)
  if lay is None or unsupported(compressor):
    return None
  agreed, chunk_payload = _structs(compressor, lay.chunk)
  shard_c = shard_compressor(compressor)
  _, shard_payload = _structs(shard_c, lay.chunk)
  a = workers * core.tree_nbytes(agreed) if agreed is not None else 0
  flag = 1 if _plain(compressor) is not None else 0  # agrees on a fallback round (none counted here)
  p1, p2 = core.tree_nbytes(chunk_payload), core.tree_nbytes(shard_payload)
  return Bytes(handed=workers * p1 + p2 + a + flag,
               received=(workers - 1) * (p1 + p2) + allreduce_received(a, workers)
               + allreduce_received(flag, workers))


def choose(compressor: core.Compressor, n: int, workers: int, exchange: str) -> str:
  """The exchange one tensor of ``n`` values uses: ``"all_gather"`` or ``"two_phase"``.

  ``"auto"`` picks the one whose bytes received per worker are fewer (ties:
  the all-gather, one round instead of two); a tensor too small to split,
  a single worker, or a compressor with its own exchange use the all-gather.
  """
  check_exchange(exchange)
  if exchange == "all_gather" or unsupported(compressor) or split(compressor, n, workers) is None:
    return "all_gather"
  if exchange == "two_phase":
    return "two_phase"
  ag = all_gather_bytes(compressor, n, workers).received
  tp = two_phase_bytes(compressor, n, workers).received
  return "two_phase" if tp < ag else "all_gather"


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
  """What :func:`two_phase_exchange` returns.

  Attributes:
    mean: float32, the tensor's shape: the decoded shards, the same on every worker.
    own: float32, what this worker's phase-1 chunks decode to (``None`` unless
      asked): error feedback's ``x − own`` is the phase-1 residual.
    payload: this worker's phase-1 payload, ``N`` chunk payloads stacked.
    wire_bytes: bytes this worker handed to collectives (all ``N`` chunk
      payloads, the shard payload, the per-chunk agreed scalars), a
      :class:`~jaxcomp.count.Count` (traced when a fallback round may run:
      3LC's zero-run wire).
    received_bytes: bytes that arrived from the other workers (a Count).
    encoded_bytes: like ``wire_bytes`` with the exact size of a variable-length
      encoding where the compressor has one (a uint32 scalar).
    shard_residual: the new full-size phase-2 residual (``None`` if none was given).
    metrics: the encoders' counters, summed over the chunks and the shard.
  """

  mean: jax.Array
  own: Optional[jax.Array]
  payload: core.Payload
  wire_bytes: Any
  received_bytes: Any
  encoded_bytes: Any
  shard_residual: Optional[jax.Array]
  metrics: dict[str, jax.Array]


def _plain(compressor: core.Compressor) -> Optional[core.Compressor]:
  """The compressor's fixed-size fallback wire (3LC's base-3^5 behind its zero-run buffer), if any."""
  return compressor.plain_compressor


def _decode_all(compressor: core.Compressor, payloads: core.Payload, chunk: int) -> jax.Array:
  """Decodes stacked payloads of ``chunk`` values each and lays them end to end (flat)."""
  return jax.vmap(lambda p: compressor.decode(p, (chunk,)))(payloads).reshape(-1)


def _encoded(compressor: core.Compressor, payload: core.Payload, chunk: int, static: int) -> jax.Array:
  size = compressor.encoded_bytes(payload, (chunk,))
  return jnp.uint32(static) if size is None else jnp.asarray(size, jnp.uint32)


def _add(metrics: dict, more: dict) -> dict:
  out = dict(metrics)
  for k, v in more.items():
    out[k] = out.get(k, 0) + jnp.sum(jnp.asarray(v)).astype(jnp.int32)
  return out


class _Sent(NamedTuple):
  """One phase's message: what it decodes to here, and its accounting."""

  payload: core.Payload
  decoded_here: Optional[jax.Array]  # what this worker's own message decodes to (flat), if asked
  handed: Any
  received: Any
  encoded: jax.Array
  metrics: dict


def _phase1_encode(compressor, chunks, key, axis_name, need_own):
  """Agrees per chunk (one pmax of N values), encodes every chunk with its own key."""
  workers, c = chunks.shape
  agreed = jax.vmap(compressor.agree)(chunks)
  agreement = 0
  if agreed is not None:
    agreement = core.tree_nbytes(agreed)
    agreed = yield core.Message("max", agreed)
  keys = jax.vmap(lambda j: jax.random.fold_in(key, j))(jnp.arange(workers))
  payload, metrics = jax.vmap(compressor.encode_with_metrics)(chunks, keys, agreed)
  payload = lax.optimization_barrier(payload)  # the wire: materialized once (see parallel.exchange)
  metrics = _add(metrics, jax.vmap(lambda p: compressor.extra_metrics(p, (c,)))(payload))
  p1 = core.tree_nbytes(payload) // workers
  encoded = jnp.sum(jax.vmap(lambda p: _encoded(compressor, p, c, p1))(payload), dtype=jnp.uint32) + agreement
  plain = _plain(compressor)
  own = None
  if need_own:
    # With a fallback wire, the buffer of a stream that did not fit holds no codes; the plain
    # encoding quantizes the same way and always decodes.
    source = payload if plain is None else jax.vmap(plain.encode)(chunks, keys, agreed)
    own = _decode_all(plain or compressor, source, c)
  sent = _Sent(payload, own, Count(workers * p1 + agreement),
               Count((workers - 1) * p1 + allreduce_received(agreement, workers)), encoded, metrics)
  return sent, (keys, agreed)


def _phase1_reduce(compressor, sent, chunks, keys_agreed, axis_name):
  """Scatters chunk j to worker j and reduces what arrived; with a fallback wire, a plain round if needed."""
  workers, c = chunks.shape
  received = yield core.Message("all_to_all", sent.payload)
  plain = _plain(compressor)
  if plain is None:
    return reduce_chunks(compressor, received, c), sent
  # Every worker must take the same branch (the fallback runs a collective): agree on one flag.
  overflow = (yield core.Message("max", jnp.any(~compressor.fits(received)).astype(jnp.uint8))) > 0

  def from_plain():
    keys, agreed = keys_agreed
    payload = jax.vmap(plain.encode)(chunks, keys, agreed)
    return reduce_chunks(plain, parallel.all_to_all(payload, axis_name), c)

  shard = lax.cond(overflow, from_plain, lambda: reduce_chunks(compressor, received, c))
  p_plain = core.tree_nbytes(jax.eval_shape(plain.encode, chunks[0], keys_agreed[0][0], None))
  extra = overflow.astype(jnp.uint32)
  sent = sent._replace(
      handed=sent.handed + 1 + extra * (workers * p_plain),
      received=sent.received + allreduce_received(1, workers) + extra * ((workers - 1) * p_plain),
      encoded=sent.encoded + 1,
      metrics=_add(sent.metrics, {"zero_run_fallback_rounds": extra}))
  return shard, sent


def _phase2(compressor, shard, shard_residual, lay, key, axis_name):
  """Re-encodes this worker's shard (plus its residual), gathers all shards, decodes them."""
  c, workers = lay.chunk, lay.workers
  start = parallel.axis_index(axis_name) * c
  y = shard
  if shard_residual is not None:
    padded = jnp.pad(shard_residual.reshape(-1).astype(jnp.float32), (0, lay.padded - lay.n))
    y = shard + lax.dynamic_slice(padded, (start,), (c,))
  agreed = compressor.agree(y)  # one encoder per shard: its own scalars, no agreement round
  payload, metrics = compressor.encode_with_metrics(y, key, agreed)
  payload = lax.optimization_barrier(payload)
  p2 = core.tree_nbytes(payload)
  metrics = _add(metrics, compressor.extra_metrics(payload, (c,)))
  gathered = yield core.Message("gather", payload)
  plain = _plain(compressor)
  if plain is None:
    mean = _decode_all(compressor, gathered, c)
    sent_here = compressor.decode(payload, (c,)) if shard_residual is not None else None
    handed, received = Count(p2), Count((workers - 1) * p2)
  else:
    plain_payload = plain.encode(y, key, agreed)
    fits = jnp.all(compressor.fits(gathered))  # the same on every worker: all lengths were gathered
    mean = lax.cond(fits, lambda: _decode_all(compressor, gathered, c),
                    lambda: _decode_all(plain, parallel.all_gather(plain_payload, axis_name), c))
    sent_here = plain.decode(plain_payload, (c,))
    extra = (~fits).astype(jnp.uint32) * core.tree_nbytes(plain_payload)
    handed, received = Count(p2) + extra, Count((workers - 1) * p2) + extra * (workers - 1)
    metrics = _add(metrics, {"zero_run_fallback_rounds": ~fits})
  new_residual = None
  if shard_residual is not None:
    kept = lax.dynamic_update_slice(jnp.zeros((lay.padded,), jnp.float32), y - sent_here, (start,))
    new_residual = kept[:lay.n].reshape(shard_residual.shape)
  sent = _Sent(payload, None, handed, received, _encoded(compressor, payload, c, p2), metrics)
  return mean[:lay.n], new_residual, sent


def two_phase_exchange(compressor: core.Compressor, x: jax.Array, key: jax.Array, axis_name: parallel.AxisName,
                       shard_residual: Optional[jax.Array] = None, *, need_own: bool = False) -> TwoPhaseResult:
  """The two-phase exchange of one tensor, run on its own (see :func:`two_phase_steps`)."""
  return parallel.run(two_phase_steps(compressor, x, key, axis_name, shard_residual, need_own=need_own),
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
  :func:`jaxcomp.parallel.run`, or fused with other tensors' by
  :func:`jaxcomp.buckets.run`) and returns a :class:`TwoPhaseResult`. The
  fallback rounds of a compressor with a fallback wire run inside a
  ``lax.cond`` and call their collectives directly.

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
    axis_name: the worker axis, as for :func:`jaxcomp.parallel.exchange`.
    shard_residual: the full-size phase-2 residual (the tensor's shape,
      float32), or ``None`` for no phase-2 error feedback.
    need_own: also return ``own`` (error feedback needs it).

  Returns:
    A :class:`TwoPhaseResult`.

  Raises:
    ValueError: for a compressor with its own exchange, or a tensor too small
      to split over this axis (use :func:`choose` first).
  """
  check(compressor, "two_phase")
  shape, n = x.shape, x.size
  workers = parallel.axis_size(axis_name)
  lay = split(compressor, n, workers)
  if lay is None:
    raise ValueError(f"a tensor of {n} values is too small to split over {workers} workers "
                     f"(needs >= {workers * alignment(compressor)}); use the all-gather.")
  key1, key2 = jax.random.split(key)
  chunks = jnp.pad(x.reshape(-1).astype(jnp.float32), (0, lay.padded - n)).reshape(workers, lay.chunk)
  first, keys_agreed = yield from _phase1_encode(compressor, chunks, key1, axis_name, need_own)
  shard, first = yield from _phase1_reduce(compressor, first, chunks, keys_agreed, axis_name)
  mean, new_residual, second = yield from _phase2(shard_compressor(compressor), shard.astype(jnp.float32),
                                                  shard_residual, lay, key2, axis_name)
  own = None if first.decoded_here is None else first.decoded_here[:n].reshape(shape)
  return TwoPhaseResult(
      mean=mean.reshape(shape),
      own=own,
      payload=first.payload,
      wire_bytes=first.handed + second.handed,
      received_bytes=first.received + second.received,
      encoded_bytes=first.encoded + second.encoded,
      shard_residual=new_residual,
      metrics=_add(first.metrics, second.metrics),
  )


def _times(count: Count, k: int) -> Count:
  """``k · count``, exact, for a traced count whose parts fit 32 bits and ``0 <= k < 2**16``."""
  if count.is_static:
    return Count(k * count.static)
  lo_low, lo_high = count.lo & 0xFFFF, count.lo >> 16
  high = lo_high * jnp.uint32(k)  # < 2**32: no wrap
  out = Count(k * count.static) + Count(hi=count.hi * jnp.uint32(k) + (high >> 16), lo=(high & 0xFFFF) << 16)
  return out + Count(hi=jnp.zeros_like(count.hi), lo=lo_low * jnp.uint32(k))


def all_gather_received(compressor: core.Compressor, n: int, workers: int, wire: Any) -> Count:
  """Bytes one worker receives when a tensor of ``n`` values takes the all-gather (or the compressor's own exchange).

  The default exchange: ``(N − 1)·P`` plus a ring's share of the agreement
  all-reduce (:func:`all_gather_bytes`). A compressor with its own exchange
  says so with :meth:`~jaxcomp.core.Compressor.received_bytes` (PowerSGD: its
  all-reduces); where that is ``None``, every byte it hands goes to an all-gather (3LC's
  zero-run rounds): ``(N − 1)·wire_bytes``.
  """
  if not compressor.custom_exchange:
    return Count(all_gather_bytes(compressor, n, workers).received)
  received = compressor.received_bytes(wire, workers)
  if received is not None:
    return Count.of(received)
  return _times(Count.of(wire), workers - 1)
