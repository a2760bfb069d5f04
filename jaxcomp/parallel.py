"""Compressed exchange over a named worker axis.

The exchange of one tensor, on every worker::

    agreed  = pmax(compressor.agree(x))          # optional pre-exchange agreement
    payload = compressor.encode(x, key, agreed)   # packed integer codes + scales
    gathered = all_gather(payload)                # the wire: N payloads
    mean    = compressor.aggregate(gathered)      # decode every payload, average

Only named-axis collectives are used, so the same code runs under

* ``jax.vmap(..., axis_name="workers")``: N simulated workers on one device,
* ``jax.pmap(..., axis_name="workers")`` (legacy, still supported),
* ``jax.jit(jax.shard_map(..., mesh=...))`` (the modern path),
* combinations, with a tuple of axis names, e.g. ``("devices", "workers")``
  for ``vmap`` inside ``shard_map``: workers are numbered major to minor,
  ``index = i_devices * n_workers + i_workers``,
* multi-process JAX (``jax.distributed.initialize``) over a global mesh.

Under ``vmap`` the gathered payload is not batched (it is the same for every
worker), so JAX decodes and averages it once, not once per simulated worker.

Note: collectives over a ``vmap`` axis inside ``shard_map`` need
``shard_map(..., check_vma=False)`` in JAX 0.10 (its varying-axes check does
not know vmap axis names).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
from jax import lax

from jaxcomp import core

AxisName = Union[None, str, Sequence[str]]


def _names(axis_name: AxisName) -> tuple[str, ...]:
  if axis_name is None:
    return ()
  if isinstance(axis_name, str):
    return (axis_name,)
  names = tuple(axis_name)
  if not all(isinstance(n, str) for n in names):
    raise TypeError(f"axis_name must be None, a string or a tuple of strings; got {axis_name!r}.")
  return names


def axis_size(axis_name: AxisName) -> int:
  """Number of workers along ``axis_name`` (1 for ``None``)."""
  size = 1
  for n in _names(axis_name):
    size *= lax.axis_size(n)
  return size


def axis_index(axis_name: AxisName) -> jax.Array:
  """This worker's index, major to minor over a tuple of names (0 for ``None``)."""
  index = jnp.int32(0)
  for n in _names(axis_name):
    index = index * lax.axis_size(n) + lax.axis_index(n)
  return index


def all_gather(tree: Any, axis_name: AxisName) -> Any:
  """``lax.all_gather`` of every array in ``tree`` with one leading worker axis.

  A tuple of names is gathered minor first, so the leading axis follows
  :func:`axis_index`.
  """
  names = _names(axis_name)
  if not names:
    return jax.tree.map(lambda a: a[None], tree)

  manual = set(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()))

  def gather(a):
    shape = a.shape
    for n in reversed(names):
      # Under shard_map the gathered value is the same on every device: say so
      # ("invarying"), so that shard_map's replication check accepts the mean.
      a = lax.all_gather(a, n, to="invarying" if n in manual else "varying")
    return a.reshape((-1,) + shape)

  return jax.tree.map(gather, tree)


def pmax(tree: Any, axis_name: AxisName) -> Any:
  for n in _names(axis_name):
    tree = lax.pmax(tree, n)
  return tree


def pmean(tree: Any, axis_name: AxisName) -> Any:
  for n in _names(axis_name):
    tree = lax.pmean(tree, n)
  return tree


def psum(tree: Any, axis_name: AxisName) -> Any:
  for n in _names(axis_name):
    tree = lax.psum(tree, n)
  return tree


def exchange(
    compressor: core.Compressor,
    x: jax.Array,
    key: jax.Array,
    axis_name: AxisName,
    *,
    need_own: bool = False,
) -> tuple[jax.Array, Optional[jax.Array], core.Payload, int]:
  """Compresses ``x`` on every worker and returns the mean of all workers.

  See :func:`exchange_with_metrics`, which also returns the encoder's
  counters.

  Args:
    compressor: the per-tensor compressor.
    x: this worker's tensor, float32.
    key: this worker's key for this tensor and step.
    axis_name: the worker axis (``None``: a single worker, quantize and
      dequantize locally).
    need_own: also return ``decode(own payload)`` (error feedback needs it).

  Returns:
    ``(mean, own, payload, wire_bytes)``: the float32 mean of every worker's
    decoded tensor, this worker's own decoded tensor (or ``None``), its
    payload, and the static number of bytes this worker handed to collectives
    (payload plus agreement).
  """
  mean, own, payload, wire, _ = exchange_with_metrics(compressor, x, key, axis_name, need_own=need_own)
  return mean, own, payload, wire


def exchange_with_metrics(
    compressor: core.Compressor,
    x: jax.Array,
    key: jax.Array,
    axis_name: AxisName,
    *,
    need_own: bool = False,
) -> tuple[jax.Array, Optional[jax.Array], core.Payload, int, dict[str, jax.Array]]:
  """:func:`exchange`, plus the counters of :meth:`Compressor.encode_with_metrics`.

  Returns:
    ``(mean, own, payload, wire_bytes, metrics)``.
  """
  shape = x.shape
  agreed = compressor.agree(x)
  agreement_bytes = 0
  if agreed is not None:
    agreement_bytes = core.tree_nbytes(agreed) if _names(axis_name) else 0
    agreed = pmax(agreed, axis_name)
  payload, metrics = compressor.encode_with_metrics(x, key, agreed)
  wire = core.tree_nbytes(payload) + agreement_bytes
  own = compressor.decode(payload, shape) if need_own or not _names(axis_name) else None
  if not _names(axis_name):
    return own, (own if need_own else None), payload, wire, metrics
  gathered = all_gather(payload, axis_name)
  mean = compressor.aggregate(gathered, shape)
  return mean, own, payload, wire, metrics


# -- laying optimizer states over workers -----------------------------------


def _is_local(x: Any) -> bool:
  return isinstance(x, core.WorkerLocal)


def worker_axes(state: Any) -> Any:
  """``in_axes``/``out_axes`` for ``vmap``/``pmap`` of an optimizer state.

  Leaves inside a :class:`~jaxcomp.core.WorkerLocal` (residuals, per-worker
  counters) get ``0``; every other leaf (step counters, keys, momentum of the
  optimizer that follows) is the same on every worker and gets ``None``. A
  value that is marked ``None`` but differs between workers is an error JAX
  reports, which keeps the replicas honest.
  """

  def axes(x):
    if _is_local(x):
      return jax.tree.map(lambda _: 0, x)
    return None

  return jax.tree.map(axes, state, is_leaf=_is_local)


def worker_specs(state: Any, axis: Union[str, tuple[str, ...]]) -> Any:
  """``shard_map`` partition specs: worker-local leaves split over ``axis``."""
  from jax.sharding import PartitionSpec as P

  def spec(x):
    if _is_local(x):
      return jax.tree.map(lambda _: P(axis), x)
    return P()

  return jax.tree.map(spec, state, is_leaf=_is_local)


def replicate_workers(state: Any, num_workers: int) -> Any:
  """Gives every worker-local leaf a leading axis of ``num_workers``."""

  def rep(x):
    if _is_local(x):
      return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers,) + jnp.shape(a)), x)
    return x

  return jax.tree.map(rep, state, is_leaf=_is_local)


def worker_slice(state: Any, index: int) -> Any:
  """The state as worker ``index`` sees it (worker-local leaves indexed)."""

  def pick(x):
    if _is_local(x):
      return jax.tree.map(lambda a: a[index], x)
    return x

  return jax.tree.map(pick, state, is_leaf=_is_local)
