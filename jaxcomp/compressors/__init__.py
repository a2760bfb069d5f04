"""Every compressor, one file each, and the registry configs pick them from.

``get_transform(name, **kwargs)`` builds the optax transform of a registered
compressor, e.g. ``get_transform("terngrad", axis_name="workers", clip_sigma=2.5)``;
``make_optimizer(name, optimizer, **kwargs)`` puts it in front of an optimizer
(``optax.chain(compressor, optimizer)``, or the compressor's own wrapper for
schemes that change when the optimizer steps, such as local steps).
``config.compressor`` and ``config.compressor_kwargs`` of the experiment configs
go straight through it.
"""

from __future__ import annotations

from typing import Any, Callable

import optax

from jaxcomp import hyperparams
from jaxcomp import transforms
from jaxcomp.compressors.terngrad import TernGrad, terngrad
from jaxcomp.compressors.qsgd import QSGD, qsgd
from jaxcomp.compressors.threelc import ThreeLC, threelc
from jaxcomp.compressors.int8 import Int8, int8
from jaxcomp.compressors.stochastic_ternary import StochasticTernary, stochastic_ternary
from jaxcomp.compressors.signsgd import SignSGD, signsgd
from jaxcomp.compressors.ef_signsgd import EFSignSGD, ef_signsgd
from jaxcomp.compressors.onebit import OneBit, onebit
from jaxcomp.compressors.topk import TopK, topk
from jaxcomp.compressors.powersgd import PowerSGD, powersgd
from jaxcomp.compressors.diloco import diloco
from jaxcomp.compressors.local_steps import local_steps
from jaxcomp.compressors.onebit_adam import OneBitAdamSign, onebit_adam, wrap_optimizer as _wrap_onebit_adam
from jaxcomp.compressors.threshold import Threshold, threshold
from jaxcomp.compressors.adaptive import Adaptive, adaptive
from jaxcomp.compressors.signum import Signum, signum
from jaxcomp.compressors.dgc import DGC, dgc
from jaxcomp.compressors.half import Half, half
from jaxcomp.compressors.randomk import RandomK, randomk
from jaxcomp.compressors.natural import Natural, natural
from jaxcomp.compressors.fp4 import FP4, fp4
from jaxcomp.compressors.blockint import BlockInt, blockint
from jaxcomp.compressors.demo import DCTTopK, demo, wrap_optimizer as _wrap_demo


@hyperparams.factory()
def _uncompressed(**kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """The float baseline ``"none"``: ``jaxcomp.compress(None, **kwargs)``, every tensor averaged in float."""
  return transforms.compress(None, **kwargs)


# name -> factory(**kwargs) -> optax.GradientTransformationExtraArgs.
# Every factory accepts the keyword arguments of jaxcomp.compress
# (axis_name, skip, min_size, seed, nonfinite, error_feedback, exchange).
REGISTRY: dict[str, Callable[..., optax.GradientTransformationExtraArgs]] = {
    "none": _uncompressed,
    "terngrad": terngrad,
    "qsgd": qsgd,
    "threelc": threelc,
    "int8": int8,
    "stochastic_ternary": stochastic_ternary,
    "signsgd": signsgd,
    "ef_signsgd": ef_signsgd,
    "onebit": onebit,
    "topk": topk,
    "powersgd": powersgd,
    "threshold": threshold,
    "adaptive": adaptive,
    "signum": signum,
    "dgc": dgc,
    "half": half,
    "randomk": randomk,
    "natural": natural,
    "fp4": fp4,
    "blockint": blockint,
}


# name -> wrapper(optimizer, **kwargs) -> optax.GradientTransformation, for
# schemes that decide when the optimizer steps (they cannot be a chain link).
WRAPPERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "local_steps": local_steps,
    "diloco": diloco,
    "onebit_adam": _wrap_onebit_adam,  # 1-bit Adam is the optimizer: `optimizer` only scales
    "demo": _wrap_demo,  # so is DeMo
}


def names() -> list[str]:
  """The registered names: compressors (`REGISTRY`) and optimizer wrappers such as local steps."""
  return sorted(set(REGISTRY) | set(WRAPPERS))


def get_transform(name: str, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """The optax transform of compressor ``name`` with keyword arguments."""
  if name in WRAPPERS:
    raise ValueError(f"{name!r} wraps the optimizer: use make_optimizer({name!r}, optimizer, ...).")
  try:
    factory = REGISTRY[name]
  except KeyError:
    raise ValueError(f"Unknown compressor {name!r}; known: {', '.join(names())}.") from None
  try:
    return factory(**kwargs)
  except TypeError as e:
    raise TypeError(f"Bad arguments for compressor {name!r}: {e}") from None


def make_optimizer(
    name: str, optimizer: optax.GradientTransformation, **kwargs: Any
) -> optax.GradientTransformation:
  """The compressed exchange of ``name`` followed by ``optimizer``."""
  if name in WRAPPERS:
    try:
      return WRAPPERS[name](optimizer, **kwargs)
    except TypeError as e:
      raise TypeError(f"Bad arguments for compressor {name!r}: {e}") from None
  return optax.chain(get_transform(name, **kwargs), optimizer)
