"""The compressor protocol.

A :class:`Compressor` is a pure, jit-able pair acting on one tensor:

* ``encode(x, key, agreed) -> Payload``: ``x`` is the tensor (float32, its
  original shape), ``key`` a PRNG key private to this tensor, worker and step,
  and ``agreed`` whatever the workers agreed on before encoding (see
  :meth:`Compressor.agree`), or ``None``.
* ``decode(payload, shape) -> x_hat``: float32 of ``shape``.

A *Payload* is a small ``NamedTuple`` of arrays with static shapes: packed
integer codes (uint8/uint32) plus a few float scales. That tuple *is* the wire:
:mod:`jaxcomp.parallel` hands exactly these arrays to ``lax.all_gather``, and
``bytes_on_wire`` is the sum of their ``nbytes``.

Everything around a compressor is shared, never re-written per algorithm:
error feedback, skipping tensors, dtype handling, randomness, the collective
and the byte accounting live in :mod:`jaxcomp.transforms` and
:mod:`jaxcomp.parallel`. This module is the layer under them: it imports
neither.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcomp.exchange import layout as layout_lib
from jaxcomp.count import Count

Shape = tuple[int, ...]
Payload = Any  # a NamedTuple of arrays


def tree_nbytes(tree: Any) -> int:
  """Static number of bytes of all arrays (or ShapeDtypeStructs) in ``tree``."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    total += int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


def is_traced(tree: Any) -> bool:
  """Whether any leaf of ``tree`` is a tracer (inside ``jit``, ``vmap``, ``shard_map``): else it runs eagerly."""
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def size_of(shape: Sequence[int]) -> int:
  """Number of elements of an array of ``shape`` (a Python int: exact for any size)."""
  return int(math.prod(shape))


def sum_leading(x: jax.Array) -> jax.Array:
  """Sum over the leading axis by pairwise halving (any dtype; int8 sums in int32).

  XLA:CPU reduces over a major axis one element at a time; adding the two
  halves repeatedly is plain vectorized elementwise work and much faster
  there (docs/benchmarks.md). On GPU/TPU the two are alike. ``x.sum(0)`` is
  the plain form.
  """
  if jnp.issubdtype(x.dtype, jnp.integer) and x.dtype.itemsize < 4:
    x = x.astype(jnp.int32)
  while x.shape[0] > 1:
    if x.shape[0] % 2:
      x = jnp.concatenate([x[:1] + x[-1:], x[1:-1]])
      continue
    h = x.shape[0] // 2
    x = x[:h] + x[h:]
  return x[0]


def after(xs: Sequence[jax.Array], flag: jax.Array) -> list[jax.Array]:
  """``xs`` unchanged, bit for bit, but computed after ``flag``, a bool scalar computed elsewhere.

  Each ``x`` goes through a select on a predicate that is never true but
  that XLA cannot fold (the flag's byte above 1), so whatever reads ``xs``
  waits for ``flag``. A select moves bits: arithmetic such as ``x + (−0.0)``
  would flush subnormals on XLA:CPU. XLA:CPU runs whatever is ready in the
  order its schedule lists it, and a collective blocks its thread: this puts
  work that can wait behind work the wire waits for. Two uses:

  * a bucket's tensors after the previous bucket's check
    (:func:`jaxcomp.compress`): without, every bucket's first kernels (its
    residual add, its check, its statistics) run before the first collective
    starts; with, the first bucket reaches the wire first (docs/design.md,
    "Choices in the code");
  * this worker's own decode after its bucket's encode
    (:func:`jaxcomp.exchange.allgather.bucket_exchange_steps`).

  On GPU, where kernels of one stream run in order anyway, it changes nothing
  but the order in which they are issued. The plain form is ``xs`` itself.
  """
  never = flag.astype(jnp.uint8) > 1
  return [jnp.where(never, jnp.zeros_like(x), x) for x in xs]


class DecodeShapeError(ValueError):
  """A compressor's ``decode`` returned an array whose shape is not the tensor's."""


def _shape_checked(decode):
  """``decode`` with its result's shape checked against ``shape`` (at trace time: shapes are static).

  Every call of a subclass's ``decode`` goes through this check, wherever it
  is made (the all-gather, the two-phase exchange, error feedback, a custom
  exchange): a wrong shape is named here, not later as a broadcasting error
  in the optimizer.
  """

  @functools.wraps(decode)
  def checked(self, payload, shape):
    out = decode(self, payload, shape)
    if tuple(jnp.shape(out)) != tuple(shape):
      raise DecodeShapeError(
          f"{type(self).__name__}.decode(payload, shape) returned shape {tuple(jnp.shape(out))} "
          f"for a tensor of shape {tuple(shape)}: decode must return the tensor's own shape "
          "(e.g. end it with .reshape(shape)).")
    return out

  return checked


@dataclasses.dataclass(frozen=True)
class Compressor:
  """Base class of all per-tensor compressors.

  Subclasses are frozen dataclasses holding the static configuration, so they
  are hashable and can be closed over by jitted functions.

  A subclass implements :meth:`encode` and :meth:`decode`; every other hook
  has a default. The class attributes tell the shared machinery about the
  algorithm:

  Attributes:
    unbiased: ``E[decode(encode(x))] == x`` (stochastic quantizers); stated
      in the compressor tables (``benchmarks/bits_per_element.py``).
    error_feedback: whether :func:`jaxcomp.compress` keeps the shared
      error-feedback residual by default.
    metric_keys: names of the counters :meth:`encode_with_metrics` and
      :meth:`extra_metrics` return.
    custom_exchange: the compressor runs its own exchange (several rounds of
      collectives, e.g. PowerSGD) through :meth:`exchange` instead of the
      default agree → encode → all_gather → aggregate.
    bucket_encode: the encoder is elementwise given per-tensor parameters, so
      a bucket of tensors is encoded, decoded and aggregated at once
      (:meth:`encode_bucket`, :class:`BucketCompressor`).
  """

  unbiased: ClassVar[bool] = False
  error_feedback: ClassVar[bool] = False
  metric_keys: ClassVar[tuple[str, ...]] = ()
  custom_exchange: ClassVar[bool] = False
  bucket_encode: ClassVar[bool] = False

  def __init_subclass__(cls, **kwargs):
    """Every subclass's own :meth:`decode` is shape-checked (:class:`DecodeShapeError`)."""
    super().__init_subclass__(**kwargs)
    if "decode" in vars(cls):
      cls.decode = _shape_checked(vars(cls)["decode"])

  # -- the protocol ---------------------------------------------------------

  def agree(self, x: jax.Array) -> Optional[Any]:
    """Statistics the workers agree on before encoding, by a maximum.

    :mod:`jaxcomp.parallel` reduces the returned pytree with ``lax.pmax`` over
    the worker axis and passes the result to :meth:`encode` as ``agreed``.
    TernGrad's scalar sharing (Eq. 4) is the example. ``None`` (the default)
    means no agreement round. With no worker axis, ``agreed`` is the local
    value.
    """
    del x
    return None

  def encode(self, x: jax.Array, key: jax.Array, agreed: Optional[Any]) -> Payload:
    raise NotImplementedError

  def decode(self, payload: Payload, shape: Shape) -> jax.Array:
    raise NotImplementedError

  def encode_with_metrics(
      self, x: jax.Array, key: jax.Array, agreed: Optional[Any]
  ) -> tuple[Payload, dict[str, jax.Array]]:
    """:meth:`encode`, plus counters only the encoder knows.

    Some counters cannot be read off the payload, e.g. how many selected
    entries did not fit into a fixed capacity. A compressor that reports such
    counters overrides this method (and lists the names in ``metric_keys``);
    the counters stay on this worker and never cross the wire. The default
    returns ``encode(x, key, agreed)`` and no counters.
    """
    return self.encode(x, key, agreed), {}

  def aggregate(self, gathered: Payload, shape: Shape) -> jax.Array:
    """The mean of all workers' decoded tensors.

    ``gathered`` is the Payload with a leading worker axis, as
    ``lax.all_gather`` returns it. The default decodes every payload and
    averages; compressors whose codes can be summed before scaling override
    this to decode once (e.g. TernGrad with a shared scalar).
    """
    decoded = jax.vmap(lambda p: self.decode(p, shape))(gathered)
    return sum_leading(decoded) / decoded.shape[0]

  def encoded_bytes(self, payload: Payload, shape: Shape) -> Optional[jax.Array]:
    """Exact size of a variable-length encoding of ``payload``, if any.

    Reported as ``encoded_bytes``, separately from ``bytes_on_wire`` (the
    static size of the payload arrays that the collective moves). ``None``
    when the payload is its own encoding.
    """
    del payload, shape
    return None

  def extra_metrics(self, payload: Payload, shape: Shape) -> dict[str, jax.Array]:
    """Per-tensor counters summed into the metrics (e.g. overflow, fallbacks)."""
    del payload, shape
    return {}

  def init_state(self, shape: Shape, key: jax.Array) -> Any:
    """Per-tensor state identical on every worker (e.g. PowerSGD's warm-start Q).

    ``None`` (the default) means none. Worker-specific state belongs in the
    shared error-feedback residual, not here.
    """
    del shape, key
    return None

  def exchange(self, x: jax.Array, key: jax.Array, axis_name: Any, state: Any) -> "Exchanged":
    """A whole exchange, for compressors with ``custom_exchange = True``.

    A generator that yields a :class:`Message` per collective round and
    returns an :class:`Exchanged`: the transport runs the rounds (fused with
    the other tensors' in a bucket) and counts their bytes. A round that runs
    only sometimes is a message with ``when``. ``axis_name`` may be ``None``
    (one worker): the messages are still yielded, delivered locally and
    counted as sent.
    """
    raise NotImplementedError

  def validate(self, shape: Shape, dtype: Any) -> None:
    """Raises a clear error if this compressor cannot handle such a tensor."""
    del shape, dtype

  # -- the two-phase exchange (jaxcomp.exchange.two_phase); each has a default -----------

  def chunk_block(self) -> Optional[int]:
    """Values that a chunk of the two-phase exchange keeps whole (QSGD: a bucket of norms), or ``None``."""
    return None

  def reduce_chunks(self, received: Payload, shape: Shape) -> jax.Array:
    """Phase 1's reduction of the ``N`` payloads of one chunk (leading worker axis).

    The default is :meth:`aggregate`, their decoded mean; signSGD sums exact
    integer votes instead.
    """
    return self.aggregate(received, shape)

  shard_compressor: ClassVar[Optional["Compressor"]] = None  # phase 2's codec of the shard; None: this one

  @property
  def plain_compressor(self) -> Optional["Compressor"]:
    """A fixed-size fallback wire where this one's may overflow (3LC's base-3^5 behind zero-run), or ``None``."""
    return None

  def fits(self, payload: Payload) -> jax.Array:
    """Whether a variable-length ``payload`` fit its buffer (read only where :attr:`plain_compressor` is set)."""
    del payload
    return jnp.bool_(True)

  # -- encoding a bucket at once (bucket_encode = True) -----------------------

  planes: ClassVar[int] = 1  # rows of the bucket's layout (jaxcomp.exchange.layout): the codec's planes

  def payload_struct(self, n: int) -> Payload:
    """The payload of a tensor of ``n`` values, as ``jax.ShapeDtypeStruct`` s (static)."""
    raise NotImplementedError

  def agree_bucket(self, xs: Sequence[jax.Array], layout: "layout_lib.Layout") -> Optional[Any]:
    """:meth:`agree` of every flat tensor of ``xs``, stacked (every leaf with one entry a tensor), or ``None``.

    A compressor whose agreement is a per-tensor statistic overrides this to
    reduce the whole bucket at once (and computes :meth:`agree` as a bucket
    of one, so both give the same bits).
    """
    agreed = [self.agree(x) for x in xs]  # all None, or all of one structure
    return None if agreed[0] is None else jax.tree.map(lambda *a: jnp.stack(a), *agreed)

  def encode_bucket(self, xs: Sequence[jax.Array], keys: Any, agreed: Optional[Any],
                    layout: "layout_lib.Layout") -> Payload:
    """:meth:`encode` of every flat tensor of ``xs`` at once.

    ``keys`` are their keys stacked (``[k, ...]``); ``agreed`` their
    agreements (:meth:`agree`) stacked, every leaf with a leading axis of one
    entry a tensor, or ``None``.

    Returns the bucket's payload: each array the tensors' own arrays
    (:meth:`payload_struct`) flattened and laid end to end, bit for bit what
    :meth:`encode` of each would return (:func:`jaxcomp.exchange.layout.payload_parts`
    cuts it). Per-tensor parameters are computed per tensor; the elementwise
    work runs once over ``layout`` (its ``planes`` rows are the codec's planes).
    """
    raise NotImplementedError

  def decode_bucket(self, payload: Payload, layout: "layout_lib.Layout") -> list[jax.Array]:
    """A bucket's payload decoded: every tensor flat, float32."""
    raise NotImplementedError

  def aggregate_bucket(self, gathered: Payload, layout: "layout_lib.Layout") -> list[jax.Array]:
    """The mean over workers of every tensor of a bucket, flat; ``gathered`` has a leading worker axis."""
    raise NotImplementedError

  def own_bucket(self, xs: Sequence[jax.Array], payload: Payload,
                 layout: "layout_lib.Layout") -> Optional[list[jax.Array]]:
    """What each tensor's own part of ``payload`` decodes to (flat), from the tensors ``xs``, or ``None``.

    Error feedback needs it. ``None`` (the default): each tensor's part is
    decoded (:meth:`decode`). A compressor whose decode is the quantizer's exact
    output (3LC's ``round(x/m)·m``) computes it from ``x`` instead: a loop a
    tensor over floats, without unpacking bytes. It must equal :meth:`decode`
    of the tensor's part bit for bit.
    """
    del xs, payload, layout
    return None

  def encoded_bytes_bucket(self, payload: Payload, layout: "layout_lib.Layout") -> Optional[jax.Array]:
    """Every tensor's :meth:`encoded_bytes` of a bucket's payload at once (a vector), or ``None``.

    ``None`` (the default): :meth:`encoded_bytes` of each tensor's part.
    """
    del payload, layout
    return None


@dataclasses.dataclass(frozen=True)
class BucketCompressor(Compressor):
  """A compressor that encodes a bucket at once: its per-tensor protocol is a bucket of one.

  A subclass implements :meth:`~Compressor.payload_struct`,
  :meth:`~Compressor.encode_bucket` and :meth:`decode_planes` (and may
  override :meth:`aggregate_columns`), or, for a layout of its own,
  :meth:`~Compressor.decode_bucket` and :meth:`~Compressor.aggregate_bucket`; :meth:`encode`,
  :meth:`decode` and :meth:`aggregate` run them on one tensor, so a tensor
  encoded alone and in a bucket gives the same bytes by construction.
  """

  bucket_encode = True

  def decode_bucket(self, payload, layout):
    return layout.split(self.decode_columns(payload, layout))

  def aggregate_bucket(self, gathered, layout):
    return layout.split(self.aggregate_columns(gathered, layout))

  def decode_planes(self, payload: Payload, layout: "layout_lib.Layout") -> list[jax.Array]:
    """A bucket's payload decoded plane by plane: ``layout.planes`` float32 arrays ``(chunks, CHUNK)``.

    Plane by plane because XLA:CPU vectorizes each plane's decode, but not one
    loop over the planes stacked (docs/design.md, "Choices in the code").
    """
    raise NotImplementedError

  def decode_columns(self, payload: Payload, layout: "layout_lib.Layout") -> jax.Array:
    """A bucket's payload decoded in its layout: float32 ``(planes, chunks, CHUNK)``."""
    return jnp.stack(self.decode_planes(payload, layout))

  def aggregate_columns(self, gathered: Payload, layout: "layout_lib.Layout") -> jax.Array:
    """The mean of every worker's decoded bucket in its layout; ``gathered`` has a leading worker axis."""
    planes = jax.vmap(lambda p: self.decode_planes(p, layout))(gathered)
    return jnp.stack([sum_leading(p) / p.shape[0] for p in planes])

  def encode(self, x, key, agreed):
    n = size_of(x.shape)
    one = None if agreed is None else jax.tree.map(lambda a: jnp.asarray(a)[None], agreed)
    keys = None if key is None else jnp.asarray(key)[None]  # deterministic encoders may be given no key
    payload = self.encode_bucket([x.reshape(-1)], keys, one, layout_lib.Layout([n], self.planes))
    return layout_lib.payload_parts(payload, [self.payload_struct(n)])[0]

  def _one(self, payload, shape, lead):
    layout = layout_lib.Layout([size_of(shape)], self.planes)
    return layout, layout_lib.joined_payload([payload], lead)

  def decode(self, payload, shape):
    layout, joined = self._one(payload, shape, 0)
    return self.decode_bucket(joined, layout)[0].reshape(shape)

  def aggregate(self, gathered, shape):
    layout, joined = self._one(gathered, shape, 1)
    return self.aggregate_bucket(joined, layout)[0].reshape(shape)


class Message(NamedTuple):
  """One collective an exchange asks for: what it sends and how the workers combine it.

  Exchanges are written as generators that ``yield`` messages and receive the
  collective's result back (``gathered = yield Message("gather", payload)``);
  the transport (:func:`jaxcomp.exchange.transport.run`, one tensor at a time,
  or :func:`jaxcomp.exchange.buckets.run`, a bucket's tensors in lockstep with
  one fused collective per kind) decides how they travel and counts their
  bytes. The result is the same either way, bit for bit: every kind acts
  element by element.

  Kinds:
    ``"gather"``: every array with a new leading worker axis (``all_gather``);
    ``"max"``, ``"sum"``, ``"mean"``: the elementwise reduction over workers;
    ``"all_to_all"``: arrays whose leading axis (of size N) is indexed by
    destination come back indexed by source.
  """

  kind: str
  tree: Any
  # A boolean the same on every worker: the collective runs, and its bytes count, only where it
  # holds (a fallback round inside a lax.cond). None: always.
  when: Optional[Any] = None
  # The exact bytes of a variable-length encoding of ``tree`` (an int, integer array or Count), counted
  # as ``encoded_bytes`` instead of its arrays' size; None: the arrays are their own encoding.
  encoded: Optional[Any] = None
  # The axes the collective runs over, part of the exchange's own: one hop of a hierarchical route
  # (jaxcomp.exchange.scatter.two_hop_steps: within a host, then across hosts). None: the exchange's.
  over: Optional[Any] = None


MESSAGE_KINDS = ("gather", "max", "sum", "mean", "all_to_all")


class Exchanged(NamedTuple):
  """What the exchange of one tensor returns (the default one and custom ones alike)."""

  mean: jax.Array  # float32, the average over workers of the decoded tensors
  own: Optional[jax.Array]  # float32, what this worker's own message decodes to (error feedback), or None if not asked for
  payload: Payload  # this worker's message, for extra_metrics and tensor_metrics (its bytes: the transport counts them)
  state: Any  # the new per-tensor state (Compressor.init_state), None if none
  metrics: Optional[dict[str, jax.Array]] = None  # counters as encode_with_metrics returns them


class WorkerLocal(NamedTuple):
  """The part of an optimizer state that differs between workers.

  Under ``vmap``/``pmap``/``shard_map`` these leaves carry a leading worker
  axis (see :func:`jaxcomp.parallel.worker_axes`); everything else in the
  optimizer state is identical on every worker.
  """

  residual: Any  # params-shaped; optax.MaskedNode() where there is none
  metrics: dict[str, Count]  # this worker's counters of the last update (see jaxcomp.metrics)


class LaidOut(WorkerLocal):
  """A :class:`WorkerLocal` laid out over the workers (:func:`jaxcomp.parallel.replicate_workers`).

  The mark is the type, a static part of the state's pytree structure: it
  passes through ``pmap``, ``vmap``, ``shard_map``, ``jit`` and checkpoints
  restored with the state's structure, and every update keeps it
  (``state.local._replace(...)``). Under ``pmap`` a value's type does not say
  whether it differs between workers, so this mark is how an update tells a
  state laid out over the devices from one passed in whole to each
  (:func:`jaxcomp.worker_layout.check_laid_out`).
  """

  __slots__ = ()


class ShardLocal(LaidOut):
  """A :class:`WorkerLocal` whose rows are laid out already: each worker's shard of a state.

  The inner optimizer's state under :func:`jaxcomp.shard_optimizer` is each
  worker's own shard (its moments for its chunk of every parameter), made
  per worker at ``init``. It is laid over workers as any worker-local part
  (:func:`jaxcomp.parallel.worker_axes`, ``worker_specs``, ``worker_slice``),
  but :func:`jaxcomp.parallel.replicate_workers` leaves it as it is: its
  leading axis is the workers already, each row different (so it is laid
  out by construction: a :class:`LaidOut`).
  """

  __slots__ = ()


def worker_locals(tree: Any) -> list[WorkerLocal]:
  """Every :class:`WorkerLocal` in an optimizer state (a chain, ``masked`` or nested states)."""
  return [x for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, WorkerLocal))
          if isinstance(x, WorkerLocal)]
