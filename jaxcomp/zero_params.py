"""Sharded parameters: each worker stores its chunk of every large tensor and gathers the rest for a step (ZeRO-3).

With :func:`jaxcomp.shard_optimizer` ``(..., shard_params=True)`` the
parameters live between steps as a :class:`ShardedParams`: each worker keeps
chunk ``j`` of every tensor the optimizer state is cut for (the same cut:
:func:`jaxcomp.exchange.scatter.split`), and the small tensors whole. A step
then runs, on each worker ``j`` of ``N``:

1. **gather** (:func:`gather_steps`): every worker's chunks, all-gathered
   (messages through the transport, bucketed, counted): in float, or encoded
   by a deterministic codec (qwZ: ``jaxcomp.Int8()`` or a block quantizer),
   decoded, with worker ``j``'s own chunk taken exact from its master copy.
   No error feedback is needed: the master chunks are never quantized, each
   step encodes them afresh;
2. the user's step on the whole parameters: forward, backward, and the
   chain's update, which reduce-scatters the gradients and updates only
   chunk ``j`` (as with sharded states) but does not gather the updates:
   they come back whole-shaped, zero outside chunk ``j`` (:func:`placed`);
3. **keep** (:func:`own`): chunk ``j`` of the new parameters is the new
   master chunk (the old one plus its update, exactly); the rest is dropped.

The traffic of a step is an all-gather of the parameters and a reduce-scatter
of the gradients, where stage 1/2 moves a reduce-scatter and an all-gather of
the updates: the same volume in float, and what ZeRO++ compresses in both.

References:
  Rajbhandari, Rasley, Ruwase, He. *ZeRO: Memory Optimizations Toward
  Training Trillion Parameter Models*. SC 2020, §5.2 (P_os+g+p: parameters
  partitioned, broadcast for the forward and backward passes).
  Wang et al. *ZeRO++: Extremely Efficient Collective Communication for
  Giant Model Training*. arXiv:2306.10209, §3.1 (qwZ: the weights' all-gather
  quantized, one scale per block).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp.exchange import scatter
from jaxcomp.exchange import two_phase


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Cut:
  """The place of a cut tensor in :attr:`ShardedParams.whole`: its shape and dtype, no values (static)."""

  shape: tuple[int, ...]
  dtype: Any

  def tree_flatten(self):
    return (), (self.shape, self.dtype)

  @classmethod
  def tree_unflatten(cls, aux, children):
    del children
    return cls(*aux)


class ShardedParams(NamedTuple):
  """Parameters sharded over the workers (see the module docstring).

  ``whole``: the parameters' tree with the tensors kept whole (the same on
  every worker) and a :class:`Cut` where a tensor is cut; ``local.residual``:
  the parameters' tree with each cut tensor's chunk (``optax.MaskedNode``
  where whole); laid over the workers as a sharded optimizer state is
  (:class:`~jaxcomp.core.ShardLocal`: a row a worker).
  """

  whole: Any
  local: core.ShardLocal


def _is_place(x: Any) -> bool:
  return isinstance(x, (Cut, optax.MaskedNode))


def positions(sharded: ShardedParams) -> tuple[list, Any, list]:
  """``(whole leaves or Cut, the parameters' treedef, chunks or MaskedNode)``, a position per parameter."""
  places, treedef = jax.tree.flatten(sharded.whole, is_leaf=_is_place)
  return places, treedef, treedef.flatten_up_to(sharded.local.residual)


def shard(params: Any, lays: list[Optional[two_phase.Split]], copies: int = 1) -> ShardedParams:
  """Every worker's chunks of ``params`` (rows ``(workers, chunk)``, ``copies`` times over: one copy a host
  when cut over a host's devices), the small tensors whole."""
  return _split(params, lays, lambda a, lay: scatter.rows_of(a, lay, copies))


def own(params: Any, lays: list[Optional[two_phase.Split]], index: Any) -> ShardedParams:
  """Worker ``index``'s :class:`ShardedParams` of whole ``params`` (inside a step: its chunks, no worker axis)."""
  return _split(params, lays, lambda a, lay: scatter.shard_of(a, lay, index))


def _split(params: Any, lays: list[Optional[two_phase.Split]], chunk_of) -> ShardedParams:
  leaves, treedef = jax.tree.flatten(params)
  whole = [a if lay is None else Cut(tuple(jnp.shape(a)), jnp.dtype(jnp.result_type(a))) for a, lay in zip(leaves, lays)]
  chunks = [optax.MaskedNode() if lay is None else chunk_of(a, lay) for a, lay in zip(leaves, lays)]
  return ShardedParams(treedef.unflatten(whole), core.ShardLocal(treedef.unflatten(chunks), {}))


def unshard(sharded: ShardedParams, lays: list[Optional[two_phase.Split]]) -> Any:
  """The whole parameters from every worker's rows (outside a step: no collective, e.g. to evaluate or export)."""
  places, treedef, chunks = positions(sharded)
  return treedef.unflatten([p if lay is None else scatter.whole(c, lay, p.shape).astype(p.dtype)
                            for p, c, lay in zip(places, chunks, lays)])


def placed(u: jax.Array, lay: two_phase.Split, shape: tuple[int, ...], index: Any) -> jax.Array:
  """A whole-shaped update that is ``u`` on worker ``index``'s chunk and zero elsewhere (no exchange)."""
  flat = jax.lax.dynamic_update_slice(jnp.zeros((lay.padded,), u.dtype), u, (index * lay.chunk,))
  return flat[:lay.n].reshape(shape)


def gather_steps(chunk: jax.Array, place: Cut, lay: two_phase.Split, codec: Optional[core.Compressor],
                 key: jax.Array, index: Any):
  """A cut tensor's all-gather (messages): the whole tensor, this worker's chunk exact.

  In float the chunks cross as they are; with ``codec`` each worker sends its
  chunk encoded (its own scales: no agreement round) and every worker decodes
  every row, then puts its own exact chunk back in its row.
  """
  if codec is None:
    rows = yield core.Message("gather", chunk)
    return scatter.whole(rows, lay, place.shape)
  x = chunk.astype(jnp.float32)
  decoded, _ = yield from encoded_rows(codec, x, key, lay)
  decoded = jax.lax.dynamic_update_slice(decoded, x[None], (index, 0))
  return scatter.whole(decoded, lay, place.shape).astype(place.dtype)


def encoded_rows(codec: core.Compressor, x: jax.Array, key: jax.Array, lay: two_phase.Split):
  """A chunk ``x`` encoded, every worker's payload all-gathered (messages) and decoded: ``(rows, payload)``.

  One encoder a chunk: its own scalars, no agreement round. Also the
  updates' compressed all-gather of :func:`jaxcomp.shard_optimizer` (``gather=``).
  """
  payload = codec.encode(x, key, codec.agree(x))
  size = codec.encoded_bytes(payload, (lay.chunk,))
  rows = yield core.Message("gather", payload, encoded=None if size is None else jnp.asarray(size, jnp.uint32))
  return jax.vmap(lambda p: codec.decode(p, (lay.chunk,)))(rows), payload
