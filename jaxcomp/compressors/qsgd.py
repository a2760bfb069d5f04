"""QSGD: stochastic quantization over buckets (Alistarh et al., NeurIPS 2017).

Per tensor, flattened in C order and cut into buckets of ``d = bucket_size``
consecutive values (§4 "bucketing"; the last bucket is padded with zeros, which
are never sent), each bucket ``v`` is quantized independently (Eq. 4):

    Q_s(v_i) = ‖v‖ · sgn(v_i) · ξ_i,   ξ_i ∈ {ℓ/s, (ℓ+1)/s},
    P[ξ_i = (ℓ+1)/s] = s·|v_i|/‖v‖ − ℓ,   ℓ = floor(s·|v_i|/‖v‖),

so ``E[Q_s(v)] = v`` (Lemma 3.1 (i)). ``‖v‖`` is the bucket's max-norm
(``norm="max"``, what the paper's experiments use, §4–5) or its L2 norm
(``norm="l2"``, the analysed Eq. 4).

Levels and bits. ``levels`` is ``s``: a value is sent as ``sign · ℓ/s · ‖v‖``
with ``ℓ ∈ {0, …, s}``, i.e. one of ``2s + 1`` signed levels. On the wire each
value is the offset code ``c = sign·ℓ + s ∈ [0, 2s]`` in
``b = ceil(log2(2s + 1))`` bits, packed densely (:mod:`jaxcomp.codecs.bits`),
plus one float32 norm per bucket. The paper's "2-bit", "4-bit" and "8-bit"
QSGD count bits per value *including the sign* (§5: "32 bits to 2 bits per
dimension"), so ``b`` bits carry at most ``s = 2**(b-1) − 1`` levels
(:func:`levels_for_bits`): 2-bit ⇒ s = 1 (ternary), 4-bit ⇒ s = 7, 8-bit ⇒
s = 127. (The example in §4, "bucket size of 512, and 4 bits, … √512/2⁴",
plugs ``s = 2⁴`` into the bound, i.e. counts the sign separately; with the
sign that would be 6 bits per value here, ``levels=16``. We follow the
bits-on-the-wire reading and say so.) The default is 4-bit, ``s = 7``, with
``d = 512`` (§5).

Variance (Lemma 3.1 (ii), tested in ``tests/test_quantizers.py``): per
bucket of ``d`` values,

* L2 norm: ``E‖Q(v) − v‖² ≤ min(d/s², √d/s) · ‖v‖₂²`` (the paper's bound);
* max norm (derived here): element ``i`` has variance
  ``(M/s)² · p_i(1 − p_i)`` with ``M = max|v|`` and ``p_i`` the fractional part
  of ``s|v_i|/M``; ``p(1−p) ≤ min(1/4, s|v_i|/M)`` gives
  ``E‖Q(v) − v‖² ≤ min(d·M²/(4s²), M‖v‖₁/s) ≤ min(d/(4s²), √d/s) · ‖v‖₂²``
  (using ``M ≤ ‖v‖₂`` and ``‖v‖₁ ≤ √d‖v‖₂``).

Decisions where the paper is silent (tested in ``tests/test_quantizers.py``):

* ``sgn(0) = +1`` as in §3, which does not matter: a zero value has ``ℓ = 0``
  and is sent as code ``s`` (zero).
* A bucket whose norm is 0 (all zeros, incl. the padding-only part) decodes
  to zeros; no 0/0.
* Stochastic rounding is ``ℓ = floor(s·|v_i|/M + u_i)`` with one uniform
  ``u_i ∈ [0, 1)`` per value (:mod:`jaxcomp.rng`), clamped to ``s`` so that a
  float rounding of ``s·|v_i|/M`` just above ``s`` cannot leave the code
  range; the element with ``|v_i| = M`` is therefore sent exactly.
* Tensors below 10K elements are kept in float in §5: that is the transform's
  ``min_size`` (pass ``min_size=10_000``), not a default here.
* No error feedback (QSGD is unbiased); no cross-worker agreement (each
  worker sends its own norms); the aggregate decodes every worker's payload
  and averages.

References:
  Alistarh, Grubic, Li, Tomioka, Vojnovic. *QSGD: Communication-Efficient SGD
  via Gradient Quantization and Encoding*. NeurIPS 2017. Eq. 4, Lemma 3.1,
  §4 (bucketing, max-norm), §5 (bits and bucket sizes). arXiv:1610.02132.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax import lax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp.exchange import layout as layout_lib
from jaxcomp import rng
from jaxcomp import transforms
from jaxcomp.codecs import bits
from jaxcomp.compressors._quant import safe_reciprocal

Norm = Literal["max", "l2"]


class QSGDPayload(NamedTuple):
  codes: jax.Array  # uint8[ceil(n*b/8)]: offset codes sign·ℓ + s, b bits each
  norms: jax.Array  # float32[ceil(n/d)]: each bucket's norm


def levels_for_bits(bits_per_value: int) -> int:
  """The number of levels ``s`` that ``bits_per_value`` bits (sign included) carry.

  ``s = 2**(b-1) − 1``: 2 ⇒ 1, 3 ⇒ 3, 4 ⇒ 7, 8 ⇒ 127.
  """
  if isinstance(bits_per_value, bool) or not isinstance(bits_per_value, int) or not 2 <= bits_per_value <= 16:
    raise ValueError(f"bits per value must be an int in [2, 16]; got {bits_per_value!r}.")
  return 2 ** (bits_per_value - 1) - 1


def code_width(levels: int) -> int:
  """Bits per value on the wire for ``s`` levels: ``ceil(log2(2s + 1))``."""
  return max(1, math.ceil(math.log2(2 * levels + 1)))


@dataclasses.dataclass(frozen=True)
class QSGD(core.BucketCompressor):
  """QSGD's per-tensor compressor (see the module docstring).

  With the max norm, when every full bucket of ``d`` values is packed by
  itself (``d·b`` a multiple of 8, e.g. the default ``d = 512``), a bucket of tensors is
  quantized at once (``bucket_encode``): the full QSGD buckets of all its
  tensors as the rows of one ``(rows, d)`` array (each row's norm its own, the
  uniforms drawn by each value's index within its tensor), and the partial
  last buckets of one length likewise.

  Attributes:
    levels: ``s``, the number of quantization levels (>= 1).
    bucket_size: ``d``, values per bucket; ``None`` quantizes the whole tensor
      as one bucket (the analysed form of §3).
    norm: ``"max"`` (§4, the experiments) or ``"l2"`` (Eq. 4).
    rng: ``"hash"`` (fast counter-based) or ``"threefry"`` uniforms.
  """

  levels: int = 7
  bucket_size: Optional[int] = 512
  norm: Norm = "max"
  rng: rng.RngImpl = "hash"

  unbiased = True

  def __post_init__(self):
    if isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 1:
      raise ValueError(f"levels must be an int >= 1; got {self.levels!r}.")
    if code_width(self.levels) > bits.MAX_WIDTH:
      raise ValueError(f"levels={self.levels} needs more than {bits.MAX_WIDTH} bits per value.")
    if self.bucket_size is not None and (
        isinstance(self.bucket_size, bool) or not isinstance(self.bucket_size, int) or self.bucket_size < 1
    ):
      raise ValueError(f"bucket_size must be an int >= 1 or None; got {self.bucket_size!r}.")
    if self.norm not in ("max", "l2"):
      raise ValueError(f"norm must be 'max' or 'l2'; got {self.norm!r}.")
    rng.check_impl(self.rng)

  @property
  def width(self) -> int:
    return code_width(self.levels)

  def chunk_block(self) -> Optional[int]:
    """The two-phase exchange's chunks hold whole buckets (each with its norm)."""
    return self.bucket_size

  def _split(self, n: int) -> tuple[int, int, int]:
    """``(d, full buckets, values in the last, partial bucket)`` for ``n`` values."""
    d = max(1, n) if self.bucket_size is None else self.bucket_size
    return d, n // d, n % d

  def _quantize(self, v: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Offset codes and norms of the rows (buckets) of ``v``; ``u`` uniforms of its shape."""
    a = jnp.abs(v)
    norms = jnp.max(a, axis=1)
    if self.norm == "l2":  # scaled by the max so that squares cannot overflow
      w = a * safe_reciprocal(norms)[:, None]
      norms = norms * jnp.sqrt(jnp.sum(w * w, axis=1))
    s = self.levels
    level = jnp.minimum(jnp.floor(a * (s * safe_reciprocal(norms))[:, None] + u), s)
    code = jnp.where(v < 0, s - level, s + level)
    return code.astype(jnp.uint8 if self.width <= 8 else jnp.uint32), norms.astype(jnp.float32)

  def _per_bucket(self, d: int) -> bool:
    # Full buckets are packed one per row when a bucket is a whole number of bytes.
    return (d * self.width) % 8 == 0

  @property
  def bucket_encode(self) -> bool:  # type: ignore[override]
    # The L2 norm is a float sum per row, which XLA:CPU adds in another order in a taller array:
    # with norm="l2" each tensor is quantized alone. (A maximum is exact in any order.)
    return self.norm == "max" and self.bucket_size is not None and self._per_bucket(self.bucket_size)

  def payload_struct(self, n):
    d, full, rest = self._split(n)
    return QSGDPayload(codes=jax.ShapeDtypeStruct((bits.packed_size(n, self.width),), jnp.uint8),
                       norms=jax.ShapeDtypeStruct((full + (rest > 0),), jnp.float32))

  def encode_bucket(self, xs, keys, agreed, layout):
    """Eq. 4 over a bucket of tensors: all their full QSGD buckets as the rows of one array, at once.

    Row ``r`` (bucket ``j`` of tensor ``i``) draws the uniforms of values
    ``j·d … (j+1)·d − 1`` of tensor ``i``; its norm is its own maximum (exact in
    any order). The tensors' partial last buckets are quantized likewise, the
    ones of one length as the rows of one array (:meth:`_partial_groups`: a
    model's many biases share a few lengths), so the program does not grow
    with the bucket's tensors. The payload is every tensor's codes (its full
    rows packed one by one, then its partial last bucket) and norms, tensor
    after tensor.
    """
    del agreed
    d = self.bucket_size
    split = [self._split(n) for n in layout.sizes]
    codes, norms = [[] for _ in xs], [[] for _ in xs]
    full_of = [i for i, (_, full, _) in enumerate(split) if full]
    if full_of:
      counts = [split[i][1] for i in full_of]
      rows = [xs[i][:c * d].reshape(c, d) for i, c in zip(full_of, counts)]
      packed, m = self._quantized_rows(keys, rows, full_of, [0] * len(full_of), layout.sizes, single=len(xs) == 1)
      lo = 0
      for i, count in zip(full_of, counts):
        codes[i].append(packed[lo:lo + count].reshape(-1))
        norms[i].append(m[lo:lo + count])
        lo += count
    for rest, group in self._partial_groups(layout.sizes):
      rows = [xs[i][split[i][1] * d:][None, :] for i in group]
      packed, m = self._quantized_rows(keys, rows, group, [split[i][1] * d for i in group], layout.sizes,
                                        single=len(group) == 1)
      for t, i in enumerate(group):
        codes[i].append(packed[t])
        norms[i].append(m[t:t + 1])
    return QSGDPayload(codes=_concat([a for c in codes for a in c], jnp.uint8),
                       norms=_concat([a for m in norms for a in m], jnp.float32))

  def _partial_groups(self, sizes) -> list[tuple[int, list[int]]]:
    """The tensors with a partial last bucket, grouped by its length: ``[(length, [tensor, ...]), ...]``."""
    groups = {}
    for i, n in enumerate(sizes):
      rest = self._split(n)[2]
      if rest:
        groups.setdefault(rest, []).append(i)
    return sorted(groups.items())

  def _quantized_rows(self, keys, rows, tensors, starts, sizes, single):
    """Rows of one width quantized and packed row by row at once: ``(packed bytes (rows, ·), norms (rows,))``.

    ``rows[t]`` is ``(count, width)`` of tensor ``tensors[t]`` (of ``sizes[·]``
    values) from its value ``starts[t]``, each row drawing the uniforms of its
    values' indices within the tensor (as the tensor alone). ``single``: the
    packed rows are read by one consumer (otherwise computed once into their
    own buffer, not once a tensor inside its slice).
    """
    counts = [r.shape[0] for r in rows]
    v = rows[0] if len(rows) == 1 else jnp.concatenate(rows)
    if self.rng == "hash":
      u = self._row_uniforms(keys, counts, tensors, starts, v.shape)
    else:
      u = jnp.concatenate([rng.uniform(keys[i], sizes[i], self.rng)[s:s + c * v.shape[1]].reshape(c, -1)
                           for i, s, c in zip(tensors, starts, counts)])
    c, m = self._quantize(v, u)
    packed = jax.vmap(lambda r: bits.pack_uint(r, self.width))(c)
    return (packed if single else layout_lib.materialize(packed)), m

  def _row_uniforms(self, keys, counts, tensors, starts, shape):
    """The hash's uniforms of stacked rows: ``counts[t]`` rows of tensor ``tensors[t]`` from its value ``starts[t]``.

    Each row's tensor and first index come from tables of one value a group of
    rows (:func:`~jaxcomp.exchange.layout.segment_ids`): no constant or
    operation a row.
    """
    seeds = rng.hash_seeds(keys)
    rows, width = shape
    group = layout_lib.segment_ids(counts)
    first_row = np.concatenate([[0], np.cumsum(counts[:-1], dtype=np.int64)])
    table = lambda values: jnp.asarray(np.asarray(values, np.int64).astype(np.uint32))[group]
    base = table(starts) + (lax.iota(jnp.uint32, rows) - table(first_row)) * np.uint32(width)
    ids = jnp.asarray(np.asarray(tensors, np.int32))[group]
    index = base[:, None] + lax.broadcasted_iota(jnp.uint32, shape, 1)
    return rng.hash_to_uniform(rng.hash_bits24_at(index, seeds[ids, 0][:, None], seeds[ids, 1][:, None]))

  def decode_bucket(self, payload, layout):
    return self._rows_decoded(payload, layout, lead=0)

  def aggregate_bucket(self, gathered, layout):
    return [core.sum_leading(a) / a.shape[0] for a in self._rows_decoded(gathered, layout, lead=1)]

  def _rows_decoded(self, payload, layout, lead: int):
    """Every tensor decoded (after ``lead`` worker axes): the full rows of all at once, then the partial buckets by length."""
    d = self.bucket_size
    head = payload.codes.shape[:lead]
    split = [self._split(n) for n in layout.sizes]
    parts = layout_lib.payload_parts(payload, [self.payload_struct(n) for n in layout.sizes], lead)
    full_of = [i for i, (_, full, _) in enumerate(split) if full]
    out = [[] for _ in split]
    if full_of:
      cut = lambda i: split[i][1] * d * self.width // 8
      packed = jnp.concatenate([parts[i].codes[..., :cut(i)].reshape(head + (split[i][1], -1)) for i in full_of],
                               axis=lead)
      norms = jnp.concatenate([parts[i].norms[..., :split[i][1]] for i in full_of], axis=lead)
      values = self._dequantized_rows(packed, norms, d)
      lo = 0
      for i in full_of:
        out[i].append(values[..., lo:lo + split[i][1], :].reshape(head + (-1,)))
        lo += split[i][1]
    for rest, group in self._partial_groups(layout.sizes):
      packed = jnp.stack([parts[i].codes[..., split[i][1] * d * self.width // 8:] for i in group], axis=lead)
      norms = jnp.stack([parts[i].norms[..., split[i][1]] for i in group], axis=lead)
      values = self._dequantized_rows(packed, norms, rest)
      for t, i in enumerate(group):
        out[i].append(values[..., t, :])
    return [o[0] if len(o) == 1 else jnp.concatenate(o, axis=-1) for o in out]

  def _dequantized_rows(self, packed, norms, width):
    """Rows of ``width`` values from their packed codes ``(..., rows, bytes)`` and norms ``(..., rows)``."""
    s, w = self.levels, self.width
    rows = jax.vmap(lambda r: bits.unpack_uint(r, w, width))(packed.reshape((-1,) + packed.shape[-1:]))
    rows = rows.reshape(packed.shape[:-1] + (width,))
    return (rows.astype(jnp.int32) - s).astype(jnp.float32) * (norms / s)[..., None]

  def encode(self, x, key, agreed):
    return super().encode(x, key, agreed) if self.bucket_encode else self._encode_whole(x, key)

  def decode(self, payload, shape):
    return super().decode(payload, shape) if self.bucket_encode else self._decode_whole(payload, shape)

  def aggregate(self, gathered, shape):
    return super().aggregate(gathered, shape) if self.bucket_encode else core.Compressor.aggregate(self, gathered, shape)

  def _encode_whole(self, x, key):
    """Codes of the full buckets (one packed row each), then of the partial last bucket.

    With ``d·b`` a multiple of 8 (any ``d`` divisible by 8) every full bucket
    is packed by itself (:func:`jaxcomp.codecs.bits.pack_uint`, so bucket
    ``i`` is bytes ``[i·d·b/8, (i+1)·d·b/8)``) and the last, partial bucket
    follows; otherwise all codes are packed as one array. Either way the codes
    take exactly ``ceil(n·b/8)`` bytes. Computing the full buckets as a
    ``(buckets, d)`` array and the partial one apart keeps padding and
    per-element gathers out of XLA's fused loops (several times faster on CPU).
    """
    n = x.size
    d, full, rest = self._split(n)
    flat = x.reshape(-1)
    u = rng.uniform(key, n, self.rng)
    codes, norms = [], []
    if full:
      c, m = self._quantize(flat[: full * d].reshape(full, d), u[: full * d].reshape(full, d))
      codes.append(c)
      norms.append(m)
    if rest:
      c, m = self._quantize(flat[full * d:][None, :], u[full * d:][None, :])
      codes.append(c)
      norms.append(m)
    if self._per_bucket(d):
      packed = [jax.vmap(lambda r: bits.pack_uint(r, self.width))(c).reshape(-1) for c in codes]
    else:
      packed = [bits.pack_uint(jnp.concatenate([c.reshape(-1) for c in codes]), self.width)]
    return QSGDPayload(codes=_concat(packed, jnp.uint8), norms=_concat(norms, jnp.float32))

  def _decode_whole(self, payload, shape):
    n = core.size_of(shape)
    d, full, rest = self._split(n)
    s, w = self.levels, self.width
    if self._per_bucket(d):
      cut = full * d * w // 8
      rows = []
      if full:
        rows.append(jax.vmap(lambda r: bits.unpack_uint(r, w, d))(payload.codes[:cut].reshape(full, -1)))
      if rest:
        rows.append(bits.unpack_uint(payload.codes[cut:], w, rest)[None, :])
    else:
      flat = bits.unpack_uint(payload.codes, w, n)
      rows = ([flat[: full * d].reshape(full, d)] if full else []) + ([flat[full * d:][None, :]] if rest else [])
    scale = payload.norms / s
    out = []
    if full:
      out.append(((rows[0].astype(jnp.int32) - s).astype(jnp.float32) * scale[:full, None]).reshape(-1))
    if rest:
      out.append((rows[-1].astype(jnp.int32) - s).astype(jnp.float32).reshape(-1) * scale[full])
    return _concat(out, jnp.float32).reshape(shape)


def _concat(parts: list, dtype) -> jax.Array:
  if not parts:
    return jnp.zeros((0,), dtype)
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


@hyperparams.factory(levels="the bits per value on the wire", bucket_size="the number of norms on the wire",
                    bits_per_value="the bits per value on the wire")
def qsgd(
    levels: Optional[int] = None,
    bucket_size: Optional[int] = 512,
    norm: Norm = "max",
    *,
    bits_per_value: Optional[int] = None,
    rng: rng.RngImpl = "hash",
    **kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """QSGD as an optax transform.

  Example::

    # 4-bit QSGD (s = 7) with buckets of 512, tensors under 10K elements in float (§5):
    tx = optax.chain(jaxcomp.qsgd(bits_per_value=4, min_size=10_000, axis_name="workers"),
                     optax.sgd(0.1))

  Args:
    levels: ``s``, the number of quantization levels; values are sent as
      ``sign · ℓ/s · ‖v‖``, ``ℓ ∈ {0..s}``, in ``ceil(log2(2s+1))`` bits.
    bucket_size: ``d`` (§4); ``None`` for one bucket per tensor.
    norm: ``"max"`` (default, §4–5) or ``"l2"`` (Eq. 4).
    bits_per_value: alternatively, the paper's "b-bit" QSGD, sign included:
      ``levels = 2**(b-1) − 1`` (:func:`levels_for_bits`). Give ``levels`` or
      ``bits_per_value``, not both; neither means 4-bit (``levels = 7``).
    rng: uniform generator, ``"hash"`` or ``"threefry"``.
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: off by default).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  if levels is not None and bits_per_value is not None:
    raise ValueError("Give either levels or bits_per_value, not both.")
  if levels is None:
    levels = levels_for_bits(4 if bits_per_value is None else bits_per_value)
  return transforms.compress(QSGD(levels=levels, bucket_size=bucket_size, norm=norm, rng=rng), **kwargs)
