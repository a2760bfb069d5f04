"""ResNet for CIFAR-10 (He et al. 2015, "Deep Residual Learning for Image Recognition", §4.2).

The network of 3LC (Lim et al. 2019, §4.3: ResNet-110 on CIFAR-10) and QSGD (Alistarh et al.
2017, §5: ResNet-110 on CIFAR-10). Following He et al. §4.2 exactly:

* input 32×32×3; a 3×3 conv with 16 filters;
* three stages of ``n`` basic blocks (two 3×3 convs each) on feature maps 32×32, 16×16, 8×8
  with 16, 32, 64 filters; the first conv of stages 2 and 3 has stride 2;
* every conv is followed by batch norm; ReLU after BN, and after the residual addition;
* global average pooling, a 10-way fully connected layer (``logits``). Depth = 6n + 2.

Decisions:

* **Shortcut option A** (§4.2: "we use identity shortcuts in all cases (i.e., option A)"): where
  the shape changes, the shortcut subsamples by taking every other pixel (``x[:, ::2, ::2]``) and
  appends zero channels (16 → 32, 32 → 64). It has no parameters.
* 3×3 convs use symmetric padding 1 (as Caffe/PyTorch), not ``"SAME"``: with stride 2 this keeps
  output pixel ``i`` centred on input pixel ``2i``, the pixel the option-A shortcut keeps.
* Convolutions have no bias (each is followed by BN). BN has scale and shift.
* Initialisation: He-normal for the convolutions (He et al. §4.2 cite [13] = "Delving deep into
  rectifiers"), LeCun-normal for ``logits``, zero biases.

Parameter count, with n blocks per stage (each BN has 2·C parameters):

    conv1 + bn1                         3·3·3·16 + 2·16                  =        464
    stage 1, each block   2·(3·3·16·16) + 2·(2·16)                       =      4,672
    stage 2, first block  3·3·16·32 + 3·3·32·32 + 2·(2·32)               =     13,952
    stage 2, other blocks 2·(3·3·32·32) + 2·(2·32)                       =     18,560
    stage 3, first block  3·3·32·64 + 3·3·64·64 + 2·(2·64)               =     55,552
    stage 3, other blocks 2·(3·3·64·64) + 2·(2·64)                       =     73,984
    logits                64·10 + 10                                     =        650

    total(n) = 464 + 4,672n + 13,952 + 18,560(n−1) + 55,552 + 73,984(n−1) + 650
             = 97,216n − 21,926

    ResNet-20  (n=3):    269,722      ResNet-56  (n=9):    853,018
    ResNet-32  (n=5):    464,154      ResNet-110 (n=18): 1,727,962

(He et al. Table 6: 0.27M, 0.46M, 0.85M, 1.7M.)
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcomp.models.layers import (
    Dtype,
    Initializer,
    bn_settings,
    conv_bn,
    he_normal,
    lecun_normal,
    logits_layer,
)

STAGE_WIDTHS = (16, 32, 64)


def blocks_per_stage(depth: int) -> int:
  """``n`` for a CIFAR ResNet of the given depth (depth = 6n + 2, n >= 1).

  Raises:
    ValueError: if ``depth`` is not of the form 6n + 2 with n >= 1.
  """
  if isinstance(depth, bool) or not isinstance(depth, int):
    raise ValueError(f"ResNet depth must be an int, got {depth!r}")
  if depth < 8 or (depth - 2) % 6 != 0:
    raise ValueError(
        f"CIFAR ResNet depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...), "
        f"got {depth}"
    )
  return (depth - 2) // 6


def shortcut_option_a(x: jax.Array, out_channels: int, stride: int) -> jax.Array:
  """He et al.'s parameter-free "option A" shortcut.

  Subsamples spatially by ``stride`` (keeping pixels ``0, stride, 2·stride, …``) and pads the
  channel axis with zeros at the end up to ``out_channels``.
  """
  if stride != 1:
    x = x[:, ::stride, ::stride, :]
  extra = out_channels - x.shape[-1]
  if extra < 0:
    raise ValueError(f"option-A shortcut cannot reduce channels ({x.shape[-1]} -> {out_channels})")
  if extra:
    x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra)))
  return x


class BasicBlock(nn.Module):
  """Two 3×3 conv–BN layers with an option-A identity shortcut (He et al. 2015, Fig. 2).

  Children: ``conv1``, ``bn1``, ``conv2``, ``bn2``.
  """

  features: int
  strides: int = 1
  conv_init: Initializer = he_normal
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    conv = lambda y, stride, index, relu: conv_bn(
        y,
        self.features,
        (3, 3),
        train=train,
        strides=(stride, stride),
        relu=relu,
        kernel_init=self.conv_init,
        conv_name=f"conv{index}",
        bn_name=f"bn{index}",
        **bn_settings(self),
    )
    y = conv(x, self.strides, 1, relu=True)
    y = conv(y, 1, 2, relu=False)
    return nn.relu(y + shortcut_option_a(x, self.features, self.strides).astype(y.dtype))


class CifarResNet(nn.Module):
  """CIFAR-10 ResNet of depth 6n + 2 (He et al. 2015, §4.2), 32×32×3 input.

  Parameter paths: ``conv1``/``bn1`` (stem), ``stage{s}_block{b}/{conv,bn}{1,2}`` with s in 1..3
  and b in 1..n, ``logits``.

  Attributes:
    depth: 20, 32, 44, 56, 110, ... (must be 6n + 2).
    num_classes: size of the ``logits`` layer.
    conv_init: initialiser of the convolution kernels.
    logits_init: initialiser of the ``logits`` kernel.
    bn_momentum: batch-norm moving-average decay.
    bn_epsilon: batch-norm epsilon.
    bn_axis_name: named axis for cross-worker batch statistics (``None``: per worker).
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  depth: int = 20
  num_classes: int = 10
  conv_init: Initializer = he_normal
  logits_init: Initializer = lecun_normal
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self) -> None:
    blocks_per_stage(self.depth)  # validate early, with a clear message
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits for NHWC images.

    Args:
      x: float images ``(batch, 32, 32, 3)`` (other sizes work; pooling is global).
      train: use batch statistics (needs ``mutable=['batch_stats']``) when ``True``.
    """
    n = blocks_per_stage(self.depth)
    x = conv_bn(
        x,
        STAGE_WIDTHS[0],
        (3, 3),
        train=train,
        kernel_init=self.conv_init,
        conv_name="conv1",
        bn_name="bn1",
        **bn_settings(self),
    )
    for s, width in enumerate(STAGE_WIDTHS, start=1):
      for b in range(1, n + 1):
        x = BasicBlock(
            width,
            strides=2 if (s > 1 and b == 1) else 1,
            conv_init=self.conv_init,
            name=f"stage{s}_block{b}",
            **bn_settings(self),
        )(x, train)
    x = jnp.mean(x, axis=(1, 2))
    return logits_layer(x, self.num_classes, self.logits_init, self.dtype, self.param_dtype)
