"""The papers' models in Flax (``flax.linen``), and a registry.

==========  =====================================================  ===========  ===============
name        paper / where                                          input        parameters
==========  =====================================================  ===========  ===============
lenet       Caffe LeNet; TernGrad §4.1, Fig. 3 (MNIST)             28×28×1          431,080
cifarnet    TF CIFAR-10 tutorial net; TernGrad §4.1, Table 1       24×24×3        1,068,298
alexnet     AlexNet + BN on convs; TernGrad §4.2, Table 2          224×224×3     60,966,600
resnet20    He et al. 2015 §4.2 (option A)                         32×32×3          269,722
resnet32    "                                                      32×32×3          464,154
resnet56    "                                                      32×32×3          853,018
resnet110   "; 3LC §4.3, QSGD §5                                   32×32×3        1,727,962
resnet      generic CIFAR ResNet, ``depth=6n+2`` keyword           32×32×3      97,216n − 21,926
googlenet   Inception v1 + BN, no aux heads; TernGrad Table 3      224×224×3      7,005,832
mlp         784-4096-4096-4096-10; Dryden et al. §4.1              28×28×1       36,818,954
gpt         GPT-2 layout, pre-LN, tied embeddings (CPU size)       256 tokens     3,290,624
gpt2_small  GPT-2 small: d 768, 12 layers, 12 heads, context 1024  1024 tokens  124,439,808
==========  =====================================================  ===========  ===============

(parameters for the default ``num_classes``: 1000 for alexnet/googlenet, 10 otherwise, and for
the language models the vocabulary: 256 bytes for gpt, GPT-2's 50,257 tokens for gpt2_small; the
layer-by-layer arithmetic is in each module's docstring and in ``tests/test_models.py`` and
``tests/test_models_gpt.py``.)

The language models (:data:`LANGUAGE_MODELS`) take integer tokens ``[batch, time]`` instead of
images and return logits ``[batch, time, num_classes]``, ``num_classes`` being the vocabulary;
their ``input_shape`` is ``(context,)``. Their token embedding, tied to the output layer, is
named ``logits``.

Interface. Every model is a ``flax.linen.Module`` with ``__call__(self, x, train: bool = False)``:
``x`` is a float NHWC batch, the result is float32 logits of shape ``(batch, num_classes)``
(no softmax). Models with batch norm (alexnet, resnet*, googlenet) keep running statistics in the
``batch_stats`` collection: in training call ``model.apply(variables, x, train=True,
mutable=['batch_stats'], rngs={'dropout': key})``. Dropout (alexnet, googlenet) uses the
``'dropout'`` rng. Every model has ``dtype`` (compute) and ``param_dtype`` (parameters, float32)
attributes; initialisers are attributes too (see :mod:`jaxcomp.models.layers`).

Naming convention (other code relies on it; keep it when adding a model):

* Every module has an explicit, meaningful name, so a parameter's key path names its layer, e.g.
  ``('params', 'conv1', 'kernel')``, ``('params', 'stage2_block1', 'bn1', 'scale')``,
  ``('params', 'inception4a', 'branch5x5', 'conv', 'kernel')``.
* The last (classification) layer of every model is named ``logits``; no other module may use
  that name. :func:`is_last_layer` tests for it (TernGrad §4.2 keeps that layer's gradients in
  float).
* Batch-norm modules are named ``bn``, ``bn<digits>``, or contain ``bn`` as an ``_``-separated
  word (``conv1_bn``), or contain ``BatchNorm`` (Flax's automatic name); nothing else may. The
  word ``bn`` must not appear in other module names. :func:`is_batch_norm` tests for it (3LC §4.3
  leaves batch-norm tensors uncompressed).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import Any

import flax.linen as nn
import jax

from jaxcomp.models.alexnet import AlexNet
from jaxcomp.models.cifarnet import CifarNet
from jaxcomp.models.googlenet import GoogLeNet
from jaxcomp.models.gpt import GPT
from jaxcomp.models.lenet import LeNet
from jaxcomp.models.mlp import MLP
from jaxcomp.models.resnet import CifarResNet, blocks_per_stage

__all__ = [
    "MODELS",
    "INPUT_SHAPES",
    "AlexNet",
    "CifarNet",
    "CifarResNet",
    "GoogLeNet",
    "GPT",
    "LANGUAGE_MODELS",
    "LeNet",
    "MLP",
    "get_model",
    "input_shape",
    "is_batch_norm",
    "is_last_layer",
    "param_count",
    "path_names",
]

LAST_LAYER_NAME = "logits"

# name -> (class, fixed keyword arguments)
_REGISTRY: dict[str, tuple[type[nn.Module], dict[str, Any]]] = {
    "lenet": (LeNet, {}),
    "cifarnet": (CifarNet, {}),
    "alexnet": (AlexNet, {}),
    "resnet20": (CifarResNet, {"depth": 20}),
    "resnet32": (CifarResNet, {"depth": 32}),
    "resnet56": (CifarResNet, {"depth": 56}),
    "resnet110": (CifarResNet, {"depth": 110}),
    "resnet": (CifarResNet, {}),
    "googlenet": (GoogLeNet, {}),
    "mlp": (MLP, {}),
    "gpt": (GPT, {}),
    "gpt2_small": (GPT, {"context": 1024, "width": 768, "depth": 12, "heads": 12}),
}

MODELS: tuple[str, ...] = tuple(_REGISTRY)

# The models that take integer tokens [batch, time] and predict the next token at every position.
LANGUAGE_MODELS: tuple[str, ...] = ("gpt", "gpt2_small")

# The input each model is specified for in its paper: (H, W, C) of an image, (context,) of tokens.
INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "lenet": (28, 28, 1),
    "cifarnet": (24, 24, 3),
    "alexnet": (224, 224, 3),
    "resnet20": (32, 32, 3),
    "resnet32": (32, 32, 3),
    "resnet56": (32, 32, 3),
    "resnet110": (32, 32, 3),
    "resnet": (32, 32, 3),
    "googlenet": (224, 224, 3),
    "mlp": (28, 28, 1),
    "gpt": (256,),
    "gpt2_small": (1024,),
}


def _normalise(name: str) -> str:
  if not isinstance(name, str):
    raise ValueError(f"model name must be a string, got {name!r}; known: {', '.join(MODELS)}")
  key = name.strip().lower().replace("-", "")
  if key not in _REGISTRY:
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
  return key


def get_model(name: str, num_classes: int, **kwargs: Any) -> nn.Module:
  """Builds a registered model.

  Args:
    name: one of :data:`MODELS` (case-insensitive; ``"resnet-110"`` is accepted too).
    num_classes: size of the ``logits`` layer.
    **kwargs: attributes of the model class, e.g. ``dropout_rate=0.2`` for alexnet,
      ``use_bn=False`` for googlenet, ``hidden=(1024,)`` for mlp, ``dtype=jnp.bfloat16``.
      ``"resnet"`` requires ``depth``; the fixed-depth names accept only their own depth.

  Returns:
    An unbound ``flax.linen.Module``.

  Raises:
    ValueError: unknown name, bad ``num_classes``, missing/invalid/conflicting ``depth``, or an
      invalid attribute value.
    TypeError: a keyword argument the model does not have.
  """
  key = _normalise(name)
  if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
    raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
  cls, fixed = _REGISTRY[key]
  fields = {f.name for f in dataclasses.fields(cls) if f.init} - {"parent", "name"}
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise TypeError(
        f"{key}: unexpected argument(s) {unknown}; {cls.__name__} accepts {sorted(fields)}"
    )
  if "num_classes" in kwargs:
    raise TypeError("pass num_classes positionally to get_model, not in kwargs")
  for k, v in fixed.items():
    if k in kwargs and kwargs[k] != v:
      raise ValueError(f"{key} has {k}={v}; got {k}={kwargs[k]!r} (use 'resnet' with depth=)")
  if key == "resnet":
    if "depth" not in kwargs:
      raise ValueError("'resnet' needs a depth keyword, e.g. get_model('resnet', 10, depth=44)")
    blocks_per_stage(kwargs["depth"])
  return cls(num_classes=num_classes, **{**kwargs, **fixed})


def input_shape(name: str) -> tuple[int, ...]:
  """The input a registered model is specified for: (H, W, C), or (context,) of a language model."""
  return INPUT_SHAPES[_normalise(name)]


# ---------------------------------------------------------------------------------------------
# Key-path helpers.

_BN_WORD = re.compile(r"(^|_)bn\d*(_|$)", re.IGNORECASE)


def _key_name(entry: Any) -> str:
  """The name in one key-path entry (DictKey, GetAttrKey, SequenceKey, ... or a plain value)."""
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def path_names(path: Iterable[Any] | str) -> tuple[str, ...]:
  """Normalises a key path to a tuple of strings.

  Accepts a key path from ``jax.tree_util.tree_flatten_with_path`` /
  ``tree_map_with_path`` (``DictKey``/``GetAttrKey``/``SequenceKey`` entries), a tuple of strings
  (``flax.traverse_util.flatten_dict``), or a ``'/'``-separated string.
  """
  if isinstance(path, str):
    return tuple(p for p in path.split("/") if p)
  return tuple(_key_name(entry) for entry in path)


def is_last_layer(path: Iterable[Any] | str) -> bool:
  """True if the path lies in a model's last classification layer (a component ``logits``).

  Example::

      mask = jax.tree_util.tree_map_with_path(lambda p, _: not is_last_layer(p), params)
  """
  return LAST_LAYER_NAME in path_names(path)


def is_batch_norm(path: Iterable[Any] | str) -> bool:
  """True if the path lies in a batch-norm module.

  A component counts as batch norm if it is ``bn``/``bn<digits>``, contains such a word between
  underscores (``conv1_bn``, ``bn_proj``), or contains ``batchnorm`` (any case; Flax's automatic
  ``BatchNorm_0``). Works on ``params`` and ``batch_stats`` paths alike.
  """
  return any(_BN_WORD.search(n) is not None or "batchnorm" in n.lower() for n in path_names(path))


def param_count(params: Any) -> int:
  """Number of scalars in a pytree of arrays (or ``jax.ShapeDtypeStruct`` from ``eval_shape``).

  Pass ``variables['params']``: the whole ``variables`` dict would also count ``batch_stats``.
  """
  return sum(math.prod(getattr(leaf, "shape", ())) for leaf in jax.tree_util.tree_leaves(params))
