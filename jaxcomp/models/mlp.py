"""The fully connected network of Dryden et al. (2016).

Dryden et al., "Communication Quantization for Data-parallel Training of Deep Neural Networks",
§4.1: "three 4096-neuron fully-connected layers followed by a ten-unit softmax layer", ReLU
activations, on 28×28 MNIST digits. Flattened input of 784 values.

Parameters with the default ``hidden=(4096, 4096, 4096)`` on 784 inputs:
3,215,360 + 16,781,312 + 16,781,312 + 40,970 = 36,818,954.

Initialisation (the paper does not say): He-normal for the hidden ReLU layers, LeCun-normal for
``logits``, zero biases.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcomp.models.layers import Dtype, Initializer, he_normal, lecun_normal


class MLP(nn.Module):
  """784-4096-4096-4096-10 ReLU network (Dryden et al. 2016, §4.1); any input shape is flattened.

  Hidden layers are named ``fc1``, ``fc2``, …; the last layer ``logits``.

  Attributes:
    num_classes: size of the ``logits`` layer.
    hidden: widths of the hidden layers (may be empty: then the model is a linear classifier).
    hidden_init: initialiser of the hidden kernels.
    logits_init: initialiser of the ``logits`` kernel.
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  num_classes: int = 10
  hidden: Sequence[int] = (4096, 4096, 4096)
  hidden_init: Initializer = he_normal
  logits_init: Initializer = lecun_normal
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self) -> None:
    for width in self.hidden:
      if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"MLP hidden widths must be positive ints, got {tuple(self.hidden)}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits for a batch ``(batch, ...)``; everything after the batch axis is flattened."""
    del train  # no dropout, no batch norm
    dt = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    x = x.reshape((x.shape[0], -1))
    for i, width in enumerate(self.hidden, start=1):
      x = nn.relu(nn.Dense(width, kernel_init=self.hidden_init, name=f"fc{i}", **dt)(x))
    x = nn.Dense(self.num_classes, kernel_init=self.logits_init, name="logits", **dt)(x)
    return x.astype(jnp.float32)
