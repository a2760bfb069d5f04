"""ZeRO++'s block quantizers: int8 or int4 codes with one max-abs scale per block of values.

ZeRO++ (Wang et al., arXiv:2306.10209) sends the weights' all-gather in int8 (qwZ, §3.1) and
the gradients' reduce-scatter in int4 (qgZ, §3.3) with *block-based* quantization: the tensor is
cut into blocks and each block is quantized with its own scale, so that one large value costs
precision only within its block (§3.1). Per tensor, on
every worker (``x = g + r`` with the shared error feedback of :func:`jaxcomp.compress`):

1. ``x`` flattened in C order is cut into blocks of ``block`` consecutive values (the last one
   partial);
2. per block ``B``: ``L = 2^(bits−1) − 1`` (127 or 7), ``scale_B = max_{i∈B}|x_i| / L``
   (symmetric, max-abs) and ``q_i = round(x_i / scale_B) ∈ [−L, L]``, rounded to nearest,
   half to even (deterministic, as the paper; computed as ``(x_i / max|x_B|) · L``, finite for
   any finite block, and clipped);
3. decoded as ``q_i · scale_B``, so ``|x_i − q_i·scale_B| ≤ scale_B / 2``; the residual keeps
   the difference.

The wire, per tensor of ``n`` values: the codes, ``int8[n]`` for ``bits=8`` or, for
``bits=4``, 4-bit two's-complement nibbles packed two a byte by
:func:`jaxcomp.codecs.bits.pack_uint` (``uint8[⌈n/2⌉]``), and one float32 scale per block
(``float32[⌈n/block⌉]``, the dtype of DeepSpeed's stored scales): ``⌈n·bits/8⌉ + 4·⌈n/block⌉``
bytes.

Decisions (tested in ``tests/test_blockint.py``):

* **Symmetric levels; −2^(bits−1) is never sent.** DeepSpeed's kernels
  (``csrc/includes/quantization_utils.h``, symmetric ``Params``) scale by ``2^bits / (2·max)``
  and clip to ``[−2^(bits−1), 2^(bits−1) − 1]``: ``−max`` becomes ``−8`` (int4) but ``+max``
  saturates at ``+7``, an error of a whole step for the block's largest positive value. Here the
  grid is ``[−L, L]`` (int4: ``[−7, 7]``, 15 levels; int8: ``[−127, 127]`` as :class:`Int8`), so
  both ``±max`` are on it (``±L`` steps) and every value is within half a step; the one code left
  unused costs ``log2(16/15)`` of 4 bits.
* **The block.** DeepSpeed sizes blocks per tensor: its weight quantizer (``CUDAQuantizer`` in
  ``deepspeed/runtime/zero/partition_parameters.py``) aims at blocks under 8,000 values ("the
  optimal size is 4k") that divide the tensor, its gradient quantizer
  (``all_to_all_quant_reduce`` in ``deepspeed/runtime/comm/coalesced_collectives.py``) takes one
  block per row of a 2-D gradient (``max(rows, columns, world size)`` groups). The paper gives no
  number. A fixed size keeps the payload's shape static; the default, :data:`BLOCK` = 2,560, lies
  in the range of both (qgZ's block for a GPT 2,560 wide) and is the cut of
  :func:`jaxcomp.shard_optimizer`'s default ``align``, so its chunks hold whole blocks; its scale
  costs 32/2,560 = 0.0125 bits a value.
* **Chunks of whole blocks**: the two-phase exchange and the sharded optimizer's reduce-scatter
  cut tensors into chunks of a multiple of the block (:meth:`BlockInt.chunk_block`), so a chunk
  is quantized block for block as the whole tensor would be.
* **Error feedback on by default** (the gradients' use, as :class:`Int8`);
  ``error_feedback=False`` sends ``g`` itself (the weights' use: qwZ needs none, the master
  copy is exact).
* **Range.** The bound holds while ``scale_B`` and ``1/max|x_B|`` are normal floats
  (``max|x_B|`` from about ``1e−36`` to ``8e37``; tested from ``1e−30`` to ``1e30``): XLA flushes
  subnormals to zero, so a block beyond may decode to zeros, never to NaN.
* A block of zeros has ``scale = 0`` and decodes to zeros; no cross-worker agreement (each worker
  sends its own scales), and the aggregate is the mean of the workers' decoded tensors.

References:
  Wang, Qin, Jacobs, Holmes, Rajbhandari, Ruwase, Yan, Yang, He. *ZeRO++: Extremely Efficient
  Collective Communication for Giant Model Training*. arXiv:2306.10209, §3.1 (qwZ: block-based
  int8 quantization of the weights' all-gather), §3.3 (qgZ: block-based int4 quantization of the
  gradients, all-to-all reduce-scatter).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import transforms
from jaxcomp.codecs import bits as bits_lib
from jaxcomp.compressors._quant import max_abs

BLOCK = 2560
"""Values per scale by default (see the module docstring, "The block")."""

BITS = (4, 8)


class BlockIntPayload(NamedTuple):
  codes: jax.Array  # int8[n] (bits=8), or uint8[ceil(n/2)]: two's-complement nibbles (bits=4)
  scales: jax.Array  # float32[ceil(n/block)]: each block's max|x| / L


def _blocks(flat: jax.Array, block: int) -> jax.Array:
  """``flat`` zero padded to whole blocks, one block a row: ``(⌈n/block⌉, block)``."""
  rows = -(-flat.shape[0] // block)
  return jnp.pad(flat, (0, rows * block - flat.shape[0])).reshape(rows, block)


@dataclasses.dataclass(frozen=True)
class BlockInt(core.Compressor):
  """Block-based symmetric int8/int4 quantization (ZeRO++'s qwZ/qgZ; see the module docstring).

  Attributes:
    bits: 8 (qwZ's weights) or 4 (qgZ's gradients): bits per value on the wire.
    block: values per float32 scale (default :data:`BLOCK`).
  """

  bits: int = 8
  block: int = BLOCK

  error_feedback = True

  def __post_init__(self):
    if self.bits not in BITS or isinstance(self.bits, bool):
      raise ValueError(f"bits must be 4 or 8; got {self.bits!r}.")
    if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
      raise ValueError(f"block must be an int >= 1; got {self.block!r}.")

  @property
  def levels(self) -> int:
    """``L = 2^(bits−1) − 1``: codes lie in ``[−L, L]``."""
    return 2 ** (self.bits - 1) - 1

  def chunk_block(self) -> Optional[int]:
    """The two-phase exchange's chunks hold whole blocks (each with its scale)."""
    return self.block

  def encode(self, x, key, agreed):
    del key, agreed
    flat = x.reshape(-1).astype(jnp.float32)
    rows = _blocks(flat, self.block)
    tops = max_abs(rows, axis=1)
    ratio = rows / jnp.where(tops > 0, tops, 1.0)[:, None]  # in [-1, 1], also for subnormal maxima
    q = jnp.clip(jnp.round(ratio * self.levels), -self.levels, self.levels)
    codes = q.reshape(-1)[:flat.shape[0]].astype(jnp.int8)
    return BlockIntPayload(codes=self._pack(codes), scales=(tops / self.levels).astype(jnp.float32))

  def decode(self, payload, shape):
    n = core.size_of(shape)
    q = _blocks(self._unpack(payload.codes, n).astype(jnp.float32), self.block)
    return (q * payload.scales[:, None]).reshape(-1)[:n].reshape(shape)

  def _pack(self, codes: jax.Array) -> jax.Array:
    """int8 codes as the wire holds them: themselves, or (4 bits) their nibbles packed two a byte."""
    if self.bits == 8:
      return codes
    return bits_lib.pack_uint(codes.astype(jnp.uint8) & jnp.uint8(0xF), 4)

  def _unpack(self, codes: jax.Array, n: int) -> jax.Array:
    """The inverse of :meth:`_pack`: ``n`` signed codes (int8 or int32)."""
    if self.bits == 8:
      return codes
    nibbles = bits_lib.unpack_uint(codes, 4, n).astype(jnp.int32)
    return (nibbles ^ 8) - 8  # the 4-bit two's complement, sign extended


@hyperparams.factory(bits="the bits per value on the wire", block="the number of scales on the wire")
def blockint(bits: int = 8, block: int = BLOCK, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """ZeRO++'s block quantization (arXiv:2306.10209, §3.1 and §3.3) as an optax transform.

  Example::

    # qgZ's 4-bit gradients through a reduce-scatter, qwZ's int8 for the updates' all-gather:
    tx = jaxcomp.shard_optimizer(optax.chain(jaxcomp.blockint(bits=4, axis_name="workers"),
                                             optax.adamw(1e-3)),
                                 axis_name="workers", num_workers=8, gather=jaxcomp.BlockInt(bits=8))

  Args:
    bits: 8 or 4 bits per value (codes in ``[−127, 127]`` or ``[−7, 7]``).
    block: values per float32 scale (default 2,560).
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``, ``min_size``,
      ``seed``, ``nonfinite``, ``exchange``, ``error_feedback``: on by default).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(BlockInt(bits=bits, block=block), **kwargs)
