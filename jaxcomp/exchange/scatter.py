"""The reduce-scatter route: each worker keeps its shard of the averaged gradient (ZeRO's layout).

Sharded optimizer states (:func:`jaxcomp.shard_optimizer`; ZeRO stages 1 and
2, Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, §5.1) need the averaged gradient only where a
worker updates the parameters: its shard. Here a tensor of ``n`` values is
cut as the two-phase exchange cuts it (:class:`~jaxcomp.exchange.two_phase.Split`:
``N`` chunks of ``c`` values, ``c = ceil(n / N)`` rounded up to ``align``,
the tail zero padded) and worker ``j`` receives chunk ``j`` of the mean:

* a compressed tensor takes the two-phase exchange's first phase
  (:func:`jaxcomp.exchange.two_phase.reduce_scatter_steps`: the chunks
  encoded, one ``"all_to_all"``, the payloads that arrive decoded and
  averaged), with the same keys, so its shard equals that phase's bit for
  bit. A compressor whose phase 1 reduces to something other than the mean
  (signSGD's vote counts) has its shard codec applied here, as phase 2
  would before its all-gather (signSGD: the majority vote's sign);
* a tensor sent in float (skipped, or the ``none`` baseline) crosses as an
  ``"all_to_all"`` of its float chunks, summed as :func:`jaxcomp.parallel.pmean`
  sums simulated workers and divided by ``N`` (the bytes of a
  reduce-scatter: ``(N − 1)/N`` of the tensor arrive);
* a tensor smaller than ``N·align`` values is not cut (:func:`split` is
  ``None``): it is averaged whole as without sharding, and its optimizer
  state stays whole on every worker.

The route is taken while :func:`scattering` is active: the wrapper that owns
the sharded layout sets it around its chain's update, and the compression
transform at the chain's head reads it (:func:`active`), so the user's chain
stays as written.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator, Optional

import jax
import jax.numpy as jnp

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase

# Chunks of 2,560 values: a multiple of two_phase.ALIGN (whole bytes for 2-bit, base-3^5 and
# 1-bit codes) and of QSGD's default 512-value buckets, so that one cut serves every compressor.
DEFAULT_ALIGN = 2560

@dataclasses.dataclass
class Scattering:
  """What a sharded chain's update knows while it runs (set by :func:`jaxcomp.shard_optimizer`).

  ``align`` cuts the tensors (:func:`split`); during an update ``axis_name``
  and ``lays`` (each parameter leaf's cut, ``None``: whole) let a transform
  that looks across tensors reduce its chunks' partial sums
  (:func:`jaxcomp.zero.global_norm`), and ``traffic`` counts what such a
  reduction moves (reported by the wrapper with its all-gather).
  """

  align: int
  axis_name: parallel.AxisName = None
  lays: Optional[list] = None
  traffic: Optional[transport.Traffic] = None


_ACTIVE: contextvars.ContextVar[Optional[Scattering]] = contextvars.ContextVar("jaxcomp_scattering", default=None)


@contextlib.contextmanager
def scattering(align: int, **during_update) -> Iterator[Scattering]:
  """While active, a compression transform reduce-scatters the tensors :func:`split` cuts (trace time)."""
  context = Scattering(align, **during_update)
  token = _ACTIVE.set(context)
  try:
    yield context
  finally:
    _ACTIVE.reset(token)


def active() -> Optional[Scattering]:
  """The enclosing :func:`scattering`'s context, or ``None`` outside one."""
  return _ACTIVE.get()


def split(n: int, workers: int, align: int = DEFAULT_ALIGN) -> Optional[two_phase.Split]:
  """How a tensor of ``n`` values is sharded over ``workers``, or ``None`` to keep it whole (``n < workers·align``)."""
  if align < 1:
    raise ValueError(f"align must be a positive number of values; got {align}.")
  if n < workers * align:
    return None
  chunk = -(-n // workers)
  return two_phase.Split(n=n, workers=workers, chunk=-(-chunk // align) * align)


def shard_of(x: jax.Array, lay: two_phase.Split, index: jax.Array) -> jax.Array:
  """Worker ``index``'s chunk of ``x`` (flat, zero padded): ``(lay.chunk,)``."""
  flat = jnp.pad(x.reshape(-1), (0, lay.padded - lay.n))
  return jax.lax.dynamic_slice(flat, (index * lay.chunk,), (lay.chunk,))


def rows_of(x: jax.Array, lay: two_phase.Split, copies: int = 1) -> jax.Array:
  """Every worker's chunk of ``x``: ``(workers, chunk)`` (as :func:`shard_of` for each index), ``copies``
  times over (``(copies · workers, chunk)``: one copy a host when the cut is over a host's devices)."""
  rows = jnp.pad(x.reshape(-1), (0, lay.padded - lay.n)).reshape(lay.workers, lay.chunk)
  return rows if copies == 1 else jnp.tile(rows, (copies, 1))


def whole(rows: jax.Array, lay: two_phase.Split, shape: tuple[int, ...]) -> jax.Array:
  """The tensor of ``shape`` from its ``(workers, chunk)`` rows (the padding dropped)."""
  return rows.reshape(-1)[:lay.n].reshape(shape)


def check_compressor(compressor: core.Compressor, lay: two_phase.Split, align: int) -> None:
  """Refuses a compressor with no two-phase form, or whose chunks ``align`` does not keep whole."""
  reason = two_phase.unsupported(compressor)
  if reason:
    raise ValueError(f"jaxcomp.shard_optimizer: {reason}")
  need = two_phase.alignment(compressor)
  if lay.chunk % need:
    raise ValueError(
        f"jaxcomp.shard_optimizer(align={align}): {type(compressor).__name__}'s chunks must hold a "
        f"multiple of {need} values (whole bytes, whole buckets); pass align= a multiple of {need}.")


def float_steps(g: jax.Array, lay: two_phase.Split, hosts: parallel.AxisName = None,
                local: parallel.AxisName = None):
  """A float tensor's reduce-scatter (messages over the exchange's axes): this worker's chunk of the mean,
  in ``g``'s dtype.

  With ``hosts`` and ``local`` the cut is over ``local`` (hybrid sharding):
  the host's mean of the chunk, then its mean over ``hosts``.
  """
  received = yield core.Message("all_to_all", rows_of(g, lay), over=local)
  shard = core.sum_leading(received).astype(g.dtype) / lay.workers  # as jaxcomp.parallel.pmean over vmap
  if hosts is not None:
    shard = yield core.Message("mean", shard, over=hosts)
  return shard


def compressed_steps(compressor: core.Compressor, x: jax.Array, key: jax.Array, axis_name: parallel.AxisName,
                     lay: two_phase.Split, *, need_own: bool):
  """A compressed tensor's reduce-scatter (messages): a :class:`~jaxcomp.exchange.two_phase.TwoPhaseResult`
  whose ``mean`` is this worker's shard ``(lay.chunk,)``, and ``own`` what its chunks decode to."""
  key1, key2 = jax.random.split(key)  # as the two-phase exchange: phase 1 takes the first half
  shard, sent = yield from two_phase.reduce_scatter_steps(compressor, x, key1, axis_name, lay, need_own=need_own)
  metrics = sent.metrics
  if compressor.shard_compressor is not None:  # phase 1 reduced to something else than the mean (votes)
    codec = compressor.shard_compressor
    payload, more = codec.encode_with_metrics(shard, key2, codec.agree(shard))
    shard = codec.decode(payload, (lay.chunk,))
    metrics = two_phase._add(metrics, more)  # pylint: disable=protected-access
  own = None if sent.decoded_here is None else sent.decoded_here[:lay.n].reshape(x.shape)
  return two_phase.TwoPhaseResult(mean=shard, own=own, payload=sent.payload, shard_residual=None, metrics=metrics)


def check_two_hops(compressor: core.Compressor) -> None:
  """Refuses a compressor whose reduce-scatter cannot be done in two hops (:func:`two_hop_steps`)."""
  if compressor.shard_compressor is not None or compressor.plain_compressor is not None:
    raise ValueError(
        f"jaxcomp.shard_optimizer: {type(compressor).__name__} with within= (two hops: re-encoded between "
        "them) needs a compressor whose chunks reduce to their mean and whose payload has a fixed size; "
        "signSGD's votes and 3LC's zero-run wire do not. Build it without within=.")


def two_hop_steps(compressor: core.Compressor, x: jax.Array, key: jax.Array, lay: two_phase.Split,
                  hosts: parallel.AxisName, local: parallel.AxisName, shard_residual: Optional[jax.Array], *,
                  need_own: bool, replicated: bool = False):
  """A compressed tensor's reduce-scatter in two hops (messages), ZeRO++'s hierarchical qgZ.

  The workers are the devices of ``H`` hosts (``hosts``) of ``L`` devices
  each (``local``), numbered ``w = h·L + l``; the cut is the flat one
  (:func:`split` over ``H·L``), so worker ``w`` gets chunk ``w`` as without
  hops. Wang et al., *ZeRO++*, arXiv:2306.10209, §3.3 (hierarchical
  all-to-all):

  1. this worker's chunks are encoded as the flat reduce-scatter encodes
     them (the same keys and agreement; error feedback on them is the
     worker's residual, ``own``), and an ``"all_to_all"`` over ``local``
     takes chunks ``h'·L + l'`` (every ``h'``) to device ``l'`` of the host;
  2. each device decodes what arrived and averages it over its host:
     ``H`` rows, the host's mean of chunks ``h'·L + l``;
  3. it re-encodes those rows (plus its part of ``shard_residual``, the
     full-size buffer of this re-encoding's error, zero outside its rows,
     if given: error feedback as the two-phase exchange's phase 2 keeps it)
     and an ``"all_to_all"`` over ``hosts`` takes row ``h'`` to host ``h'``:
     each worker averages the ``H`` host means of its chunk.

  Across hosts each device sends ``H`` encoded rows of ``c`` values: its
  host sends one encoded copy of the tensor, not ``L``.

  ``replicated``: the cut is over ``local`` only (``L`` chunks, every host a
  whole copy: hybrid sharding). Step 2 gives one row, the host's mean of
  chunk ``l``, and step 3 all-gathers it over ``hosts`` instead: every
  host's device ``l`` averages the same ``H`` payloads to the same chunk.

  Returns a :class:`~jaxcomp.exchange.two_phase.TwoPhaseResult`: ``mean`` this
  worker's chunk ``(lay.chunk,)``; ``shard_residual`` the new buffer (or ``None``).
  """
  rows, n_local, c = 1 if replicated else parallel.axis_size(hosts), parallel.axis_size(local), lay.chunk
  key1, key2 = jax.random.split(key)  # as the flat route: the first half for the workers' chunks
  chunks = rows_of(x.astype(jnp.float32), lay)
  # The flat route's encoding of this worker's chunks (keys, agreement), its all-to-all aside.
  sent, _ = yield from two_phase._phase1_encode(  # pylint: disable=protected-access
      compressor, chunks, key1, None, need_own)
  by_device = jax.tree.map(lambda a: jnp.swapaxes(a.reshape((rows, n_local) + a.shape[1:]), 0, 1), sent.payload)
  encoded = two_phase._encoded(compressor, sent.payload, c)  # pylint: disable=protected-access
  received = yield core.Message("all_to_all", by_device, encoded=encoded, over=local)  # (L sources, rows, ...)
  host_mean = jax.vmap(lambda r: two_phase.reduce_chunks(compressor, r, c), in_axes=1)(received)
  index = parallel.axis_index(local) if n_local > 1 else 0
  y = host_mean + (0.0 if shard_residual is None else _my_rows(shard_residual, lay, rows, index))
  agreed = jax.vmap(compressor.agree)(y)
  if agreed is not None:
    agreed = yield core.Message("max", agreed, over=hosts)
  keys = jax.vmap(lambda h: jax.random.fold_in(key2, h))(jnp.arange(rows))
  payload, more = jax.vmap(compressor.encode_with_metrics)(y, keys, agreed)
  encoded = two_phase._encoded(compressor, payload, c)  # pylint: disable=protected-access
  if replicated:  # (H sources, ...): every host's mean of chunk l
    arrived = yield core.Message("gather", jax.tree.map(lambda a: a[0], payload), encoded=encoded, over=hosts)
  else:  # (H sources, ...): the host means of this worker's chunk
    arrived = yield core.Message("all_to_all", payload, encoded=encoded, over=hosts)
  new_residual = None
  if shard_residual is not None:
    kept = y - jax.vmap(lambda p: compressor.decode(p, (c,)))(payload)
    new_residual = _rows_placed(kept, lay, rows, index, jnp.shape(shard_residual))
  own = None if sent.decoded_here is None else sent.decoded_here[:lay.n].reshape(x.shape)
  metrics = two_phase._add(sent.metrics, more)  # pylint: disable=protected-access
  return two_phase.TwoPhaseResult(mean=two_phase.reduce_chunks(compressor, arrived, c).astype(jnp.float32),
                                  own=own, payload=sent.payload, shard_residual=new_residual, metrics=metrics)


def _my_rows(buffer: jax.Array, lay: two_phase.Split, n_hosts: int, index) -> jax.Array:
  """Rows ``h·L + index`` (every ``h``) of a full-size buffer cut as ``lay``: ``(H, chunk)``."""
  rows = rows_of(buffer.astype(jnp.float32), lay).reshape(n_hosts, -1, lay.chunk)
  return jax.lax.dynamic_index_in_dim(rows, index, axis=1, keepdims=False)


def _rows_placed(rows: jax.Array, lay: two_phase.Split, n_hosts: int, index, shape) -> jax.Array:
  """The full-size buffer of ``shape`` holding ``rows`` at rows ``h·L + index``, zero elsewhere."""
  grid = jnp.zeros((n_hosts, lay.workers // n_hosts, lay.chunk), jnp.float32)
  grid = jax.lax.dynamic_update_index_in_dim(grid, rows, index, axis=1)
  return grid.reshape(-1)[:lay.n].reshape(shape)
