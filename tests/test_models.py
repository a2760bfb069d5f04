"""Tests of jaxcomp.models: shapes, exact parameter counts, naming, train/eval behaviour, gradients.

Expected parameter counts are worked out by hand, layer by layer, in the comments below (the
same arithmetic is in each model's module docstring); they are not read off the models.
Big models (AlexNet, GoogLeNet at 224×224) are counted with ``jax.eval_shape`` and run for real
only once or twice at batch 1–2.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomp import models
from jaxcomp.models import (
    MODELS,
    AlexNet,
    CifarResNet,
    GoogLeNet,
    get_model,
    input_shape,
    is_batch_norm,
    is_last_layer,
    param_count,
    path_names,
)
from jaxcomp.models.layers import local_response_norm
from jaxcomp.models.resnet import shortcut_option_a

# ------------------------------------------------------------------------------------------------
# Expected parameter counts (hand arithmetic).
#
# LeNet (Caffe), 28×28×1: 28 -conv5 VALID-> 24 -pool-> 12 -conv5-> 8 -pool-> 4
#   conv1  5·5·1·20 + 20    =     520
#   conv2  5·5·20·50 + 50   =  25,050
#   fc1    4·4·50·500 + 500 = 400,500
#   logits 500·10 + 10      =   5,010
#   total                   = 431,080
LENET = 520 + 25_050 + 400_500 + 5_010
#
# CifarNet, 24×24×3: pools (3×3/2 SAME) 24 -> 12 -> 6
#   conv1  5·5·3·64 + 64     =     4,864
#   conv2  5·5·64·64 + 64    =   102,464
#   fc3    6·6·64·384 + 384  =   885,120
#   fc4    384·192 + 192     =    73,920
#   logits 192·10 + 10       =     1,930
#   total                    = 1,068,298
CIFARNET = 4_864 + 102_464 + 885_120 + 73_920 + 1_930
#
# AlexNet with BN on conv1-5 (no conv bias; BN = scale + shift = 2·C), groups=2 in conv2/4/5:
#   conv1  11·11·3·96      =     34,848   bn1   192
#   conv2  5·5·48·256      =    307,200   bn2   512
#   conv3  3·3·256·384     =    884,736   bn3   768
#   conv4  3·3·192·384     =    663,552   bn4   768
#   conv5  3·3·192·256     =    442,368   bn5   512
#   fc6    9216·4096+4096  = 37,752,832   (pool5 = 6·6·256 = 9216)
#   fc7    4096·4096+4096  = 16,781,312
#   logits 4096·1000+1000  =  4,097,000
#   total                  = 60,966,600
ALEXNET_CONV_W = 34_848 + 307_200 + 884_736 + 663_552 + 442_368  # 2,332,704
ALEXNET_CHANNELS = 96 + 256 + 384 + 384 + 256  # 1,376
ALEXNET_FC = 37_752_832 + 16_781_312 + 4_097_000  # 58,631,144
ALEXNET = ALEXNET_CONV_W + 2 * ALEXNET_CHANNELS + ALEXNET_FC
# Caffe's original (use_bn=False: conv biases instead of BN): 60,965,224.
ALEXNET_CAFFE = ALEXNET_CONV_W + ALEXNET_CHANNELS + ALEXNET_FC
# Without groups conv2/4/5 double: +307,200 +663,552 +442,368 = +1,413,120 -> 62,379,720.
ALEXNET_UNGROUPED = ALEXNET + 307_200 + 663_552 + 442_368
#
# CIFAR ResNet (option A shortcuts, no conv bias, BN = 2·C), n blocks per stage:
#   stem       3·3·3·16 + 2·16                      =    464
#   stage1     each block 2·3·3·16·16 + 2·2·16      =  4,672
#   stage2     first 3·3·16·32 + 3·3·32·32 + 2·2·32 = 13,952; others 2·3·3·32·32 + 2·2·32 = 18,560
#   stage3     first 3·3·32·64 + 3·3·64·64 + 2·2·64 = 55,552; others 2·3·3·64·64 + 2·2·64 = 73,984
#   logits     64·10 + 10                           =    650
#   total(n) = 97,216·n − 21,926


def resnet_params(n: int, num_classes: int = 10) -> int:
  return (
      464
      + 4_672 * n
      + 13_952
      + 18_560 * (n - 1)
      + 55_552
      + 73_984 * (n - 1)
      + 64 * num_classes
      + num_classes
  )


RESNET20 = 269_722  # n = 3
RESNET32 = 464_154  # n = 5
RESNET56 = 853_018  # n = 9
RESNET110 = 1_727_962  # n = 18
#
# GoogLeNet, Szegedy et al. Table 1, inception module weights
#   C·a + C·b + 9·b·c + C·d + k²·d·e + C·f   (k = 5 in the paper)
# and a+b+c+d+e+f output channels per module (each conv has BN 2·C or a bias C).
INCEPTIONS = [  # (C, a, b, c, d, e, f)
    (192, 64, 96, 128, 16, 32, 32),  # 3a: 163,328 weights, 368 channels
    (256, 128, 128, 192, 32, 96, 64),  # 3b: 388,096, 640
    (480, 192, 96, 208, 16, 48, 64),  # 4a: 375,552, 624
    (512, 160, 112, 224, 24, 64, 64),  # 4b: 448,512, 648
    (512, 128, 128, 256, 24, 64, 64),  # 4c: 509,440, 664
    (512, 112, 144, 288, 32, 64, 64),  # 4d: 604,672, 704
    (528, 256, 160, 320, 32, 128, 128),  # 4e: 867,328, 1024
    (832, 256, 160, 320, 32, 128, 128),  # 5a: 1,042,432, 1024
    (832, 384, 192, 384, 48, 128, 128),  # 5b: 1,442,816, 1264
]


def googlenet_params(use_bn: bool = True, k: int = 5, num_classes: int = 1000) -> int:
  stem_w = 7 * 7 * 3 * 64 + 64 * 64 + 3 * 3 * 64 * 192  # 9,408 + 4,096 + 110,592 = 124,096
  stem_c = 64 + 64 + 192  # 320
  inc_w = sum(
      C * a + C * b + 9 * b * c + C * d + k * k * d * e + C * f
      for C, a, b, c, d, e, f in INCEPTIONS
  )
  inc_c = sum(a + b + c + d + e + f for _, a, b, c, d, e, f in INCEPTIONS)
  per_channel = 2 if use_bn else 1
  return stem_w + inc_w + per_channel * (stem_c + inc_c) + 1024 * num_classes + num_classes


# 5,966,272 conv weights + 2·7,280 BN + 1,025,000 logits
GOOGLENET = 5_966_272 + 2 * 7_280 + 1_025_000  # 7,005,832
GOOGLENET_NO_BN = 5_966_272 + 7_280 + 1_025_000  # 6,998,552
GOOGLENET_3X3 = GOOGLENET - 380_928  # 6,624,904: 16·Σ d·e fewer weights (torchvision's figure)
#
# MLP (Dryden et al.) 784-4096-4096-4096-10:
#   fc1 784·4096 + 4096 = 3,215,360; fc2, fc3 4096·4096 + 4096 = 16,781,312 each;
#   logits 4096·10 + 10 = 40,970; total 36,818,954
MLP = 3_215_360 + 2 * 16_781_312 + 40_970

EXPECTED = {
    "lenet": LENET,
    "cifarnet": CIFARNET,
    "alexnet": ALEXNET,
    "resnet20": RESNET20,
    "resnet32": RESNET32,
    "resnet56": RESNET56,
    "resnet110": RESNET110,
    "googlenet": GOOGLENET,
    "mlp": MLP,
}
NUM_CLASSES = {"alexnet": 1000, "googlenet": 1000}
BN_MODELS = {"alexnet", "resnet20", "resnet32", "resnet56", "resnet110", "googlenet"}


def test_alexnet_last_layer_is_6_7_percent():
  """TernGrad §4.2 keeps AlexNet's last layer in float, "6.7% in AlexNet": true of this model's
  logits layer (grouped convolutions), found by the same predicate the configs use."""
  params = _abstract_init(get_model("alexnet", 1000), input_shape("alexnet"), batch=1)["params"]
  last = sum(math.prod(leaf.shape) for path, leaf in _flat_paths(params) if is_last_layer(path))
  assert last == 4096 * 1000 + 1000
  assert round(100 * last / param_count(params), 1) == 6.7


# ------------------------------------------------------------------------------------------------
# Helpers.


def _key(seed: int) -> jax.Array:
  """A PRNG key of the ``rbg`` implementation: on CPU, XLA compiles initialisers and dropout
  masks drawn from it several times faster than from the default threefry (measured here:
  about 6 s instead of 30 s to jit-init LeNet, CifarNet, MLP, ResNet-20 and AlexNet)."""
  return jax.random.key(seed, impl="rbg")


def _abstract_init(model: nn.Module, shape, batch: int = 2):
  x = jax.ShapeDtypeStruct((batch, *shape), jnp.float32)
  rngs = {"params": _key(0), "dropout": _key(1)}
  return jax.eval_shape(lambda x: model.init(rngs, x), x)


def _flat_paths(tree):
  return [(path_names(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _xent(logits, labels):
  logp = jax.nn.log_softmax(logits)
  return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def _train_step_fn(model: nn.Module):
  """Jitted loss + grads in train mode (batch stats and dropout active)."""

  @jax.jit
  def step(variables, x, y, key):
    others = {k: v for k, v in variables.items() if k != "params"}

    def loss_fn(params):
      logits, updates = model.apply(
          {"params": params, **others},
          x,
          train=True,
          mutable=["batch_stats"],
          rngs={"dropout": key},
      )
      return _xent(logits, y), (logits, updates)

    (loss, (logits, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        variables["params"]
    )
    return loss, logits, updates, grads

  return step


def _check_train_step(model, variables, x, num_classes, step=None, key=None):
  """Runs one jitted train-mode forward+backward; checks it; returns (batch-stat updates, logits)."""
  step = step or _train_step_fn(model)
  key = _key(7) if key is None else key
  y = jnp.arange(x.shape[0]) % num_classes
  loss, logits, updates, grads = step(variables, x, y, key)
  assert logits.shape == (x.shape[0], num_classes) and logits.dtype == jnp.float32
  assert np.isfinite(float(loss))
  assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(variables["params"])
  for path, g in _flat_paths(grads):
    assert np.all(np.isfinite(np.asarray(g))), path
  # The classification layer always receives gradient.
  assert float(jnp.abs(grads["logits"]["kernel"]).sum()) > 0
  assert float(jnp.abs(grads["logits"]["bias"]).sum()) > 0
  return updates, logits


# ------------------------------------------------------------------------------------------------
# Registry.


def test_registry_names():
  assert set(MODELS) == {
      "lenet",
      "cifarnet",
      "alexnet",
      "resnet20",
      "resnet32",
      "resnet56",
      "resnet110",
      "resnet",
      "googlenet",
      "mlp",
      "gpt",
      "gpt2_small",
  }
  assert set(models.INPUT_SHAPES) == set(MODELS)
  assert input_shape("alexnet") == (224, 224, 3)
  assert input_shape("lenet") == (28, 28, 1)


def test_registry_builds_the_right_modules():
  assert isinstance(get_model("resnet110", 10), CifarResNet)
  assert get_model("resnet110", 10).depth == 110
  assert get_model("ResNet-56", 10).depth == 56
  assert get_model("resnet", 100, depth=44).depth == 44
  m = get_model("alexnet", 1000, dropout_rate=0.2)
  assert isinstance(m, AlexNet) and m.dropout_rate == 0.2 and m.num_classes == 1000
  g = get_model("googlenet", 1000, dropout_rate=0.08, use_bn=False)
  assert isinstance(g, GoogLeNet) and g.dropout_rate == 0.08 and not g.use_bn
  assert get_model("mlp", 10, hidden=(32, 16)).hidden == (32, 16)


def test_registry_errors():
  with pytest.raises(ValueError) as e:
    get_model("vgg16", 10)
  for name in MODELS:
    assert name in str(e.value)
  with pytest.raises(ValueError, match="depth"):
    get_model("resnet", 10)  # generic resnet needs a depth
  with pytest.raises(ValueError, match="6n"):
    get_model("resnet", 10, depth=21)
  with pytest.raises(ValueError, match="6n"):
    get_model("resnet", 10, depth=2)
  with pytest.raises(ValueError, match="6n"):
    CifarResNet(depth=100)
  with pytest.raises(ValueError, match="depth"):
    get_model("resnet20", 10, depth=32)
  assert get_model("resnet20", 10, depth=20).depth == 20
  with pytest.raises(ValueError, match="num_classes"):
    get_model("lenet", 0)
  with pytest.raises(TypeError, match="dropout_rate"):
    get_model("lenet", 10, dropout_rate=0.5)
  with pytest.raises(ValueError, match="dropout_rate"):
    get_model("alexnet", 1000, dropout_rate=1.0)
  with pytest.raises(ValueError, match="branch3_kernel"):
    get_model("googlenet", 1000, branch3_kernel=7)
  with pytest.raises(ValueError, match="hidden"):
    get_model("mlp", 10, hidden=(0,))


# ------------------------------------------------------------------------------------------------
# Parameter counts and output shapes (abstract evaluation: no FLOPs, no memory).


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_param_count_and_output_shape(name):
  num_classes = NUM_CLASSES.get(name, 10)
  model = get_model(name, num_classes)
  variables = _abstract_init(model, input_shape(name), batch=3)
  assert param_count(variables["params"]) == EXPECTED[name]
  assert ("batch_stats" in variables) == (name in BN_MODELS)
  out = jax.eval_shape(lambda v: model.apply(v, jnp.zeros((3, *input_shape(name)))), variables)
  assert out.shape == (3, num_classes) and out.dtype == jnp.float32


def test_compute_dtype_attribute_everywhere():
  # Every model takes dtype=bfloat16: parameters stay float32, logits come back float32
  # (the language models: tests/test_models_gpt.py).
  for name in sorted(set(MODELS) - set(models.LANGUAGE_MODELS)):
    kw = {"depth": 8} if name == "resnet" else {}
    model = get_model(name, 10, dtype=jnp.bfloat16, **kw)
    size = (64, 64, 3) if name in ("alexnet", "googlenet") else input_shape(name)
    v = _abstract_init(model, size)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(v)), name
    out = jax.eval_shape(lambda v: model.apply(v, jnp.zeros((2, *size))), v)
    assert out.dtype == jnp.float32 and out.shape == (2, 10), name


@pytest.mark.parametrize(
    "name, kwargs, expected",
    [
        ("alexnet", {"use_bn": False}, ALEXNET_CAFFE),
        ("alexnet", {"grouped": False}, ALEXNET_UNGROUPED),
        ("googlenet", {"use_bn": False}, GOOGLENET_NO_BN),
        ("googlenet", {"branch3_kernel": 3}, GOOGLENET_3X3),
        ("resnet", {"depth": 44}, resnet_params(7)),  # 658,586
        ("mlp", {"hidden": (100,)}, 784 * 100 + 100 + 100 * 10 + 10),  # 79,510
        ("mlp", {"hidden": ()}, 784 * 10 + 10),  # linear classifier
    ],
)
def test_param_count_variants(name, kwargs, expected):
  num_classes = NUM_CLASSES.get(name, 10)
  variables = _abstract_init(get_model(name, num_classes, **kwargs), input_shape(name))
  assert param_count(variables["params"]) == expected


def test_param_count_other_num_classes():
  # Only the logits layer changes: (d + 1) · num_classes.
  v = _abstract_init(get_model("resnet20", 100), (32, 32, 3))
  assert param_count(v["params"]) == resnet_params(3, num_classes=100)  # 275,572
  v = _abstract_init(get_model("googlenet", 10), (224, 224, 3))
  assert param_count(v["params"]) == googlenet_params(num_classes=10)


def test_feature_map_sizes_follow_caffe():
  """AlexNet at 224 reproduces Caffe's 55/27/13/6 maps; GoogLeNet reaches 7×7 before pooling."""

  def shapes(model, size):
    x = jnp.zeros((1, size, size, 3))

    def run(x):
      v = model.init(_key(0), x)
      _, state = model.apply(v, x, capture_intermediates=True, mutable=["intermediates"])
      return state["intermediates"]

    inter = jax.eval_shape(run, x)
    return {
        path_names(p)[:-1]: leaf.shape for p, leaf in jax.tree_util.tree_flatten_with_path(inter)[0]
    }

  a = shapes(AlexNet(), 224)
  assert a[("conv1", "__call__")] == (1, 55, 55, 96)
  assert a[("conv2", "__call__")] == (1, 27, 27, 256)
  assert a[("conv5", "__call__")] == (1, 13, 13, 256)
  g = shapes(GoogLeNet(), 224)
  assert g[("conv1", "__call__")] == (1, 112, 112, 64)
  assert g[("inception3a", "__call__")] == (1, 28, 28, 256)
  assert g[("inception4e", "__call__")] == (1, 14, 14, 832)
  assert g[("inception5b", "__call__")] == (1, 7, 7, 1024)


# ------------------------------------------------------------------------------------------------
# Naming convention and path helpers.


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_naming_convention(name):
  num_classes = NUM_CLASSES.get(name, 10)
  variables = _abstract_init(get_model(name, num_classes), input_shape(name))
  params = _flat_paths(variables["params"])
  last = [(p, leaf) for p, leaf in params if is_last_layer(p)]
  # The last layer is a dense layer named `logits` at the top level with num_classes outputs.
  assert sorted(p for p, _ in last) == [("logits", "bias"), ("logits", "kernel")]
  assert dict((p[-1], leaf.shape) for p, leaf in last)["bias"] == (num_classes,)
  bn = [(p, leaf) for p, leaf in params if is_batch_norm(p)]
  if name in BN_MODELS:
    assert bn and all(p[-1] in ("scale", "bias") and leaf.ndim == 1 for p, leaf in bn)
    # Convolutions feed batch norm, so they have no bias.
    keys = {p for p, _ in params}
    conv_modules = [p[:-1] for p, leaf in params if p[-1] == "kernel" and leaf.ndim == 4]
    assert conv_modules and not any((*m, "bias") in keys for m in conv_modules)
    for p, _ in _flat_paths(variables["batch_stats"]):
      assert is_batch_norm(p) and p[-1] in ("mean", "var")
  else:
    assert not bn
  # Every non-BN leaf belongs to a named conv/dense layer (no automatic Flax names).
  for p, _ in params:
    assert not any(part.startswith(("Conv_", "Dense_", "BatchNorm_")) for part in p), p


def test_batch_norm_parameter_totals():
  # ResNet-20: BN over 16 (stem) + 3·2·16 + 3·2·32 + 3·2·64 = 688 channels -> 1,376 params.
  v = _abstract_init(get_model("resnet20", 10), (32, 32, 3))
  assert (
      sum(math.prod(leaf.shape) for p, leaf in _flat_paths(v["params"]) if is_batch_norm(p))
      == 1_376
  )
  # AlexNet: 2 · 1,376 channels.
  v = _abstract_init(get_model("alexnet", 1000), (224, 224, 3))
  assert (
      sum(math.prod(leaf.shape) for p, leaf in _flat_paths(v["params"]) if is_batch_norm(p))
      == 2_752
  )


def test_path_helpers_accept_all_path_forms():
  tree = {"params": {"logits": {"kernel": 1}, "stage1_block1": {"bn2": {"scale": 2}}}}
  flat = {path_names(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  assert flat == {("params", "logits", "kernel"): 1, ("params", "stage1_block1", "bn2", "scale"): 2}
  for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    assert is_last_layer(p) == ("logits" in path_names(p))
  assert is_last_layer("params/logits/bias") and is_last_layer(("params", "logits", "bias"))
  assert not is_last_layer(("params", "fc7", "kernel"))
  for yes in ["bn", "bn1", "conv1_bn", "bn_proj", "BatchNorm_0", "BN3", "block_bn2_x"]:
    assert is_batch_norm(("params", yes, "scale")), yes
  for no in ["conv1", "fc6", "logits", "abnormal", "branch5x5", "inception4b", "ebn"]:
    assert not is_batch_norm(("params", no, "kernel")), no
  # GetAttrKey / SequenceKey entries work too.
  seq = jax.tree_util.tree_flatten_with_path([{"bn": 1}])[0][0][0]
  assert path_names(seq) == ("0", "bn") and is_batch_norm(seq)
  assert param_count({"a": jnp.zeros((3, 4)), "b": jax.ShapeDtypeStruct((5,), jnp.float32)}) == 17


# ------------------------------------------------------------------------------------------------
# Layers.


def test_local_response_norm_matches_tf_definition():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 3, 11)).astype(np.float32)
  r, bias, alpha, beta = 4, 1.0, 0.001 / 9.0, 0.75
  ref = np.empty_like(x)
  for c in range(x.shape[-1]):
    lo, hi = max(0, c - r), min(x.shape[-1], c + r + 1)
    sqr = np.sum(x[..., lo:hi] ** 2, axis=-1)
    ref[..., c] = x[..., c] / (bias + alpha * sqr) ** beta
  np.testing.assert_allclose(
      np.asarray(local_response_norm(x, r, bias, alpha, beta)), ref, rtol=1e-5
  )
  # Strong normalisation, to make sure alpha/beta are not silently ignored.
  np.testing.assert_allclose(
      np.asarray(local_response_norm(x, 1, 2.0, 1.0, 0.5)),
      x
      / np.sqrt(
          2.0 + sum(np.pad(x**2, [(0, 0)] * 3 + [(1, 1)])[..., i : i + 11] for i in range(3))
      ),
      rtol=1e-5,
  )
  bf = local_response_norm(jnp.asarray(x, jnp.bfloat16), r, bias, alpha, beta)
  assert bf.dtype == jnp.bfloat16
  with pytest.raises(ValueError):
    local_response_norm(x, -1)


def test_option_a_shortcut():
  x = jnp.arange(2 * 4 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 4, 3)
  y = shortcut_option_a(x, 6, 2)
  assert y.shape == (2, 2, 2, 6)
  np.testing.assert_array_equal(y[..., :3], x[:, ::2, ::2, :])
  np.testing.assert_array_equal(y[..., 3:], 0)
  np.testing.assert_array_equal(shortcut_option_a(x, 3, 1), x)
  # The shortcut has no parameters: the downsampling block holds exactly two conv-BN pairs.
  v = _abstract_init(get_model("resnet20", 10), (32, 32, 3))
  assert set(v["params"]["stage2_block1"]) == {"conv1", "bn1", "conv2", "bn2"}
  assert v["params"]["stage2_block1"]["conv1"]["kernel"].shape == (3, 3, 16, 32)


# ------------------------------------------------------------------------------------------------
# Real forward/backward passes: small models at their real input size.


@pytest.mark.parametrize("name", ["lenet", "cifarnet", "mlp"])
def test_small_models_forward_backward(name):
  model = get_model(name, 10)
  x = jax.random.normal(_key(1), (4, *input_shape(name)))
  variables = jax.jit(model.init)(_key(0), x)
  assert param_count(variables["params"]) == EXPECTED[name]
  for leaf in jax.tree_util.tree_leaves(variables):
    assert leaf.dtype == jnp.float32
  # No dropout, no batch norm: train and eval mode are the same function.
  out_eval = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
  _, out_train = _check_train_step(model, variables, x, 10)
  np.testing.assert_allclose(out_eval, out_train, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def resnet20_setup():
  model = get_model("resnet20", 10)
  x = jax.random.normal(_key(1), (4, 32, 32, 3))
  variables = jax.jit(model.init)(_key(0), x)
  return model, variables, x


def test_initialisers(resnet20_setup):
  # He normal: std = sqrt(2 / fan_in); ResNet-20 stage-3 convs, fan_in = 3·3·64 = 576.
  _, v, _ = resnet20_setup
  k = np.concatenate(
      [np.ravel(v["params"][f"stage3_block{b}"]["conv2"]["kernel"]) for b in (1, 2, 3)]
  )
  assert abs(k.std() / math.sqrt(2 / 576) - 1) < 0.02
  assert abs(k.mean()) < 0.002
  # Caffe "xavier" (fan-in uniform): conv1 fan_in = 25, bound sqrt(3/25).
  lenet = get_model("lenet", 10)
  v = jax.jit(lenet.init)(_key(0), jnp.zeros((1, 28, 28, 1)))
  k = np.asarray(v["params"]["fc1"]["kernel"])  # fan_in 800
  assert np.abs(k).max() <= math.sqrt(3 / 800) + 1e-7
  assert abs(k.std() / math.sqrt(1 / 800) - 1) < 0.02
  assert np.all(np.asarray(v["params"]["conv1"]["bias"]) == 0)


def test_compute_dtype_bfloat16():
  model = get_model("cifarnet", 10, dtype=jnp.bfloat16)
  x = jax.random.normal(_key(1), (2, 24, 24, 3))
  v = jax.jit(model.init)(_key(0), x)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(v))
  out = jax.jit(model.apply)(v, x)
  assert out.dtype == jnp.float32
  ref = jax.jit(get_model("cifarnet", 10).apply)(v, x)
  np.testing.assert_allclose(out, ref, rtol=0.1, atol=0.1 * float(jnp.abs(ref).max()))


def test_resnet20_batch_norm_train_vs_eval(resnet20_setup):
  model, variables, x = resnet20_setup
  assert param_count(variables["params"]) == RESNET20
  stats0 = variables["batch_stats"]
  assert float(jnp.abs(stats0["bn1"]["mean"]).max()) == 0.0

  step = _train_step_fn(model)
  updates, train_x = _check_train_step(model, variables, x, 10, step=step)
  # Training updates the running statistics (momentum 0.9 towards the batch statistics).
  new_mean = updates["batch_stats"]["bn1"]["mean"]
  assert float(jnp.abs(new_mean).max()) > 0
  assert jax.tree_util.tree_structure(updates["batch_stats"]) == jax.tree_util.tree_structure(
      stats0
  )

  # Train mode normalises with batch statistics: sample 0's output depends on the others.
  x2 = x.at[1:].multiply(3.0).at[1:].add(1.0)
  _, train_x2 = _check_train_step(model, variables, x2, 10, step=step)
  assert not np.allclose(train_x[0], train_x2[0], atol=1e-4)
  # Eval mode uses the running averages: sample 0's output is independent of the batch.
  evals = jax.jit(lambda xx: model.apply(variables, xx, train=False))
  np.testing.assert_allclose(evals(x)[0], evals(x2)[0], rtol=1e-5, atol=1e-5)
  # Train mode must be told that batch_stats is mutable.
  with pytest.raises(Exception, match="batch_stats"):
    jax.eval_shape(lambda v: model.apply(v, x, train=True), variables)


# ------------------------------------------------------------------------------------------------
# Big models: one real init each, shared by the tests below.


@pytest.fixture(scope="module")
def alexnet_setup():
  model = get_model("alexnet", 1000)  # dropout 0.5
  x = jax.random.normal(_key(1), (2, 224, 224, 3))
  variables = jax.jit(model.init)(_key(0), x[:1])
  return model, variables, x, _train_step_fn(model)


def test_alexnet_real_forward_and_backward(alexnet_setup):
  model, variables, x, step = alexnet_setup
  assert param_count(variables["params"]) == ALEXNET
  # Eval: deterministic without a dropout rng, batch 1 at the real input size.
  evals = jax.jit(lambda v, x: model.apply(v, x))
  out = evals(variables, x[:1])
  assert out.shape == (1, 1000) and np.all(np.isfinite(out))
  np.testing.assert_array_equal(out, evals(variables, x[:1]))
  updates, _ = _check_train_step(model, variables, x, 1000, step=step)
  assert set(updates["batch_stats"]) == {f"bn{i}" for i in range(1, 6)}


def test_alexnet_dropout_in_training_only(alexnet_setup):
  model, variables, x, step = alexnet_setup
  # Train mode (BN on batch statistics, deterministic given the batch): the dropout key alone
  # changes the logits, and the same key reproduces them.
  _, a = _check_train_step(model, variables, x, 1000, step=step, key=_key(1))
  _, b = _check_train_step(model, variables, x, 1000, step=step, key=_key(2))
  _, a2 = _check_train_step(model, variables, x, 1000, step=step, key=_key(1))
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(a, a2)


def _he_filled(abstract_variables, seed: int = 0):
  """Concrete variables for abstract ones, filled with NumPy: He-scaled kernels, BN scale/var 1.

  Compiling GoogLeNet's ``init`` takes 10-20 s on 2 cores; the initialisers themselves are the
  ones tested on ResNet-20 and LeNet, so the GoogLeNet tests fill the variables directly.
  """
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = path_names(path)[-1]
    if name == "kernel":
      std = math.sqrt(2.0 / math.prod(leaf.shape[:-1]))
      return jnp.asarray(rng.standard_normal(leaf.shape, dtype=np.float32) * std)
    if name in ("scale", "var"):
      return jnp.ones(leaf.shape, leaf.dtype)
    return jnp.zeros(leaf.shape, leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, abstract_variables)


@pytest.fixture(scope="module")
def googlenet_setup():
  # Parameter shapes do not depend on the input size (global average pooling), so the train
  # step runs on 32×32 images (fast to compile) and the real 224×224 input is run once.
  model = get_model("googlenet", 1000)
  variables = _he_filled(_abstract_init(model, (224, 224, 3), batch=1))
  return model, variables


def test_googlenet_real_forward_224(googlenet_setup):
  model, variables = googlenet_setup
  assert param_count(variables["params"]) == GOOGLENET
  x = jax.random.normal(_key(1), (1, 224, 224, 3))
  out = jax.jit(lambda v, x: model.apply(v, x))(variables, x)
  assert out.shape == (1, 1000) and np.all(np.isfinite(out))


def test_googlenet_train_step_and_dropout(googlenet_setup):
  model, variables = googlenet_setup
  assert variables["params"]["inception3a"]["branch5x5"]["conv"]["kernel"].shape == (5, 5, 16, 32)
  x = jax.random.normal(_key(1), (2, 32, 32, 3))
  step = _train_step_fn(model)
  updates, a = _check_train_step(model, variables, x, 1000, step=step, key=_key(1))
  assert "bn" in updates["batch_stats"]["inception5b"]["branch5x5"]
  # Dropout (0.4) before logits acts in training: another key, other logits.
  _, b = _check_train_step(model, variables, x, 1000, step=step, key=_key(2))
  assert not np.allclose(a, b)
