"""CifarNet: the TensorFlow CIFAR-10 tutorial ConvNet, as TernGrad names and uses it.

TernGrad (Wen et al. 2017), §4.1 and Table 1: "a ConvNet [35] (named as CifarNet) on CIFAR-10",
trained on random 24×24 crops (center crop at test). The network is the TensorFlow tutorial's
``cifar10.inference`` (also wenwei202/terngrad ``slim/models.py: cifar10_alexnet``):

  conv1 64@5×5 SAME + ReLU → max-pool 3×3/2 SAME → LRN
  conv2 64@5×5 SAME + ReLU → LRN → max-pool 3×3/2 SAME
  fc3 384 + ReLU → fc4 192 + ReLU → logits 10

with LRN = ``tf.nn.lrn(depth_radius=4, bias=1.0, alpha=0.001/9.0, beta=0.75)``.

Parameters on 24×24×3 input (pools: 24 → 12 → 6, so fc3 sees 6·6·64 = 2,304 features):
4,864 + 102,464 + 885,120 + 73,920 + 1,930 = 1,068,298.

Initialisation: He-normal for the ReLU convolutions and hidden dense layers, LeCun-normal for
``logits``, zero biases. The tutorial itself used truncated normals (std 5e-2 for the convs,
0.04 for fc3/fc4, 1/192 for logits) with biases 0 (conv1, logits) and 0.1 (conv2, fc3, fc4); a
config wanting those can pass ``conv_init``/``fc_init``/``logits_init``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcomp.models.layers import Dtype, Initializer, he_normal, lecun_normal, local_response_norm


class CifarNet(nn.Module):
  """TensorFlow-tutorial CIFAR-10 network (TernGrad §4.1, Table 1), for 24×24×3 crops.

  Attributes:
    num_classes: size of the ``logits`` layer.
    conv_init: initialiser of the convolution kernels.
    fc_init: initialiser of the hidden dense kernels (fc3, fc4).
    logits_init: initialiser of the ``logits`` kernel.
    dtype: compute dtype (LRN is computed in float32 internally).
    param_dtype: parameter dtype.
  """

  num_classes: int = 10
  conv_init: Initializer = he_normal
  fc_init: Initializer = he_normal
  logits_init: Initializer = lecun_normal
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  # tf.nn.lrn arguments of the tutorial (norm1, norm2).
  lrn_depth_radius: int = 4
  lrn_bias: float = 1.0
  lrn_alpha: float = 0.001 / 9.0
  lrn_beta: float = 0.75

  def _lrn(self, x: jax.Array) -> jax.Array:
    return local_response_norm(
        x, self.lrn_depth_radius, self.lrn_bias, self.lrn_alpha, self.lrn_beta
    )

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits for NHWC images. ``train`` is accepted for interface uniformity (no effect)."""
    del train  # no dropout, no batch norm
    dt = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    x = nn.Conv(64, (5, 5), padding="SAME", kernel_init=self.conv_init, name="conv1", **dt)(x)
    x = nn.relu(x)
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    x = self._lrn(x)
    x = nn.Conv(64, (5, 5), padding="SAME", kernel_init=self.conv_init, name="conv2", **dt)(x)
    x = nn.relu(x)
    x = self._lrn(x)
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(384, kernel_init=self.fc_init, name="fc3", **dt)(x))
    x = nn.relu(nn.Dense(192, kernel_init=self.fc_init, name="fc4", **dt)(x))
    x = nn.Dense(self.num_classes, kernel_init=self.logits_init, name="logits", **dt)(x)
    return x.astype(jnp.float32)
