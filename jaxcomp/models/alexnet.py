"""AlexNet with batch normalisation on the convolutional layers, as in TernGrad's ImageNet runs.

Architecture: Krizhevsky et al. (2012), §3.5 and Figure 2, in the layout of Caffe's
``bvlc_alexnet`` (conv1 96@11×11/4, conv2 256@5×5 pad 2, conv3 384@3×3, conv4 384@3×3,
conv5 256@3×3, all pad 1 after conv2; max-pool 3×3/2 after conv1, conv2 and conv5; fc6 4096,
fc7 4096, fc8 = ``logits``), modified as TernGrad says (Wen et al. 2017, §4.2 and Table 2):
"All DNNs are trained by momentum SGD with Batch Normalization on convolutional layers", with
dropout ratio 0.5 (floating) or 0.2 (TernGrad) on fc6/fc7.

Decisions (paper silent or ambiguous):

* **Input 224×224×3**, the crop size of TernGrad's TensorFlow ImageNet pipeline. conv1 uses
  symmetric padding 2, so the feature maps are Caffe's 227×227 ones exactly:
  224 → conv1 55 → pool 27 → conv2 27 → pool 13 → conv3–5 13 → pool 6, and fc6 sees
  6·6·256 = 9,216 features. (227×227 input also gives 6×6 at pool5, so both work.)
* **Grouped convolutions** (groups=2 in conv2, conv4, conv5, as in the two-GPU original, Caffe's
  ``group: 2`` and TernGrad's own TF code, which splits these layers into ``_1``/``_2`` halves).
  This gives ≈61.0M parameters, the "AlexNet" size people quote, and makes the last layer
  4,097,000 / 60,966,600 = 6.7% of the model, exactly the figure TernGrad §4.2 gives; without
  groups it would be 62.4M and 6.6%. ``grouped=False`` switches grouping off.
* **Batch norm**: conv → BN → ReLU (then max-pool where the original has one) for conv1–5; none on
  the fully connected layers, as TernGrad's code does (BN only in the conv arg scope). Batch norm
  replaces LRN (there is no LRN with ``use_bn=True``), and the convolutions have **no bias**, which
  BN's shift makes redundant. BN has both scale and shift (Flax default); TernGrad's TF-slim BN had
  shift only (``scale=False``), 2,752 − 1,376 = 1,376 fewer parameters.
* ``use_bn=False`` gives Caffe's original network: conv biases and LRN (local_size 5, α=1e-4,
  β=0.75, k=1 → ``tf.nn.lrn(depth_radius=2, bias=1, alpha=2e-5, beta=0.75)``) after ReLU in
  conv1/conv2: 60,965,224 parameters.

Parameters (1000 classes, default settings), layer by layer:

    conv1  11·11·3·96       =     34,848    bn1 2·96  =   192
    conv2  5·5·(96/2)·256   =    307,200    bn2 2·256 =   512
    conv3  3·3·256·384      =    884,736    bn3 2·384 =   768
    conv4  3·3·(384/2)·384  =    663,552    bn4 2·384 =   768
    conv5  3·3·(384/2)·256  =    442,368    bn5 2·256 =   512
    fc6    9216·4096 + 4096 = 37,752,832
    fc7    4096·4096 + 4096 = 16,781,312
    logits 4096·1000 + 1000 =  4,097,000
    total                   = 60,966,600

Initialisation: He-normal for the convolutions and fc6/fc7 (all followed by ReLU), LeCun-normal for
``logits``, zero biases.
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
    local_response_norm,
    logits_layer,
)


class AlexNet(nn.Module):
  """AlexNet with BN on conv layers (TernGrad §4.2, Table 2); 224×224×3 input.

  Attributes:
    num_classes: size of the ``logits`` layer (fc8).
    dropout_rate: dropout ratio on fc6 and fc7 outputs (TernGrad: 0.5 floating, 0.2 TernGrad).
    use_bn: batch norm on conv1–5 (default, TernGrad); ``False`` gives Caffe's LRN network.
    grouped: split conv2/conv4/conv5 into 2 groups as in the original (default).
    conv_init: initialiser of the convolution kernels.
    fc_init: initialiser of the fc6/fc7 kernels.
    logits_init: initialiser of the ``logits`` kernel.
    bn_momentum: batch-norm moving-average decay.
    bn_epsilon: batch-norm epsilon.
    bn_axis_name: named axis for cross-worker batch statistics (``None``: per-worker, as in
      TernGrad's towers).
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  num_classes: int = 1000
  dropout_rate: float = 0.5
  use_bn: bool = True
  grouped: bool = True
  conv_init: Initializer = he_normal
  fc_init: Initializer = he_normal
  logits_init: Initializer = lecun_normal
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self) -> None:
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    super().__post_init__()

  def _conv(
      self,
      x: jax.Array,
      features: int,
      kernel: int,
      stride: int,
      pad: int,
      groups: int,
      index: int,
      train: bool,
  ) -> jax.Array:
    """conv{index} (+ bn{index}) + ReLU (+ LRN in conv1/conv2 of the BN-free network)."""
    # Children named conv{i}/bn{i} directly on AlexNet (not nested) so paths read like
    # ('params', 'conv3', 'kernel') and ('params', 'bn3', 'scale').
    x = conv_bn(
        x,
        features,
        (kernel, kernel),
        train=train,
        strides=(stride, stride),
        padding=[(pad, pad), (pad, pad)],
        groups=groups if self.grouped else 1,
        use_bn=self.use_bn,
        kernel_init=self.conv_init,
        conv_name=f"conv{index}",
        bn_name=f"bn{index}",
        **bn_settings(self),
    )
    if not self.use_bn and index in (1, 2):
      x = local_response_norm(x, depth_radius=2, bias=1.0, alpha=1e-4 / 5, beta=0.75)
    return x

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits for NHWC images (224×224×3 nominal; needs at least ~63×63 to keep pool5 ≥ 1).

    Args:
      x: float images ``(batch, H, W, 3)``.
      train: batch statistics + dropout (needs ``mutable=['batch_stats']`` and a
        ``'dropout'`` rng) when ``True``; running averages, no dropout when ``False``.
    """
    pool = lambda y: nn.max_pool(y, (3, 3), strides=(2, 2), padding="VALID")
    x = pool(self._conv(x, 96, 11, 4, 2, 1, 1, train))
    x = pool(self._conv(x, 256, 5, 1, 2, 2, 2, train))
    x = self._conv(x, 384, 3, 1, 1, 1, 3, train)
    x = self._conv(x, 384, 3, 1, 1, 2, 4, train)
    x = pool(self._conv(x, 256, 3, 1, 1, 2, 5, train))
    x = x.reshape((x.shape[0], -1))
    dt = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    for name in ("fc6", "fc7"):
      x = nn.relu(nn.Dense(4096, kernel_init=self.fc_init, name=name, **dt)(x))
      x = nn.Dropout(self.dropout_rate, deterministic=not train, name=f"dropout{name[2:]}")(x)
    return logits_layer(x, self.num_classes, self.logits_init, **dt)
