"""GoogLeNet (Inception v1) without auxiliary classifiers, as in TernGrad's ImageNet runs.

Architecture: Szegedy et al. (2014), "Going Deeper with Convolutions", Table 1 and Figure 3, on
224×224×3 input. TernGrad (Wen et al. 2017, §4.2, Table 3): "Our implementation of GoogLeNet does
not utilize any auxiliary classifiers", and "All DNNs are trained by momentum SGD with Batch
Normalization on convolutional layers".

Decisions:

* **Batch norm** (``use_bn=True``, default): TernGrad says all its DNNs used BN on conv layers, and
  its code builds GoogLeNet from TF-slim's ``inception_v1`` under an arg scope with batch norm. Every
  convolution is conv → BN → ReLU, without conv bias (BN's shift replaces it), and the two LRN
  layers of the stem are dropped (BN replaces them, as in TF-slim). ``use_bn=False`` gives the
  paper's network: conv biases, and LRN after the first max-pool and after ``conv2``
  (Caffe ``bvlc_googlenet``: local_size 5, α=1e-4, β=0.75 → ``tf.nn.lrn(2, 1, 2e-5, 0.75)``).
* **5×5 convolutions** in the third branch of every inception module, as Table 1 says. (TF-slim's
  ``inception_v1``, and torchvision's GoogLeNet, use 3×3 there; ``branch3_kernel=3`` reproduces
  that variant, 380,928 weights fewer.)
* Convolutions use symmetric padding ``k // 2`` as Caffe does (conv1: 7×7/2 pad 3: 224 → 112);
  max-pools 3×3/2 use ``"SAME"``, which here picks the same windows as Caffe's ceil mode
  (112 → 56 → 28 → 14 → 7). The final 7×7 average pool is a global mean (same thing at 224×224,
  and it keeps the model usable at other input sizes).
* Dropout 0.4 before ``logits`` (Table 1); TernGrad Table 3 uses 0.2 (floating) / 0.08 (TernGrad):
  set ``dropout_rate``.
* Initialisation: He-normal for all convolutions (each is followed by ReLU), LeCun-normal for
  ``logits``, zero biases.

Parameter count (1000 classes, 5×5 third branch). An inception module with input C and Table 1
columns (#1×1 a, #3×3 reduce b, #3×3 c, #5×5 reduce d, #5×5 e, pool proj f) has
``C·a + C·b + 9·b·c + C·d + 25·d·e + C·f`` conv weights and ``a+b+c+d+e+f`` channels:

    stem   conv1 7·7·3·64 = 9,408; conv2_reduce 64·64 = 4,096; conv2 9·64·192 = 110,592
                                                          weights 124,096   channels   320
    3a (C=192:  64,  96, 128, 16,  32,  32)               weights 163,328   channels   368
    3b (C=256: 128, 128, 192, 32,  96,  64)               weights 388,096   channels   640
    4a (C=480: 192,  96, 208, 16,  48,  64)               weights 375,552   channels   624
    4b (C=512: 160, 112, 224, 24,  64,  64)               weights 448,512   channels   648
    4c (C=512: 128, 128, 256, 24,  64,  64)               weights 509,440   channels   664
    4d (C=512: 112, 144, 288, 32,  64,  64)               weights 604,672   channels   704
    4e (C=528: 256, 160, 320, 32, 128, 128)               weights 867,328   channels 1,024
    5a (C=832: 256, 160, 320, 32, 128, 128)               weights 1,042,432 channels 1,024
    5b (C=832: 384, 192, 384, 48, 128, 128)               weights 1,442,816 channels 1,264
    conv weights 5,966,272; channels 7,280
    logits 1024·1000 + 1000 = 1,025,000

    use_bn=True  (2 BN params per channel): 5,966,272 + 14,560 + 1,025,000 = 7,005,832
    use_bn=False (1 bias per channel):      5,966,272 +  7,280 + 1,025,000 = 6,998,552

(With ``branch3_kernel=3`` and BN: 7,005,832 − 380,928 = 6,624,904, torchvision's figure without
aux heads.)
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcomp.models.layers import (
    ConvBN,
    Dtype,
    Initializer,
    bn_settings,
    he_normal,
    lecun_normal,
    local_response_norm,
    logits_layer,
)


class InceptionSpec(NamedTuple):
  """One row of Szegedy et al. (2014), Table 1 (output channels of each convolution)."""

  b1x1: int
  b3x3_reduce: int
  b3x3: int
  b5x5_reduce: int
  b5x5: int
  pool_proj: int


# Table 1 of Szegedy et al. (2014); None marks a 3×3/2 max-pool between modules.
INCEPTION_TABLE: tuple[tuple[str, InceptionSpec] | None, ...] = (
    ("inception3a", InceptionSpec(64, 96, 128, 16, 32, 32)),
    ("inception3b", InceptionSpec(128, 128, 192, 32, 96, 64)),
    None,
    ("inception4a", InceptionSpec(192, 96, 208, 16, 48, 64)),
    ("inception4b", InceptionSpec(160, 112, 224, 24, 64, 64)),
    ("inception4c", InceptionSpec(128, 128, 256, 24, 64, 64)),
    ("inception4d", InceptionSpec(112, 144, 288, 32, 64, 64)),
    ("inception4e", InceptionSpec(256, 160, 320, 32, 128, 128)),
    None,
    ("inception5a", InceptionSpec(256, 160, 320, 32, 128, 128)),
    ("inception5b", InceptionSpec(384, 192, 384, 48, 128, 128)),
)


def _max_pool(x: jax.Array, stride: int = 2) -> jax.Array:
  return nn.max_pool(x, (3, 3), strides=(stride, stride), padding="SAME")


class Inception(nn.Module):
  """An inception module (Szegedy et al. 2014, Figure 2b).

  Four branches concatenated on the channel axis, in this order: ``branch1x1``;
  ``branch3x3_reduce`` → ``branch3x3``; ``branch5x5_reduce`` → ``branch5x5``;
  3×3/1 max-pool → ``pool_proj``. Each is a :class:`ConvBN` (children ``conv``, ``bn``).
  """

  spec: InceptionSpec
  branch3_kernel: int = 5
  use_bn: bool = True
  conv_init: Initializer = he_normal
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    def conv(features: int, k: int, name: str) -> ConvBN:
      return ConvBN(
          features,
          (k, k),
          use_bn=self.use_bn,
          kernel_init=self.conv_init,
          name=name,
          **bn_settings(self),
      )

    s, k3 = self.spec, self.branch3_kernel
    b1 = conv(s.b1x1, 1, "branch1x1")(x, train)
    b2 = conv(s.b3x3_reduce, 1, "branch3x3_reduce")(x, train)
    b2 = conv(s.b3x3, 3, "branch3x3")(b2, train)
    b3 = conv(s.b5x5_reduce, 1, "branch5x5_reduce")(x, train)
    b3 = conv(s.b5x5, k3, "branch5x5")(b3, train)
    b4 = conv(s.pool_proj, 1, "pool_proj")(_max_pool(x, stride=1), train)
    return jnp.concatenate([b1, b2, b3, b4], axis=-1)


class GoogLeNet(nn.Module):
  """Inception v1 without auxiliary heads (Szegedy et al. 2014 Table 1; TernGrad §4.2, Table 3).

  Parameter paths: ``conv1``, ``conv2_reduce``, ``conv2`` (stem, each with ``conv``/``bn``),
  ``inception{3a..5b}/{branch1x1, branch3x3_reduce, branch3x3, branch5x5_reduce, branch5x5,
  pool_proj}/{conv,bn}``, ``logits``.

  Attributes:
    num_classes: size of the ``logits`` layer.
    dropout_rate: dropout before ``logits`` (paper 0.4; TernGrad Table 3: 0.2 / 0.08).
    use_bn: batch norm after every conv, no LRN (default, as TernGrad); ``False`` gives the
      paper's network with conv biases and LRN.
    branch3_kernel: kernel of the third branch's conv (5 as in the paper; 3 for the
      TF-slim/torchvision variant).
    conv_init: initialiser of the convolution kernels.
    logits_init: initialiser of the ``logits`` kernel.
    bn_momentum: batch-norm moving-average decay.
    bn_epsilon: batch-norm epsilon.
    bn_axis_name: named axis for cross-worker batch statistics (``None``: per worker).
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  num_classes: int = 1000
  dropout_rate: float = 0.4
  use_bn: bool = True
  branch3_kernel: int = 5
  conv_init: Initializer = he_normal
  logits_init: Initializer = lecun_normal
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self) -> None:
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    if self.branch3_kernel not in (3, 5):
      raise ValueError(f"branch3_kernel must be 5 (paper) or 3, got {self.branch3_kernel}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits for NHWC images (224×224×3 nominal; any size ≥ 32 works thanks to global pooling).

    Args:
      x: float images ``(batch, H, W, 3)``.
      train: batch statistics + dropout (needs ``mutable=['batch_stats']`` and a
        ``'dropout'`` rng) when ``True``; running averages, no dropout when ``False``.
    """
    shared = dict(use_bn=self.use_bn, **bn_settings(self))
    conv_kw = dict(kernel_init=self.conv_init, **shared)  # for ConvBN
    inception_kw = dict(conv_init=self.conv_init, **shared)  # for Inception
    lrn = lambda y: local_response_norm(y, depth_radius=2, bias=1.0, alpha=1e-4 / 5, beta=0.75)

    x = ConvBN(64, (7, 7), strides=(2, 2), name="conv1", **conv_kw)(x, train)
    x = _max_pool(x)
    if not self.use_bn:
      x = lrn(x)
    x = ConvBN(64, (1, 1), name="conv2_reduce", **conv_kw)(x, train)
    x = ConvBN(192, (3, 3), name="conv2", **conv_kw)(x, train)
    if not self.use_bn:
      x = lrn(x)
    x = _max_pool(x)
    for entry in INCEPTION_TABLE:
      if entry is None:
        x = _max_pool(x)
        continue
      name, spec = entry
      x = Inception(spec, self.branch3_kernel, name=name, **inception_kw)(x, train)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dropout(self.dropout_rate, deterministic=not train, name="dropout")(x)
    return logits_layer(x, self.num_classes, self.logits_init, self.dtype, self.param_dtype)
