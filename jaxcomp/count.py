"""Exact byte and element counts for models of any size.

JAX computes with 32-bit integers unless ``jax_enable_x64`` is set, and one
step of a large model moves more bytes than int32 holds: 600M float32
parameters are 2.4e9 bytes, past ``2**31 - 1``. A :class:`Count` is exact for
any count below ``2**64`` in two parts:

* ``static``: a Python int, the part known while tracing (tensor sizes, the
  bytes of a payload of static shape). Under :func:`jax.eval_shape` it is
  still there, exact, because it is not an array (it is pytree metadata);
* ``hi``, ``lo``: the part only known when the step runs (variable-length
  encodings, overflow counters), as two uint32 words ``hi * 2**32 + lo``,
  added with a carry; ``None`` when there is none.

A count laid over workers (:func:`jaxcomp.parallel.replicate_workers`) is
reduced to the mean over workers by :meth:`Count.mean`: the traced parts are
summed exactly and ``per`` records how many workers they came from.

On the host ``int(c)``, ``float(c)`` and ``numpy.asarray(c)`` give the value
(``float`` and numpy round to float64, exact up to ``2**53``).
"""

from __future__ import annotations

import dataclasses
import fractions
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

_WORD = 2**32


def _words(value: int) -> tuple[jax.Array, jax.Array]:
  if not 0 <= value < _WORD**2:
    raise OverflowError(f"a Count holds integers in [0, 2**64); got {value}.")
  return jnp.uint32(value // _WORD), jnp.uint32(value % _WORD)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class Count:
  """A non-negative integer count, exact below ``2**64`` (see the module docstring).

  The value is ``static + (hi * 2**32 + lo) / per``.
  """

  static: int = dataclasses.field(default=0, metadata=dict(static=True))
  hi: Optional[jax.Array] = None  # uint32: the traced part's upper word
  lo: Optional[jax.Array] = None  # uint32: its lower word
  per: int = dataclasses.field(default=1, metadata=dict(static=True))  # workers the traced part sums over

  @classmethod
  def of(cls, value: Union["Count", int, jax.Array]) -> "Count":
    """A Count from a Python int (static) or a non-negative integer array below ``2**32`` (traced)."""
    if isinstance(value, Count):
      return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
      _words(int(value))  # range check
      return cls(static=int(value))
    value = jnp.asarray(value)
    if not (jnp.issubdtype(value.dtype, jnp.integer) or value.dtype == jnp.bool_):
      raise TypeError(f"a Count counts with integers; got {value.dtype}.")
    return cls(hi=jnp.zeros(value.shape, jnp.uint32), lo=value.astype(jnp.uint32))

  @property
  def is_static(self) -> bool:
    """True if the whole value is known while tracing."""
    return self.lo is None

  def __add__(self, other: Union["Count", int, jax.Array]) -> "Count":
    other = Count.of(other)
    static = self.static + other.static
    if other.is_static:
      return dataclasses.replace(self, static=static)
    if self.is_static:
      return dataclasses.replace(other, static=static)
    if self.per != other.per:
      raise ValueError(f"cannot add counts averaged over {self.per} and {other.per} workers.")
    lo = self.lo + other.lo  # wraps modulo 2**32: the carry is the wrap
    hi = self.hi + other.hi + (lo < self.lo).astype(jnp.uint32)
    return Count(static=static, hi=hi, lo=lo, per=self.per)

  __radd__ = __add__

  def traced(self) -> "Count":
    """The same value with the static part moved into the arrays.

    Two branches of a ``lax.cond`` must return the same pytree structure; a
    count that is static in one and computed in the other needs this form.
    """
    if self.per != 1:
      raise ValueError("traced() applies to a count before averaging over workers.")
    hi, lo = _words(self.static)
    return Count(hi=hi, lo=lo) + (Count() if self.is_static else dataclasses.replace(self, static=0))

  def where(self, pred: Any) -> "Count":
    """This count where the boolean ``pred`` holds, else 0 (traced form; exact at any size: each word is gated).

    A collective inside a ``lax.cond`` (a fallback round) moves its bytes only where its branch runs.
    """
    on = jnp.asarray(pred).astype(jnp.uint32)
    t = self.traced()
    return Count(hi=on * t.hi, lo=on * t.lo)

  def zeros_like(self) -> "Count":
    """Zero, with the traced form (see :meth:`traced`)."""
    t = self.traced()
    return Count(hi=jnp.zeros_like(t.hi), lo=jnp.zeros_like(t.lo))

  def sum(self) -> "Count":
    """The sum over every array axis (workers), exact.

    The static part is the same on every worker and counts once per worker.
    A count with no traced part has no worker axis: it is returned as is.
    """
    if self.is_static or self.lo.ndim == 0:
      return self
    mean = self.mean()
    return Count(static=self.static * self.lo.size, hi=mean.hi, lo=mean.lo, per=self.per)

  def mean(self) -> "Count":
    """The mean over every array axis (workers), exact: the traced parts are summed and ``per`` grows.

    The static part is the same on every worker, so it is its own mean.
    """
    if self.is_static or self.lo.ndim == 0:
      return self
    workers = self.lo.size
    if workers >= 2**16:
      raise ValueError(f"mean over {workers} workers: at most 2**16 - 1 are supported.")
    lo, hi = self.lo.reshape(-1), self.hi.reshape(-1)
    # Sum the 16-bit halves of the lower words separately: no sum can wrap.
    low = jnp.sum(lo & 0xFFFF, dtype=jnp.uint32)
    high = jnp.sum(lo >> 16, dtype=jnp.uint32)
    total = Count(hi=jnp.sum(hi, dtype=jnp.uint32), lo=jnp.uint32(0))
    total = total + Count(hi=high >> 16, lo=(high & 0xFFFF) << 16) + Count(hi=jnp.uint32(0), lo=low)
    return Count(static=self.static, hi=total.hi, lo=total.lo, per=self.per * workers)

  def __getitem__(self, index: Any) -> "Count":
    """One worker's count, of a count laid over workers (the static part is every worker's)."""
    if self.is_static:
      return self
    return dataclasses.replace(self, hi=self.hi[index], lo=self.lo[index])

  def to_float32(self) -> jax.Array:
    """The value as a float32 array (rounded), for ratios computed under ``jit``."""
    value = jnp.float32(self.static)
    if not self.is_static:
      traced = self.hi.astype(jnp.float32) * jnp.float32(_WORD) + self.lo.astype(jnp.float32)
      value = value + traced / jnp.float32(self.per)
    return value

  # -- on the host ------------------------------------------------------------

  def value(self) -> fractions.Fraction:
    """The exact value (a Fraction: a mean over workers need not be an integer). Host only."""
    if self.is_static:
      return fractions.Fraction(self.static)
    hi, lo = np.asarray(self.hi), np.asarray(self.lo)
    if hi.ndim:
      raise ValueError("value() of a count laid over workers: take .mean() first.")
    return self.static + fractions.Fraction(int(hi) * _WORD + int(lo), self.per)

  def __int__(self) -> int:
    v = self.value()
    if v.denominator != 1:
      raise ValueError(f"{v} is a mean over workers, not an integer; use float().")
    return int(v)

  def __float__(self) -> float:
    return float(self.value())

  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    """float64 values (one per worker for a count laid over workers), exact up to ``2**53``."""
    del copy
    if self.is_static:
      return np.asarray(float(self.static), dtype=dtype or np.float64)
    hi, lo = np.asarray(self.hi, np.float64), np.asarray(self.lo, np.float64)
    return np.asarray(self.static + (hi * _WORD + lo) / self.per, dtype=dtype or np.float64)

  def __format__(self, spec: str) -> str:
    v = self.value()
    return format(int(v) if v.denominator == 1 else float(v), spec)

  def __eq__(self, other: Any) -> bool:
    if isinstance(other, (Count, int, float, fractions.Fraction, np.number)):
      other_value = other.value() if isinstance(other, Count) else other
      return self.value() == other_value
    return NotImplemented

  __hash__ = None  # type: ignore[assignment]

  def __repr__(self) -> str:
    if self.is_static:
      return f"Count({self.static})"
    concrete = isinstance(self.lo, (np.ndarray, np.generic, jax.Array)) and not isinstance(self.lo, jax.core.Tracer)
    if not concrete or np.ndim(self.lo):  # traced, abstract (jax.eval_shape) or laid over workers
      return f"Count(static={self.static}, traced uint32 words of shape {np.shape(self.lo)}, per={self.per})"
    return f"Count({self.value()})"
