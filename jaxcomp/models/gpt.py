"""A GPT-style decoder-only Transformer (GPT-2's layout).

Radford et al., *Language Models are Unsupervised Multitask Learners* (2019), §2.3: the GPT
decoder with layer normalisation moved to the input of each sub-block (pre-LN), a final layer
norm after the last block, residual projections initialised with a standard deviation scaled by
``1/sqrt(N)`` for ``N`` residual layers, and the token embedding shared with the output layer
(GPT-2's released code ties them: the logits are ``h @ wte.T``, no bias).

Parameters, with ``V = num_classes`` (the vocabulary), ``C = context``, ``d = width``,
``L = depth`` and the MLP ``4d`` wide:

* token embedding (tied: also the output layer) ``V·d``; positions ``C·d``;
* per block: two layer norms ``2·2d``, attention ``d·3d + 3d`` (q, k, v) ``+ d·d + d``
  (projection), MLP ``d·4d + 4d + 4d·d + d``: ``12d² + 13d``;
* the final layer norm ``2d``.

Total ``V·d + C·d + L·(12d² + 13d) + 2d``. GPT-2 small (``V = 50257, C = 1024, d = 768, L = 12``):
38,597,376 + 786,432 + 12 · 7,087,872 + 1,536 = **124,439,808** (the "124M" of the released
model). The byte-level CPU size of ``configs/gpt_text.py`` (``V = 256, C = 256, d = 256, L = 4,
4 heads``): 65,536 + 65,536 + 4 · 789,760 + 512 = 3,290,624.

Names (the package's convention): the token embedding is ``logits`` (``('params', 'logits',
'embedding')``), since the tied table *is* the last layer, so :func:`jaxcomp.models.is_last_layer`
finds it (TernGrad §4.2 keeps the last layer's gradients in float); positions ``position``;
blocks ``block1`` … ``blockL``, each with ``ln1``, ``attn`` (``qkv``, ``proj``), ``ln2``,
``mlp`` (``fc``, ``proj``); the final norm ``ln_final``.

Initialisation (GPT-2's code): normal(0.02) for every kernel and both embeddings,
normal(0.02/sqrt(2L)) for the two residual projections of each block, zero biases, layer norms
scale 1 and bias 0. Attention and the softmax of the logits are computed in float32 whatever
``dtype`` is.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcomp.models.layers import Dtype, Initializer

gpt2_normal: Initializer = nn.initializers.normal(0.02)


class _BlockPart(nn.Module):
  """The attributes every part of a block shares (see :class:`GPT`)."""

  residual_init: Initializer = gpt2_normal  # of the projection back into the residual stream
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def shared(self) -> dict:
    """These attributes, to pass on to a part's own parts."""
    return dict(residual_init=self.residual_init, dropout_rate=self.dropout_rate, dtype=self.dtype,
                param_dtype=self.param_dtype)


class CausalSelfAttention(_BlockPart):
  """Multi-head self-attention in which position ``t`` attends to positions ``<= t``."""

  heads: int = 1

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    b, t, d = x.shape
    dh = d // self.heads
    dense = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    qkv = nn.Dense(3 * d, kernel_init=gpt2_normal, name="qkv", **dense)(x)
    q, k, v = (a.reshape(b, t, self.heads, dh) for a in jnp.split(qkv, 3, axis=-1))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(dh)
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(jnp.float32).min), axis=-1)
    weights = nn.Dropout(self.dropout_rate)(weights, deterministic=not train)
    y = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v).reshape(b, t, d)
    y = nn.Dense(d, kernel_init=self.residual_init, name="proj", **dense)(y)
    return nn.Dropout(self.dropout_rate)(y, deterministic=not train)


class MLPBlock(_BlockPart):
  """The position-wise feed-forward layer: ``fc`` (4d, GELU) then ``proj`` (d)."""

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    dense = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    h = nn.gelu(nn.Dense(4 * x.shape[-1], kernel_init=gpt2_normal, name="fc", **dense)(x))
    h = nn.Dense(x.shape[-1], kernel_init=self.residual_init, name="proj", **dense)(h)
    return nn.Dropout(self.dropout_rate)(h, deterministic=not train)


class Block(_BlockPart):
  """One pre-LN Transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

  heads: int = 1

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    ln = dict(epsilon=1e-5, dtype=self.dtype, param_dtype=self.param_dtype)
    attn = CausalSelfAttention(heads=self.heads, name="attn", **self.shared())
    x = x + attn(nn.LayerNorm(name="ln1", **ln)(x), train)
    return x + MLPBlock(name="mlp", **self.shared())(nn.LayerNorm(name="ln2", **ln)(x), train)


class GPT(nn.Module):
  """GPT-2's decoder-only Transformer with tied input/output embeddings (see the module docstring).

  ``__call__(tokens, train)`` takes integer tokens ``[batch, time]`` (``time <= context``) and
  returns float32 logits ``[batch, time, num_classes]`` for the next token at every position.

  Attributes:
    num_classes: the vocabulary size (256 for bytes; 50257 for GPT-2's BPE).
    context: the longest sequence (positions embedded).
    width: the model width ``d``.
    depth: the number of blocks ``L``.
    heads: attention heads; must divide ``width``.
    dropout_rate: dropout on the embeddings, attention weights and residual branches (GPT-2: 0.1).
    dtype: compute dtype; parameters are ``param_dtype`` (float32), logits float32.
  """

  num_classes: int
  context: int = 256
  width: int = 256
  depth: int = 4
  heads: int = 4
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self):
    for name in ("context", "width", "depth", "heads"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"GPT: {name} must be a positive int, got {value!r}")
    if self.width % self.heads:
      raise ValueError(f"GPT: heads={self.heads} must divide width={self.width}")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"GPT: dropout_rate must be in [0, 1), got {self.dropout_rate!r}")
    super().__post_init__()

  @nn.compact
  def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"GPT takes integer tokens [batch, time]; got {tokens.dtype} {tokens.shape}")
    t = tokens.shape[1]
    if t > self.context:
      raise ValueError(f"GPT: sequence of {t} tokens is longer than context={self.context}")
    embed = nn.Embed(self.num_classes, self.width, embedding_init=gpt2_normal, dtype=self.dtype,
                     param_dtype=self.param_dtype, name="logits")
    position = self.param("position", gpt2_normal, (self.context, self.width), self.param_dtype)
    x = embed(tokens) + position[:t].astype(self.dtype)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    residual_init = nn.initializers.normal(0.02 / math.sqrt(2 * self.depth))
    for i in range(self.depth):
      x = Block(heads=self.heads, residual_init=residual_init, dropout_rate=self.dropout_rate,
                dtype=self.dtype, param_dtype=self.param_dtype, name=f"block{i + 1}")(x, train)
    x = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype, param_dtype=self.param_dtype, name="ln_final")(x)
    return embed.attend(x).astype(jnp.float32)


def gpt_param_count(num_classes: int, context: int, width: int, depth: int) -> int:
  """The parameter count of the module docstring's formula."""
  return num_classes * width + context * width + depth * (12 * width * width + 13 * width) + 2 * width
