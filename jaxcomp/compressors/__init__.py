"""Every compressor, one file each, and the registry configs pick them from.

``get_transform(name, **kwargs)`` builds the optax transform of a registered
compressor, e.g. ``get_transform("terngrad", axis_name="workers", clip_sigma=2.5)``;
``config.compressor`` and ``config.compressor_kwargs`` of the experiment configs
go straight through it.
"""

from __future__ import annotations

from typing import Any, Callable

import optax

from jaxcomp import transforms
from jaxcomp.compressors.terngrad import TernGrad, terngrad

# name -> factory(**kwargs) -> optax.GradientTransformationExtraArgs.
# Every factory accepts the keyword arguments of jaxcomp.compress
# (axis_name, skip, min_size, seed, nonfinite, error_feedback).
REGISTRY: dict[str, Callable[..., optax.GradientTransformationExtraArgs]] = {
    "none": transforms.pmean,
    "terngrad": terngrad,
}


def names() -> list[str]:
  return sorted(REGISTRY)


def get_transform(name: str, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """The optax transform of compressor ``name`` with keyword arguments."""
  try:
    factory = REGISTRY[name]
  except KeyError:
    raise ValueError(f"Unknown compressor {name!r}; known: {', '.join(names())}.") from None
  try:
    return factory(**kwargs)
  except TypeError as e:
    raise TypeError(f"Bad arguments for compressor {name!r}: {e}") from None
