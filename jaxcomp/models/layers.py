"""Building blocks shared by the models in :mod:`jaxcomp.models`.

Contents:

* Initialisers named after the papers that introduced them, so every model can keep its choice
  in a module attribute (``kernel_init``) and a config can override it.
* :func:`local_response_norm`: cross-channel local response normalisation with the semantics of
  ``tf.nn.lrn`` (used by CifarNet, and by AlexNet / GoogLeNet when batch norm is switched off).
* :func:`conv_bn`: convolution followed by optional batch norm and ReLU, created as children of the
  calling module under names the caller picks (AlexNet's ``conv3``/``bn3``, ResNet's ``bn1``).
* :class:`ConvBN`: the same as a module of its own, with the naming convention of the package
  (``conv`` and ``bn`` children) so that parameter paths identify the layer.
* :func:`bn_settings`: the batch-norm and dtype attributes a model passes on to its layers.
* :func:`logits_layer`: the classification layer ``logits`` with float32 output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

Dtype = Any
Initializer = Callable[..., jax.Array]

# He et al., "Delving Deep into Rectifiers" (2015), Eq. 10: zero-mean Gaussian with
# std = sqrt(2 / fan_in), fan_in = kh * kw * in_channels (per group). A plain (not truncated)
# normal, as in the paper and Caffe's "msra" filler. For layers followed by ReLU.
he_normal: Initializer = nn.initializers.variance_scaling(2.0, "fan_in", "normal")

# Caffe's "xavier" filler with its default ``variance_norm: FAN_IN``: U(-a, a) with
# a = sqrt(3 / fan_in), i.e. variance 1 / fan_in. Despite the name, this is NOT Glorot & Bengio's
# fan-average rule (that is ``glorot_uniform``); it is LeCun-uniform.
caffe_xavier: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "uniform")

# Glorot & Bengio (2010) uniform, fan average: for layers that want the textbook "Xavier".
glorot_uniform: Initializer = nn.initializers.glorot_uniform()

# LeCun normal, std = sqrt(1 / fan_in): Flax's default for Dense, used for classification layers
# (no ReLU after them) unless a model says otherwise.
lecun_normal: Initializer = nn.initializers.lecun_normal()

zeros: Initializer = nn.initializers.zeros


def local_response_norm(
    x: jax.Array,
    depth_radius: int = 5,
    bias: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.5,
) -> jax.Array:
  """Cross-channel local response normalisation, exactly as ``tf.nn.lrn``.

  For NHWC input ``x``::

      sqr_sum[n, h, w, c] = sum_{c' = c - r}^{c + r} x[n, h, w, c']**2   (out-of-range c' skipped)
      out = x / (bias + alpha * sqr_sum) ** beta

  with ``r = depth_radius``. Note the TF convention: ``alpha`` multiplies the plain sum. Caffe's
  ``LRN(local_size=n, alpha=a, beta=b)`` (Krizhevsky et al. 2012, §3.3) divides by
  ``(1 + a / n * sum) ** b`` and corresponds to ``depth_radius=(n - 1) // 2, bias=1,
  alpha=a / n, beta=b`` here.

  The sum is computed in float32 (and the result cast back to ``x.dtype``), so the op is safe
  under bfloat16/float16 compute.

  Args:
    x: input of shape ``(..., channels)``; the normalisation runs over the last axis.
    depth_radius: half-width ``r`` of the channel window (window size ``2r + 1``).
    bias: additive constant (``k`` in Krizhevsky et al.).
    alpha: scale of the squared sum.
    beta: exponent.

  Returns:
    Array of the same shape and dtype as ``x``.

  Raises:
    ValueError: if ``depth_radius`` is negative or ``x`` is a scalar.
  """
  if depth_radius < 0:
    raise ValueError(f"depth_radius must be >= 0, got {depth_radius}")
  if x.ndim < 1:
    raise ValueError("local_response_norm needs an input with a channel axis")
  xf = x.astype(jnp.float32)
  window = (1,) * (x.ndim - 1) + (2 * depth_radius + 1,)
  padding = ((0, 0),) * (x.ndim - 1) + ((depth_radius, depth_radius),)
  sqr_sum = lax.reduce_window(xf * xf, 0.0, lax.add, window, (1,) * x.ndim, padding)
  return (xf * lax.pow(bias + alpha * sqr_sum, -jnp.float32(beta))).astype(x.dtype)


def caffe_padding(kernel_size: Sequence[int]) -> list[tuple[int, int]]:
  """Symmetric padding ``k // 2`` per spatial axis, as Caffe/PyTorch models specify it.

  Unlike ``"SAME"``, which for stride 2 puts the extra pixel at the high end only, this keeps
  output pixel ``i`` centred on input pixel ``stride * i``: what the papers' Caffe models do, and
  what parameter-free subsampling shortcuts (``x[:, ::2, ::2]``) line up with.
  """
  return [(k // 2, k // 2) for k in kernel_size]


def bn_settings(module: nn.Module) -> dict[str, Any]:
  """A module's batch-norm and dtype attributes, as keywords for :func:`conv_bn` and the models.

  Every model with batch norm (and each of its blocks) has the attributes ``bn_momentum``,
  ``bn_epsilon``, ``bn_axis_name``, ``dtype`` and ``param_dtype``; this passes them on unchanged.

  Args:
    module: a module with those five attributes.

  Returns:
    ``{'bn_momentum': ..., 'bn_epsilon': ..., 'bn_axis_name': ..., 'dtype': ...,
    'param_dtype': ...}``.
  """
  return dict(
      bn_momentum=module.bn_momentum,
      bn_epsilon=module.bn_epsilon,
      bn_axis_name=module.bn_axis_name,
      dtype=module.dtype,
      param_dtype=module.param_dtype,
  )


def conv_bn(
    x: jax.Array,
    features: int,
    kernel_size: Sequence[int],
    *,
    train: bool,
    strides: Sequence[int] = (1, 1),
    padding: Any = None,
    groups: int = 1,
    use_bn: bool = True,
    relu: bool = True,
    kernel_init: Initializer = he_normal,
    bn_momentum: float = 0.9,
    bn_epsilon: float = 1e-5,
    bn_axis_name: str | None = None,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    conv_name: str = "conv",
    bn_name: str = "bn",
) -> jax.Array:
  """Convolution, then batch norm (optional), then ReLU (optional), in the calling module.

  Call it from a compact method: the ``nn.Conv`` and ``nn.BatchNorm`` become children of the
  calling module, named ``conv_name`` and ``bn_name`` (no module level of their own). With batch
  norm the convolution has no bias (BN's shift makes it redundant, Ioffe & Szegedy 2015, §3.2);
  without, it has one.

  Args:
    x: NHWC input.
    features: output channels.
    kernel_size: spatial kernel size.
    train: batch statistics (``True``) or running averages (``False``) in batch norm.
    strides, padding, groups, use_bn, relu, kernel_init, bn_momentum, bn_epsilon, bn_axis_name,
      dtype, param_dtype: as the attributes of :class:`ConvBN` of the same names.
    conv_name: name of the convolution child.
    bn_name: name of the batch-norm child.

  Returns:
    The output activations.
  """
  kernel_size = tuple(kernel_size)
  x = nn.Conv(
      features,
      kernel_size,
      strides=tuple(strides),
      padding=caffe_padding(kernel_size) if padding is None else padding,
      feature_group_count=groups,
      use_bias=not use_bn,
      kernel_init=kernel_init,
      dtype=dtype,
      param_dtype=param_dtype,
      name=conv_name,
  )(x)
  if use_bn:
    x = nn.BatchNorm(
        use_running_average=not train,
        momentum=bn_momentum,
        epsilon=bn_epsilon,
        axis_name=bn_axis_name,
        dtype=dtype,
        param_dtype=param_dtype,
        name=bn_name,
    )(x)
  if relu:
    x = nn.relu(x)
  return x


def logits_layer(
    x: jax.Array,
    num_classes: int,
    kernel_init: Initializer = lecun_normal,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
) -> jax.Array:
  """The classification layer, a dense child ``logits`` of the calling module; float32 output.

  Call it from a compact method. The name ``logits`` is what
  :func:`jaxcomp.models.is_last_layer` looks for.
  """
  x = nn.Dense(
      num_classes, kernel_init=kernel_init, dtype=dtype, param_dtype=param_dtype, name="logits"
  )(x)
  return x.astype(jnp.float32)


class ConvBN(nn.Module):
  """Convolution, then batch norm (optional), then ReLU (optional): :func:`conv_bn` as a module.

  Children are named ``conv`` and ``bn`` so that a parameter path such as
  ``('params', 'inception3a', 'branch3x3', 'bn', 'scale')`` identifies both the layer and
  the fact that it is batch norm (see :func:`jaxcomp.models.is_batch_norm`). With batch norm the
  convolution has no bias; without batch norm it has one.

  Attributes:
    features: output channels.
    kernel_size: spatial kernel size.
    strides: spatial strides.
    padding: Flax padding spec; default ``None`` means symmetric ``k // 2`` (Caffe style).
    groups: feature groups (``feature_group_count``), e.g. 2 for AlexNet's split layers.
    use_bn: apply batch norm after the convolution.
    relu: apply ReLU at the end.
    kernel_init: initialiser of the convolution kernel.
    bn_momentum: batch-norm moving-average decay.
    bn_epsilon: batch-norm epsilon.
    bn_axis_name: named axis over which batch statistics are averaged (``None``: per worker).
    dtype: compute dtype (parameters stay ``param_dtype``).
    param_dtype: parameter dtype.
  """

  features: int
  kernel_size: Sequence[int] = (3, 3)
  strides: Sequence[int] = (1, 1)
  padding: Any = None
  groups: int = 1
  use_bn: bool = True
  relu: bool = True
  kernel_init: Initializer = he_normal
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_axis_name: str | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    return conv_bn(
        x,
        self.features,
        self.kernel_size,
        train=train,
        strides=self.strides,
        padding=self.padding,
        groups=self.groups,
        use_bn=self.use_bn,
        relu=self.relu,
        kernel_init=self.kernel_init,
        **bn_settings(self),
    )
