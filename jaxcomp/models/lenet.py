"""LeNet as in Caffe's MNIST example, the network of TernGrad's MNIST runs.

TernGrad (Wen et al. 2017), §4.1 and Figure 3: "LeNet" trained on MNIST without augmentation.
The architecture is Caffe's ``examples/mnist/lenet_train_test.prototxt`` (LeCun et al. 1998,
as modernised by Caffe): conv 20@5×5 VALID, max-pool 2×2/2, conv 50@5×5 VALID, max-pool 2×2/2,
fully connected 500, ReLU, fully connected 10. There is no non-linearity after the convolutions
(Caffe's net has a single ReLU, after ``ip1``).

Parameters on 28×28×1 input: 520 + 25,050 + 400,500 + 5,010 = 431,080.

Notes:
  * TernGrad's TensorFlow port (wenwei202/terngrad, ``slim/models.py: lenet``) differs from the
    Caffe net it cites: it uses SAME padding (7×7×50 = 2,450 features into fc3) and ReLU after
    every conv. We follow Caffe, as the paper cites it.
  * Initialisation: Caffe's ``weight_filler { type: "xavier" }`` with its default
    ``variance_norm: FAN_IN`` draws U(-√(3/fan_in), √(3/fan_in)): LeCun-uniform, not
    Glorot's fan-average rule, whatever the name suggests. We use exactly that
    (:data:`~jaxcomp.models.layers.caffe_xavier`) for every weight, and zero biases (Caffe's
    ``constant`` filler default). Pass ``kernel_init=layers.glorot_uniform`` for textbook Glorot.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcomp.models.layers import Dtype, Initializer, caffe_xavier, zeros


class LeNet(nn.Module):
  """Caffe's LeNet for 28×28×1 MNIST digits (TernGrad §4.1).

  Attributes:
    num_classes: size of the ``logits`` layer.
    kernel_init: initialiser of all weights (default: Caffe "xavier", i.e. LeCun-uniform).
    bias_init: initialiser of all biases.
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  num_classes: int = 10
  kernel_init: Initializer = caffe_xavier
  bias_init: Initializer = zeros
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits for NHWC images. ``train`` is accepted for interface uniformity (no effect)."""
    del train  # no dropout, no batch norm
    kw = dict(
        kernel_init=self.kernel_init,
        bias_init=self.bias_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
    )
    x = nn.Conv(20, (5, 5), padding="VALID", name="conv1", **kw)(x)
    x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
    x = nn.Conv(50, (5, 5), padding="VALID", name="conv2", **kw)(x)
    x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(500, name="fc1", **kw)(x))
    x = nn.Dense(self.num_classes, name="logits", **kw)(x)
    return x.astype(jnp.float32)
