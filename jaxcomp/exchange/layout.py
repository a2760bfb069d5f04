"""Tensors side by side: a bucket's flat tensors as the columns of one array, for one encode.

A planar codec (TernGrad's 2-bit packing, 3LC's base-3^5, int8's bytes) cuts
a flat tensor of ``n`` values into ``P`` contiguous planes of
``m = ceil(n / P)`` values (the last padded) and packs byte ``j`` from value
``j`` of every plane (:mod:`jaxcomp.codecs.twobit`, :mod:`jaxcomp.codecs.base243`).
A tensor is thus a ``(P, m)`` array whose packed bytes are its columns. Laying
a bucket's tensors side by side, ``(P, m_1) ‖ (P, m_2) ‖ …`` along the
columns, gives one ``(P, M)`` array, ``M = Σ m_i``, whose packed bytes are the
concatenation of every tensor's own packed bytes, padding included: one
elementwise encode and one pack over the bucket write, byte for byte, what
the tensors' encodes write one at a time (so ``bytes_on_wire`` and every
number stay the same), and one decode reads them back.

What an encoder needs per tensor (a scale, a clipping bound, the seeds of its
random numbers) is computed per tensor and spread over that tensor's columns
(:meth:`Layout.per_chunk`); what it needs per element is the element's
index within its own tensor (:meth:`Layout.index`), so that a
counter-based generator (:mod:`jaxcomp.rng`) draws each tensor's numbers as
it would alone. The per-tensor encode is the same code on a bucket of one.
(For speed the columns are further cut into chunks of one tensor each: see
:class:`Layout`.)

Sizes are Python ints (exact at any size); nothing here allocates more than
the arrays of the bucket, so billion-parameter trees trace under
``jax.eval_shape``. Everything is plain ``jax.numpy``, for any backend.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def materialize(a: jax.Array) -> jax.Array:
  """``a`` unchanged, but computed into its own buffer before its consumers run.

  XLA fuses an elementwise producer (a quantizer) into its consumer. Before
  base-3^5 encoding that is slow on XLA:CPU: the encoder pads the codes and
  cuts them into five partitions, and the fused loop evaluates the quantizer
  through the pad (docs/benchmarks.md). Likewise a bucket's encode, whose
  consumers are its tensors' slices (:meth:`Layout.compact`), would be fused
  into every slice: one loop per tensor again. XLA does not fuse a reduction
  into several consumers (the JAX 0.10 XLA:CPU does fuse it into a single
  one), so a sum over the stacked pair ``(a, z)`` ends the fusion here; ``z``
  is the additive identity of every value (``0`` for integers, ``−0.0`` for
  floats: ``x + (−0.0) = x`` for every float ``x``, signed zeros and NaN
  included), so the sum is ``a`` bit for bit. Its producers do fuse into it:
  not for a concatenation of many arrays (see :meth:`Layout.split`).
  ``lax.optimization_barrier`` does not (see :func:`jaxcomp.exchange.allgather.exchange`
  for what it does). On GPU/TPU this costs one extra pass over ``a``; ``a``
  itself is the plain form.
  """
  if a.dtype == jnp.bool_:
    return materialize(a.astype(jnp.uint8)).astype(jnp.bool_)
  zero = jnp.array(-0.0 if jnp.issubdtype(a.dtype, jnp.floating) else 0, a.dtype)
  return jax.lax.reduce(jnp.stack([a, jnp.broadcast_to(zero, a.shape)]), zero, jax.lax.add, (0,))


def ceil_div(a: int, b: int) -> int:
  return -(-a // b)


CHUNK = 128
"""Columns a chunk: every chunk belongs to one tensor, so its parameters are one value per chunk."""

FAN_IN = 8
"""Parts of a bucket that :meth:`Layout.tensor_max` combines in its elementwise pass."""


class Layout:
  """The static layout of a bucket of flat tensors of ``sizes`` values, ``planes`` rows each.

  Tensor ``i`` is ``(planes, m_i)``, ``m_i = ceil(n_i / planes)``: the packed
  bytes of a planar codec are its columns, and the bucket's payload is every
  tensor's ``m_i`` columns end to end (``M = Σ m_i`` in all). For the
  elementwise work the columns are cut into chunks of :data:`CHUNK`, a
  tensor's last chunk padded, and the bucket is the ``(planes, chunks, CHUNK)``
  array of every tensor's chunks: a chunk belongs to one tensor, so a
  per-tensor parameter is one value per chunk, broadcast along the chunk,
  instead of a lookup per element (on XLA:CPU a lookup per element made the
  encode slower than the tensors' own encodes, broadcasting per chunk faster:
  docs/design.md, "Choices in the code"). The padding (under ``CHUNK`` columns a tensor)
  is computed and dropped: :meth:`compact` keeps each tensor's ``m_i`` columns.
  """

  def __init__(self, sizes: Sequence[int], planes: int, chunk: int = CHUNK, joined: Optional[jax.Array] = None,
               tops: Optional[jax.Array] = None, period: Optional[int] = None):
    self.joined = joined  # the bucket's input already joined (see joined_input), or None
    self.tops = tops  # with it, every tensor's max|x| (see input_max_abs), or None
    self.sizes = tuple(int(n) for n in sizes)
    # The sizes repeat every `period` tensors (the two-phase exchange's chunks: chunk j of every
    # tensor, then chunk j + 1): cut and placed a period at a time, with a leading axis of repeats.
    self.period = period if period and period < len(self.sizes) else None
    assert self.period is None or self.sizes == self.sizes[:period] * (len(self.sizes) // period)
    self.planes = int(planes)
    self.chunk = int(chunk)
    self.widths = tuple(ceil_div(n, self.planes) for n in self.sizes)  # m_i: columns of tensor i
    self.chunks = tuple(max(1, ceil_div(m, self.chunk)) for m in self.widths)  # chunks of tensor i
    self.first = tuple(int(c) for c in np.cumsum((0,) + self.chunks[:-1], dtype=np.int64))  # its first chunk
    self.columns = int(sum(self.widths))  # M

  def _base(self) -> tuple["Layout", int]:
    """One period's layout, and how many times it repeats."""
    return Layout(self.sizes[:self.period], self.planes, self.chunk), len(self.sizes) // self.period

  def __len__(self) -> int:
    return len(self.sizes)

  def starts(self) -> tuple[int, ...]:
    """Where each tensor's ``m_i`` columns begin in the payload's ``M`` (:meth:`compact`)."""
    return tuple(int(c) for c in np.cumsum((0,) + self.widths[:-1], dtype=np.int64))

  def _cut(self, a: jax.Array, i: int) -> jax.Array:
    """Tensor ``i``'s chunks of ``a`` (``(..., chunks, CHUNK)``) as ``(..., m_i)`` columns."""
    lo, c = self.first[i], self.chunks[i]
    block = a if len(self.sizes) == 1 else jax.lax.slice_in_dim(a, lo, lo + c, axis=a.ndim - 2)
    flat = block.reshape(a.shape[:-2] + (c * self.chunk,))
    return flat if c * self.chunk == self.widths[i] else flat[..., :self.widths[i]]

  def _chunked(self, cols: Sequence[jax.Array], fill: Any) -> jax.Array:
    """Every tensor's ``(..., m_i)`` columns padded to its chunks, joined: ``(..., chunks, CHUNK)``."""
    blocks = []
    for a, m, c in zip(cols, self.widths, self.chunks):
      if c * self.chunk != m:
        a = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, c * self.chunk - m)], constant_values=fill)
      blocks.append(a.reshape(a.shape[:-1] + (c, self.chunk)))
    return blocks[0] if len(blocks) == 1 else _joined(blocks, axis=-2)

  def join(self, flats: Sequence[jax.Array], fill: Any = 0) -> jax.Array:
    """The tensors (flat, ``sizes`` long) as one ``(planes, chunks, CHUNK)`` array, padded with ``fill``."""
    cols = []
    for a, n, m in zip(flats, self.sizes, self.widths):
      a = a.reshape(-1)
      if self.planes * m != n:
        a = jnp.pad(a, (0, self.planes * m - n), constant_values=fill)
      cols.append(a.reshape(self.planes, m))
    return self._chunked(cols, fill)

  def with_input(self, joined: jax.Array, tops: jax.Array) -> "Layout":
    """This layout carrying the bucket's input already joined and its tensors' ``max|x|``.

    :meth:`joined_input` and :meth:`input_max_abs` return them.
    """
    return Layout(self.sizes, self.planes, self.chunk, joined, tops, self.period)

  def joined_input(self, flats: Sequence[jax.Array]) -> jax.Array:
    """The bucket's input ``flats`` joined (:meth:`join`, zero padding): the join the layout carries, if any.

    The non-finite check of :func:`jaxcomp.compress` (one worker per device)
    joins a bucket's tensors once, in the encoder's layout, reads its flags
    from that join and hands it, with the tensors it sets aside zeroed, to the
    encoder (:meth:`with_input`): one join a bucket instead of two
    (ResNet-110's 3LC step: 329 fewer per-tensor kernels and 12 fewer copies).
    Either way it holds :meth:`join` of ``flats``, bit for bit.
    """
    return self.join(flats) if self.joined is None else self.joined

  def input_max_abs(self, flats: Sequence[jax.Array]) -> jax.Array:
    """Every tensor's ``max|x|`` of the bucket's input (:meth:`tensor_max` of ``|joined_input(flats)|``).

    The check reads its flags from the same maximum (``max|x|`` is ±Inf or NaN
    exactly when a value is) and carries it (:meth:`with_input`): an encoder
    that scales by it (3LC, int8) does not compute it again.
    """
    return self.tensor_max(jnp.abs(self.joined_input(flats))) if self.tops is None else self.tops

  def split(self, a: jax.Array) -> list[jax.Array]:
    """The inverse of :meth:`join` on ``a`` of shape ``(..., planes, chunks, CHUNK)``: flat ``(..., n_i)``.

    XLA fuses the elementwise producer of ``a`` (a decode) into each tensor's slice: a loop a
    tensor, each reading only its own part (XLA simplifies the slice of a joined array to the
    slice of its part). Materializing ``a`` instead would fuse the join's concatenation of the
    bucket's tensors into one loop, which on XLA:CPU searches its hundreds of operands per value.
    """
    if self.period:  # (..., planes, repeats, chunks, CHUNK): a period at a time, its repeats side by side
      base, repeats = self._base()
      a = a.reshape(a.shape[:-2] + (repeats, -1, self.chunk))
      per_tensor = base.split(jnp.moveaxis(a, -3, -4))  # (..., repeats, n_i) each
      return [t[..., r, :] for r in range(repeats) for t in per_tensor]
    out = []
    for i, n in enumerate(self.sizes):
      cols = self._cut(a, i)
      flat = cols.reshape(cols.shape[:-2] + (self.planes * self.widths[i],))
      out.append(flat if flat.shape[-1] == n else flat[..., :n])
    return out

  def compact(self, a: jax.Array) -> jax.Array:
    """Per-column values ``(..., chunks, CHUNK)`` (packed bytes) as the payload's ``(..., M)``.

    ``a`` is computed as one array first (:func:`materialize`), not once a tensor inside its slice;
    for one tensor too, so that its other readers (the pieces of a gather, 3LC's zero-run count)
    read the bytes instead of computing them again.
    """
    a = materialize(a)
    if self.period:
      base, repeats = self._base()
      b = a.reshape(a.shape[:-2] + (repeats, -1, self.chunk))
      cols = [base._cut(b, i) for i in range(len(base.sizes))]  # (..., repeats, m_i) each
      cols = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
      return cols.reshape(a.shape[:-2] + (-1,))
    cols = [self._cut(a, i) for i in range(len(self.sizes))]
    return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)

  def padded_columns(self, weights: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Where a planar codec's packed bytes hold padding: payload columns and their weights (static).

    Tensor ``i``'s values past ``n_i`` (its padding to ``planes·m_i``) lie in
    its last columns: column ``j`` holds padding in plane ``p`` when
    ``p·m_i + j >= n_i``, at most ``planes − 1`` columns a tensor. Returns the
    payload positions of those columns (:meth:`compact`), int64, and for each
    the sum of ``weights[p]`` over its padded planes, int64: what a byte holds
    too much when its padding was packed as the digit 1 instead of 0.
    """
    positions, sums = [], []
    for start, n, m in zip(self.starts(), self.sizes, self.widths):
      for j in range(max(0, n - (self.planes - 1) * m), m):
        padded = [p for p in range(self.planes) if p * m + j >= n]
        if padded:
          positions.append(start + j)
          sums.append(sum(int(weights[p]) for p in padded))
    return np.asarray(positions, np.int64), np.asarray(sums, np.int64)

  def expand(self, b: jax.Array, fill: Any = 0) -> jax.Array:
    """The inverse of :meth:`compact`: ``(..., M)`` as ``(..., chunks, CHUNK)``, padded with ``fill``."""
    if self.period:
      base, repeats = self._base()
      out = base.expand(b.reshape(b.shape[:-1] + (repeats, -1)), fill)  # (..., repeats, chunks, CHUNK)
      return out.reshape(b.shape[:-1] + (-1, self.chunk))
    cols = [b if len(self.sizes) == 1 else jax.lax.slice_in_dim(b, s, s + m, axis=b.ndim - 1)
            for s, m in zip(self.starts(), self.widths)]
    return self._chunked(cols, fill)

  def per_chunk(self, values: Any) -> jax.Array:
    """Per-tensor values spread over each tensor's chunks: ``(chunks, 1)``, to broadcast along them.

    ``values`` is a vector with one value a tensor, or a list of scalars of
    one dtype. A bucket of one broadcasts its scalar; otherwise each chunk
    takes its tensor's value from the table (a few thousand lookups).
    """
    if isinstance(values, (list, tuple)) and not any(isinstance(v, jax.Array) for v in values):
      table = jnp.asarray(np.asarray(values))  # static values (widths, sizes): one constant of k
    elif isinstance(values, (list, tuple)):
      table = jnp.stack([jnp.asarray(v).reshape(()) for v in values])
    else:
      table = values
    if len(self.sizes) == 1:
      return jnp.broadcast_to(table[0], (self.chunks[0], 1))
    return materialize(table[self._chunk_tensor()])[:, None]

  def tensor_sum(self, a: jax.Array) -> jax.Array:
    """Every tensor's sum of ``a`` (``(planes, chunks, CHUNK)``, its padding zero): float ``(k,)``.

    Each chunk is summed, then each tensor's chunks in order (a segment sum
    over the static chunk-to-tensor map): a few passes for the whole bucket
    where a reduction a tensor costs a kernel launch each (docs/design.md,
    "Encoding a bucket at once"). A tensor's sum does not depend on where
    its chunks lie, so a bucket of one gives the same bits. (On GPU the
    segment sum is an atomic scatter-add unless ``--xla_gpu_deterministic_ops``
    is set: the order of the chunks' sums, and so the last bit, may then vary
    from run to run.)
    """
    return jax.ops.segment_sum(self._sum_chunks(a), self._chunk_tensor(), len(self.sizes),
                               indices_are_sorted=True)

  def tensor_max(self, a: jax.Array) -> jax.Array:
    """Every tensor's maximum of ``a`` (``(planes, chunks, CHUNK)``; padding included): ``(k,)``.

    A maximum is exact in any order, with two caveats settled here: a NaN
    propagates, and a zero maximum is ``+0`` (``+ 0.0`` changes no other
    value). The planes, and halves of the chunks until there are at least
    :data:`FAN_IN` parts, are first combined elementwise (``jnp.maximum``
    propagates NaN) in one pass over ``a``, into which XLA fuses ``a``'s
    producer (``|x|``); what remains is reduced as XLA sees fit. XLA:CPU hands
    a large reduction to a library that skips NaNs and reads a materialized
    input, so a NaN is found by a sum (of zeros and NaNs: exact in any order).
    Combining the planes first is faster than one plane, and both than the
    fixed order of :meth:`tensor_sum` (docs/design.md, "Choices in the
    code"). The padding counts: pass values for which it is neutral (``|x|`` with zero
    padding: the maximum is ``≥ 0`` anyway).
    """
    parts = [a[p] for p in range(a.shape[0])]
    while len(parts) < FAN_IN and parts[0].shape[-1] > 1:
      half = parts[0].shape[-1] // 2
      parts = [q[..., :half] for q in parts] + [q[..., half:] for q in parts]
    m = parts[0]
    for q in parts[1:]:
      m = jnp.maximum(m, q)
    nan = jnp.isnan(jnp.sum(jnp.where(m == m, 0.0, m), axis=-1))  # the chunk holds a NaN
    per_chunk = jnp.where(nan, jnp.nan, jnp.max(m, axis=-1))
    return jax.ops.segment_max(per_chunk, self._chunk_tensor(), len(self.sizes), indices_are_sorted=True) + 0.0

  @staticmethod
  def _sum_chunks(a: jax.Array) -> jax.Array:
    """``a`` (``(planes, chunks, CHUNK)``) summed per chunk, in an order fixed here.

    Halves of each row are added (a pairwise tree over its ``CHUNK`` values),
    then the planes in order: elementwise operations, which XLA neither
    reorders nor reassociates. A reduction op (``jnp.sum``) is ordered as XLA
    sees fit, and XLA:CPU orders a chunk's sum differently in a bucket than in
    a tensor alone: the last bit of a tensor's sum would depend on its bucket.
    """
    assert a.shape[-1] & (a.shape[-1] - 1) == 0, "CHUNK must be a power of two"
    while a.shape[-1] > 1:
      half = a.shape[-1] // 2
      a = a[..., :half] + a[..., half:]
    out = a[0, :, 0]
    for p in range(1, a.shape[0]):
      out = out + a[p, :, 0]
    return out

  def _chunk_tensor(self) -> jax.Array:
    """The tensor each chunk belongs to: int32 ``(chunks,)``.

    A repeat of ``0 … k − 1`` by the static chunk counts: a few operations
    and a constant of ``k`` values whatever the bucket's number of tensors or
    chunks (one ``full`` a tensor grew the program with the tensors, and with
    the workers for a two-phase bucket's ``N·k`` pieces).
    """
    return segment_ids(self.chunks)

  def index(self) -> jax.Array:
    """Each value's index within its own tensor, ``uint32[planes, chunks, CHUNK]``.

    Value ``(p, j, c)`` in chunk ``j`` of tensor ``i`` (its ``j − first_i``-th)
    is its element ``p·m_i + (j − first_i)·CHUNK + c`` (padding: ``n_i`` and
    above, or beyond ``m_i`` columns).
    """
    row = jax.lax.broadcasted_iota(jnp.uint32, self._shape(), 0)
    return row * self.per_chunk([np.uint32(m) for m in self.widths]) + self._column()

  def _shape(self) -> tuple[int, int, int]:
    return (self.planes, sum(self.chunks), self.chunk)

  def _column(self) -> jax.Array:
    """Each value's column within its own tensor, ``uint32[planes, chunks, CHUNK]``: ``(j − first_i)·CHUNK + c``."""
    col = jax.lax.broadcasted_iota(jnp.uint32, self._shape(), 2)
    chunk = jnp.arange(sum(self.chunks), dtype=jnp.uint32)
    if len(self.sizes) > 1:  # the chunk's index within its own tensor
      chunk = chunk - self.per_chunk([np.uint32(f) for f in self.first])[:, 0]
    return (chunk * np.uint32(self.chunk))[:, None] + col

  def valid(self) -> jax.Array:
    """Where a tensor's ``planes·m_i`` values are its own (``index < n_i``), not its padding to them (bool).

    (The columns beyond ``m_i`` are dropped by :meth:`compact` whatever they hold.)
    """
    return self.index() < self.per_chunk([np.uint32(n) for n in self.sizes])

  def own(self) -> jax.Array:
    """Where the bucket holds a tensor's own values (bool): :meth:`valid` and within its ``m_i`` columns.

    Neither padding (to ``planes·m_i`` values, or to whole chunks) is a value:
    a statistic for which zeros are not neutral (a deviation from the mean)
    masks both.
    """
    return self.valid() & (self._column() < self.per_chunk([np.uint32(m) for m in self.widths]))


def segment_ids(counts: Sequence[int]) -> jax.Array:
  """``i`` repeated ``counts[i]`` times (static counts): the segment each of ``sum(counts)`` items is in, int32.

  A few operations and a constant of ``len(counts)`` values, whatever the counts.
  """
  return jnp.repeat(jnp.arange(len(counts), dtype=jnp.int32), np.asarray(counts, np.int64),
                    total_repeat_length=int(sum(counts)))


def _joined(parts: Sequence[jax.Array], axis: int = 0) -> jax.Array:
  """``jnp.concatenate(parts, axis)``: never :func:`materialize` d.

  Fused into a loop (such as :func:`materialize`'s), a concatenation of a
  bucket's hundreds of tensors is evaluated per value by a search over its
  operands (XLA:CPU); alone,
  as XLA:CPU leaves it here, it is a copy.
  """
  return jnp.concatenate(parts, axis=axis)


def payload_parts(payload: Any, structs: Sequence[Any], lead: int = 0) -> list[Any]:
  """A bucket's payload cut into its tensors' payloads.

  Every array of a bucket's payload is its tensors' arrays (of the shapes of
  ``structs[i]``, a payload of ``jax.ShapeDtypeStruct`` s) flattened and laid
  end to end, after ``lead`` leading axes (a gathered payload's worker axis).
  """
  leaves, treedef = jax.tree.flatten(payload)
  per_field = [treedef.flatten_up_to(s) for s in structs]
  starts = [0] * len(leaves)
  parts = []
  for fields in per_field:
    out = []
    for f, (a, struct) in enumerate(zip(leaves, fields)):
      shape = tuple(struct.shape)
      size = int(np.prod(shape, dtype=np.int64))
      whole = size == a.shape[lead] and starts[f] == 0
      piece = a if whole else jax.lax.slice_in_dim(a, starts[f], starts[f] + size, axis=lead)
      out.append(piece.reshape(a.shape[:lead] + shape))
      starts[f] += size
    parts.append(treedef.unflatten(out))
  return parts


def joined_payload(parts: Sequence[Any], lead: int = 0) -> Any:
  """The inverse of :func:`payload_parts`: the tensors' payloads as one bucket payload."""
  flat = [jax.tree.map(lambda a: a.reshape(a.shape[:lead] + (-1,)), p) for p in parts]
  if len(flat) == 1:
    return flat[0]
  return jax.tree.map(lambda *a: jnp.concatenate(a, axis=lead), *flat)
