"""Hierarchical exchange: average in float within a host, compress between hosts.

Hosts of several accelerators are joined inside by a fast interconnect
(NVLink, ICI, shared memory) and to each other by a slower network. Sending
every device's compressed payload across the network wastes it: each host
would send as many payloads as it has devices, where one would do once its
devices had averaged their gradients over the fast links. Horovod's
hierarchical all-reduce, CGX's intra-/inter-node split and DeepSpeed's 1-bit
Adam (compressed only between nodes) do this; :func:`jaxcomp.compress` does it
with ``within=``::

    # mesh axes ("hosts", "local"): compress over "hosts", average in float over "local"
    tx = jaxcomp.terngrad(axis_name="hosts", within="local")

One update on every device, for a host of ``L`` devices (the axis ``within``):

1. **Reduce-scatter over** ``within`` (float, in the gradient's dtype): each
   device gets the host's mean of *one slice* of every tensor, the ``l``-th of
   ``L`` equal slices along its last axis that ``L`` divides (``l`` the
   device's index on ``within``; :func:`split_axis`). One collective per dtype for the whole tree.
2. **The compressed exchange over** ``axis_name`` of those slices, exactly as
   without a hierarchy (buckets, two-phase, error feedback, non-finite
   policy), with one worker per host: device ``l`` of every host exchanges
   slice ``l``. Across the network each host sends one payload of the whole
   model, split over its devices, and each device encodes ``1/L`` of it.
3. **All-gather over** ``within``: every device of the host gets the whole
   averaged tensors.

What becomes per slice: every statistic a compressor computes on a tensor
(TernGrad's scalar and σ, a norm, int8's and 3LC's scales, top-k's selection,
1-bit SGD's column means) is computed on the device's slice, as in a
model-sharded tensor. A slice keeps the tensor's other axes (conv kernels
stay HWIO, matrices stay matrices), so column-wise compressors see whole
columns. Random draws are the slice's own: device ``l`` of host ``h`` draws
as worker ``h·L + l`` would in a flat exchange.

Error feedback is per host: the host's residual of a tensor is split over its
devices like the tensor, each device keeping the residual of its slice in a
full-size buffer (zero outside its slice, so the state has the layout of a
flat exchange's); the host's residual is the sum of its devices' buffers. A
tensor's non-finite flag is the host's (any device of the host), so the
policy acts on whole tensors.

Not split, but averaged whole over ``within`` and then exchanged by every
device of the host alike (the same payload ``L`` times over the network;
named in :func:`split_axis`): a tensor none of whose axes divides by ``L``
(a 10-class classifier's bias with ``L = 4``), a scalar, and a tensor of a
compressor whose per-tensor state has the tensor's shape in it (PowerSGD's
``Q``). Their residuals are whole on every device.

Counting: the counters of :func:`jaxcomp.metrics` are per device (a mean over
all workers), over ``axis_name``: a device's ``bytes_on_wire`` is the payload
of its slices, so a host sends ``L`` times that across the network. The bytes
handed to the collectives over ``within`` (reduce-scatter operands, pmeans of
whole tensors, non-finite flags, the all-gathered slices) are the separate
counter ``local_bytes``, counted by the transport from those messages.

A topology is what :func:`jaxcomp.compress` asks of the devices around a
worker: :class:`Flat` (every worker exchanges its own gradient) or
:class:`Local` (a host's devices share one exchange). Both answer the same
steps, so an update has no branch for the hierarchy.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp import rng
from jaxcomp.count import Count
from jaxcomp.exchange import buckets
from jaxcomp.exchange import transport


def split_axis(shape: Sequence[int], workers: int, compressor: Optional[core.Compressor],
               skipped: bool) -> Optional[int]:
  """The axis a tensor of ``shape`` is split along over ``workers`` devices of a host, or ``None``.

  The last axis whose size ``workers`` divides (a Dense kernel's outputs, a
  conv kernel's output channels; a 10-class head's inputs), provided the
  compressor's per-tensor state (:meth:`~jaxcomp.core.Compressor.init_state`)
  has shapes that no tensor's shape changes (a step counter, a key): such a
  state is the same on every device of a host, where a state shaped by its
  tensor (PowerSGD's ``Q``) would be computed from each device's slice.
  ``None``: the tensor is averaged and exchanged whole.
  """
  shape = tuple(shape)
  axis = next((a for a in reversed(range(len(shape))) if shape[a] % workers == 0), None)
  if axis is None or skipped or compressor is None or workers == 1:
    return axis
  key = jax.random.PRNGKey(0)
  state = lambda s: jax.eval_shape(lambda k: compressor.init_state(s, k), key)
  fixed = state(shape) == state(_slice_shape(shape, axis, workers)) == state(tuple(2 * n + 1 for n in shape))
  return axis if fixed else None


def _slice_shape(shape: Sequence[int], axis: int, workers: int) -> tuple[int, ...]:
  return tuple(shape[:axis]) + (shape[axis] // workers,) + tuple(shape[axis + 1:])


class Local:
  """The fast axis ``within`` of one update: which tensors are split, this device's slices, the collectives.

  Args:
    within: the host's axis (a name or a tuple of names) of the surrounding
      ``shard_map``, ``pmap`` or ``vmap``.
    shapes: every gradient leaf's shape.
    compressor: the transform's compressor (``None``: float).
    skipped: which leaves stay in float.
  """

  def __init__(self, within: parallel.AxisName, shapes: Sequence[Sequence[int]],
               compressor: Optional[core.Compressor], skipped: Sequence[bool]):
    self.within = within
    self.workers = parallel.axis_size(within)
    self.index = parallel.axis_index(within)
    self.axis = [split_axis(s, self.workers, compressor, k) for s, k in zip(shapes, skipped)]
    self.split = [a is not None for a in self.axis]
    # A whole tensor's update is computed by every device of the host from its own residual: the same
    # values, typed as differing. Over shard_map axes with the varying-axes check, a pmax (of equal
    # values: exact) types it as the same; over vmap axes, any one worker's (all_gather: free there).
    names = parallel.axis_names(within)
    self.retype = tuple(sorted(parallel.checked_axes(within))) if self.workers > 1 else ()
    self.unbatch = tuple(n for n in names if not parallel.is_device_axis(n))
    self.traffic = transport.Traffic()  # the messages over `within`: local_bytes

  def _deliver(self, trees: Sequence[Any], kind: str, axis_name: parallel.AxisName = None) -> list[Any]:
    """One fused collective of ``kind`` over ``within`` (or ``axis_name``) for ``trees``, each message counted."""
    axis_name = self.within if axis_name is None else axis_name
    for tree in trees:
      self.traffic.add(core.Message(kind, tree), parallel.axis_size(axis_name))
    return buckets.deliver(trees, kind, axis_name)

  def leaf_keys(self, step_key: jax.Array, ids: Sequence[int], axis_name: parallel.AxisName) -> dict[int, jax.Array]:
    """For every leaf of ``ids``, the keys of all ``ids`` (:func:`jaxcomp.rng.leaf_keys`, one row each) it
    draws from: worker ``h·L + l``'s if split, ``h·L``'s (the same on every device of a host) if whole."""
    host = parallel.axis_index(axis_name) * self.workers
    sliced = rng.leaf_keys(step_key, ids, host + self.index)
    whole = rng.leaf_keys(step_key, ids, host)
    return {i: sliced if self.split[i] else whole for i in ids}

  def separate(self, groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """Each group of leaves as its split leaves, then its whole ones (a bucket encoded at once is one
    or the other: its payload is the same on every device of a host or it is not)."""
    out = []
    for group in groups:
      out += [ids for ids in ([i for i in group if self.split[i]], [i for i in group if not self.split[i]]) if ids]
    return out

  def scatter(self, leaves: Sequence[jax.Array]) -> list[jax.Array]:
    """The host's mean of every leaf: this device's slice of a split leaf, the whole of the others.

    One reduce-scatter per dtype for all leaves (a whole leaf is cut into ``L``
    equal pieces, zero-padded, for it), then one all-gather of the whole
    leaves' pieces (:func:`jaxcomp.exchange.buckets.deliver`): a sum whose order is the same in one process and in
    several (an all-reduce's is not).
    """
    out = list(leaves)
    groups: dict[Any, list[int]] = {}
    for i, a in enumerate(leaves):
      groups.setdefault(jnp.result_type(a), []).append(i)
    for ids in groups.values():
      rows = [self._rows(leaves[i], self.axis[i]) for i in ids]  # (L, elements of a piece) each
      # A reduce-scatter written as an all-to-all and a sum in a fixed order: the same bytes, and the
      # same sum in one process and in several (lax.psum_scatter's order is the collective library's:
      # between 4 devices over gloo a ring's, 1 ulp from XLA:CPU's in-process one).
      received, = self._deliver([jnp.concatenate(rows, axis=1)], "all_to_all")  # row v: device v's
      mean = (core.sum_leading(received) / self.workers).astype(received.dtype)
      pieces, start = {}, 0
      for i, r in zip(ids, rows):
        pieces[i] = mean[start:start + r.shape[1]]
        start += r.shape[1]
      whole = [i for i in ids if not self.split[i]]
      for i, gathered in zip(whole, self._deliver([pieces[i] for i in whole], "gather")):
        pieces[i] = gathered.reshape(-1)[:core.size_of(jnp.shape(leaves[i]))]  # (L, piece): the whole leaf
      for i in ids:
        shape = jnp.shape(leaves[i])
        out[i] = pieces[i].reshape(shape if self.axis[i] is None else _slice_shape(shape, self.axis[i], self.workers))
    return out

  def _rows(self, a: jax.Array, axis: Optional[int]) -> jax.Array:
    """``a`` as ``(L, ·)``: row ``l`` is slice ``l`` along ``axis`` (split), or piece ``l`` of ``a``
    flattened and zero-padded to ``L`` equal pieces (whole, ``axis`` None)."""
    if axis is None:
      flat = a.reshape(-1)
      return jnp.pad(flat, (0, -flat.shape[0] % self.workers)).reshape(self.workers, -1)
    shape = a.shape
    a = a.reshape(shape[:axis] + (self.workers, shape[axis] // self.workers) + shape[axis + 1:])
    return jnp.moveaxis(a, axis, 0).reshape(self.workers, -1)

  def gather(self, parts: Sequence[jax.Array]) -> list[jax.Array]:
    """The whole leaves from every device's slices (one all-gather, :func:`jaxcomp.exchange.buckets.deliver`);
    whole leaves as they are (or retyped, see ``retype``)."""
    out = self.same(parts)
    ids = [i for i, s in enumerate(self.split) if s]
    for i, block in zip(ids, self._deliver([parts[i] for i in ids], "gather")):
      shape, axis = parts[i].shape, self.axis[i]  # block: (L,) + shape, slice l from device l
      out[i] = jnp.moveaxis(block, 0, axis).reshape(shape[:axis] + (shape[axis] * self.workers,) + shape[axis + 1:])
    return out

  def same(self, trees: Sequence[Any]) -> list[Any]:
    """Whole leaves' trees (updates, compressor states) typed as the same on every device of the host
    (see ``retype``; one pmax per dtype); the others as they are."""
    out = list(trees)
    whole = [i for i, s in enumerate(self.split) if not s and jax.tree.leaves(trees[i])]
    if self.retype and whole:
      for i, same in zip(whole, self._deliver([out[i] for i in whole], "max", self.retype)):
        out[i] = same
    for name in self.unbatch:
      for i in whole:
        out[i] = jax.tree.map(lambda a, name=name: lax.all_gather(a, name)[0], out[i])
    return out

  def take(self, leaves: Sequence[Any]) -> list[Any]:
    """This device's slice of every split full-size state leaf (residuals); the others as they are."""
    out = []
    for a, axis in zip(leaves, self.axis):
      if axis is not None and _is_array(a):
        w = a.shape[axis] // self.workers
        a = lax.dynamic_slice_in_dim(a, self.index * w, w, axis=axis)
      out.append(a)
    return out

  def put(self, parts: Sequence[Any]) -> list[Any]:
    """Full-size state leaves from this device's slices: zero outside its slice (see :meth:`take`)."""
    out = []
    for a, axis in zip(parts, self.axis):
      if axis is not None and _is_array(a) and self.workers > 1:
        w = a.shape[axis]
        full = jnp.zeros(a.shape[:axis] + (w * self.workers,) + a.shape[axis + 1:], a.dtype)
        a = lax.dynamic_update_slice_in_dim(full, a, self.index * w, axis=axis)
      out.append(a)
    return out

  def any(self, flags: jax.Array) -> jax.Array:
    """The host's flags: ``flags`` (bool) set on any device of ``within`` (one pmax)."""
    return self._deliver([flags.astype(jnp.uint8)], "max")[0] > 0

  def host_flags(self, xs, bad, layouts, together, compressed, set_aside):
    """A tensor's flag is the host's: ``xs`` and ``bad`` updated, the layouts' joins zeroed alike (``set_aside``)."""
    if not compressed:
      return layouts
    host_bad = self.any(jnp.stack([bad[i] for i in compressed]))
    for i, b in zip(compressed, host_bad):
      xs[i], bad[i] = jnp.where(b, jnp.zeros_like(xs[i]), xs[i]), b
    return [lay if lay.joined is None else set_aside(lay, jnp.stack([bad[i] for i in ids]))
            for lay, ids in zip(layouts, together)]

  def whole(self, updates, inners, residuals, shards):
    """Whole tensors on every device of the host: the updates and states of the update's slices."""
    return self.gather(updates), self.same(inners), self.put(residuals), self.put(shards)

  def count(self, metrics: dict[str, Count]) -> dict[str, Count]:
    """The counters per device: a host's non-finite tensor once (on device 0), and ``local_bytes``.

    Every count depends on the host's size, which init's abstract trace sets to 1: traced, so
    that the state keeps one structure.
    """
    metrics = {name: value.traced() for name, value in {**metrics, "local_bytes": self.traffic.sent}.items()}
    metrics["nonfinite_tensors"] = metrics["nonfinite_tensors"].where(self.index == 0)
    return metrics


class Flat:
  """The topology without a hierarchy: every worker exchanges its own whole gradient (every step the identity)."""

  def scatter(self, leaves):
    return list(leaves)

  take = scatter

  def separate(self, groups):
    return [list(g) for g in groups]

  def leaf_keys(self, step_key, ids, axis_name):
    stacked = rng.leaf_keys(step_key, ids, parallel.axis_index(axis_name))
    return {i: stacked for i in ids}

  def host_flags(self, xs, bad, layouts, together, compressed, set_aside):
    del xs, bad, together, compressed, set_aside
    return layouts

  def whole(self, updates, inners, residuals, shards):
    return updates, inners, residuals, shards

  def count(self, metrics):
    return metrics


def _is_array(a: Any) -> bool:
  return hasattr(a, "shape") and hasattr(a, "dtype")
