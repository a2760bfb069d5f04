"""Compressor hyperparameters under ``optax.inject_hyperparams``: which may be traced, which stay static.

``optax.inject_hyperparams(factory)(...)`` calls ``factory`` again at every
update with its numeric arguments replaced by JAX arrays (traced under
``jit``), so that they can be changed in the state or follow a schedule. For
a jaxcomp factory that means:

* a hyperparameter that fixes no shape (TernGrad's ``clip_sigma``, 3LC's
  ``sparsity``, threshold's ``tau``, Signum's ``beta``, DGC's ``momentum``,
  a wrapper's learning rate ...) may be a traced scalar: the compressor reads
  it as a JAX value, and the checks of its range apply to concrete values
  only (:func:`concrete`, :func:`check_number`);
* a hyperparameter that fixes a shape or the wire format (bits, bucket
  sizes, capacities, sample sizes, a fraction that sizes the payload) must be
  a Python value: given as an array it is a ``TypeError`` naming it and
  saying why, and with ``optax.inject_hyperparams`` it goes in
  ``static_args`` (every factory lists its own as ``factory.static_args``);
* the keyword arguments a factory passes on to :func:`jaxcomp.compress`
  (``axis_name``, ``skip``, ``min_size`` ...) are all static: optax hands a
  factory's ``**kwargs`` back as one argument named after them (a dict, which
  it leaves alone), and :func:`factory` unpacks it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import jax
import numpy as np


def is_traced(value: Any) -> bool:
  """Whether ``value`` is a JAX array (concrete or traced): a hyperparameter injected by optax."""
  return isinstance(value, jax.Array)


def concrete(value: Any) -> Optional[float]:
  """``value`` as a Python float if it is known now (a number, or a concrete scalar array); ``None`` if traced."""
  if isinstance(value, jax.core.Tracer):
    return None
  return float(np.asarray(value))


def is_number(value: Any) -> bool:
  """A real number: a Python or NumPy int or float (not a bool), or a scalar int or float array."""
  if isinstance(value, (bool, np.bool_)):
    return False
  if isinstance(value, (int, float, np.integer, np.floating)):
    return True
  return (isinstance(value, (jax.Array, np.ndarray)) and np.shape(value) == ()
          and (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)))


def check_number(value: Any, name: str, ok: Callable[[float], bool], expected: str) -> None:
  """Raises ``ValueError`` "``name`` must be ``expected``" unless ``value`` is a number and, if concrete, ``ok``.

  A traced scalar passes (its value is not known until the step runs).
  """
  if not is_number(value):
    raise ValueError(f"{name} must be {expected}; got {value!r}.")
  v = concrete(value)
  if v is not None and not ok(v):
    raise ValueError(f"{name} must be {expected}; got {value!r}.")


def check_static(owner: str, static: dict[str, str], arguments: dict[str, Any]) -> None:
  """Raises ``TypeError`` if an argument of ``static`` (name -> what it fixes) is a JAX array."""
  given = [name for name in static if is_traced(arguments.get(name))]
  if given:
    why = "; ".join(f"`{name}` fixes {static[name]}" for name in given)
    raise TypeError(
        f"jaxcomp.{owner}: {why}, so it must be a Python value, not a traced value or a schedule. "
        f"With optax.inject_hyperparams, name it in static_args: "
        f"optax.inject_hyperparams(jaxcomp.{owner}, static_args={tuple(static)!r}) "
        f"(jaxcomp.{owner}.static_args lists them all).")


def factory(**static: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """Decorates a compressor factory so that it works under ``optax.inject_hyperparams``.

  The factory then

  * accepts its ``**kwargs`` packed in one argument of their name, as
    ``optax.inject_hyperparams`` passes them (``kwargs={...}``), so that
    ``optax.inject_hyperparams(jaxcomp.terngrad)(clip_sigma=s, axis_name="w")``
    works and the options for :func:`jaxcomp.compress` stay static;
  * refuses a JAX array for each argument of ``static`` (name -> what it
    fixes: a shape, the wire format), naming it and saying to put it in
    ``static_args``;
  * lists those names as its attribute ``static_args``.

  Args:
    **static: the factory's arguments that must be Python values, each with
      what it fixes (completing "``name`` fixes ...").
  """

  def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(fn)
    packed = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    unknown = set(static) - set(signature.parameters)
    if unknown:
      raise TypeError(f"{fn.__name__} has no arguments {sorted(unknown)}.")

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      if packed is not None and isinstance(kwargs.get(packed), dict):
        options = kwargs.pop(packed)
        twice = sorted(set(options) & set(kwargs))
        if twice:
          raise TypeError(f"{fn.__name__} got {twice} both in `{packed}` and by name.")
        kwargs.update(options)
      check_static(fn.__name__, static, signature.bind_partial(*args, **kwargs).arguments)
      return fn(*args, **kwargs)

    wrapped.static_args = tuple(static)
    return wrapped

  return wrap
