"""Random-k sparsification with indices shared by every worker (rand_k).

Per tensor of ``n`` values, at every step, every worker keeps the same ``k =
ceil(fraction·n)`` entries ``S`` of its (error-corrected) tensor ``x_w`` and
drops the rest: ``C(x) = x ⊙ 1_S`` ("rand_k", Stich, Cordonnier, Jaggi 2018,
Definition 2.1 and the random-k example after it; Wangni et al. 2018's random
sparsification with ``p_i = k/n``). ``S`` is drawn from a key that lives in
the compressor's per-tensor state (:meth:`RandomK.init_state`), identical on
every worker and split anew every step, so every worker draws the same ``S``
and **no index crosses the wire**: the workers ``psum`` their ``k`` selected
values (an all-reduce of ``float32[k]``, ``4·k`` bytes handed per worker) and
every worker scatters the mean back into ``S``.

Two variants:

* ``scale=False`` (default): the biased ``x ⊙ 1_S`` with **error feedback**
  (the shared residual of :func:`jaxcomp.compress`; Stich et al.'s "memory",
  Algorithm 1): what was not sent is added to the next step's tensor.
* ``scale=True``: the unbiased ``(n/k)·x ⊙ 1_S`` (Wangni et al. §3, the
  rescaling by the inverse keeping probability), whose variance is
  ``E‖(n/k)·x ⊙ 1_S − x‖² = (n/k − 1)·‖x‖²``. Meant without error feedback:
  :func:`randomk` turns it off unless ``error_feedback`` is given.

**How S is drawn** (a decision; tested): a random *affine permutation*
``i ↦ (a·i + b) mod n`` restricted to ``i < k``, with ``b`` uniform on
``[0, n)`` and ``a`` uniform among the integers in ``[1, n)`` coprime to
``n`` (rejection sampling over 128 candidates, checked against the prime
factors of the static ``n``; ``a = 1`` in the ``< 10⁻⁹``-likely case that
none is coprime). Properties:

* the ``k`` indices are **distinct** (an affine map with ``gcd(a, n) = 1`` is a
  bijection of ``Z_n``): sampling without replacement, exactly ``k`` values;
* every index is in ``S`` with probability **exactly** ``k/n`` (for any fixed
  ``a``, index ``j`` is hit by exactly ``k`` of the ``n`` shifts ``b``), so
  ``scale=True`` is exactly unbiased, and ``E‖x − x ⊙ 1_S‖² = (1 − k/n)‖x‖²``,
  the ``k``-contraction Stich et al.'s analysis of memory needs (Definition
  2.1), and the ``(n/k − 1)‖x‖²`` variance of the scaled version, as for a
  uniformly random ``k``-subset (both depend on the inclusion probabilities
  only);
* drawing ``S`` costs ``O(k log k)`` integer work (``(a·i + b) mod n`` by
  binary doubling in uint32, no 64-bit products), independent of ``n`` and
  with no sort (the exchange around it reads ``k`` values and writes the
  ``n``-value result); a uniformly random ``k``-subset
  (``jax.random.choice(..., replace=False)``, a random permutation) sorts
  ``n`` keys, ``O(n log n)``, which on a CPU costs far more than the rest of
  the exchange.

What it is not: uniform over all ``k``-subsets; ``S`` is an arithmetic
progression modulo ``n`` (its pairs are not independent). Properties that
depend on more than the inclusion probabilities (e.g. how often two given
indices are sent together) differ from sampling a uniform subset.

Tensors of ``n ≥ 2**31`` elements are refused (int32 indices).

References:
  Stich, Cordonnier, Jaggi. *Sparsified SGD with Memory*. NeurIPS 2018,
  Definition 2.1 (k-contraction; rand_k and top_k), Algorithm 1 (memory).
  Wangni, Wang, Liu, Zhang. *Gradient Sparsification for
  Communication-Efficient Distributed Optimization*. NeurIPS 2018, §3
  (unbiased sparsification ``Q(g)_i = g_i·Z_i/p_i``, here ``p_i = k/n``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp import transforms
from jaxcomp.compressors import _select

CANDIDATES = 128  # draws of the multiplier a; P(none coprime to n) < 0.85**128 < 1e-9 for n < 2**31
MAX_SIZE = 2**31 - 1


class RandomKPayload(NamedTuple):
  values: jax.Array  # float32[k]: this worker's x at the shared indices, before the all-reduce


def _add_mod(a: jax.Array, b: jax.Array, n: int) -> jax.Array:
  """``(a + b) mod n`` for uint32 ``a, b < n < 2**31`` (the sum fits 32 bits)."""
  s = a + b
  return jnp.where(s >= jnp.uint32(n), s - jnp.uint32(n), s)


@functools.lru_cache(maxsize=None)
def prime_factors(n: int) -> tuple[int, ...]:
  """The distinct prime factors of ``n`` (static, by trial division: at most ~46k steps for ``n < 2**31``)."""
  out, p = [], 2
  while p * p <= n:
    if n % p == 0:
      out.append(p)
      while n % p == 0:
        n //= p
    p += 1 if p == 2 else 2
  if n > 1:
    out.append(n)
  return tuple(out)


def affine_map(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
  """``(a, b)``, int32: ``b`` uniform on ``[0, n)``, ``a`` uniform among the units of ``Z_n`` in ``[1, n)``."""
  if n == 1:
    return jnp.int32(1), jnp.int32(0)
  kb, ka = jax.random.split(key)
  b = jax.random.randint(kb, (), 0, n, jnp.int32)
  cand = jax.random.randint(ka, (CANDIDATES,), 1, n, jnp.int32)
  # n is static: a candidate is a unit iff no prime factor of n divides it (n < 2**31 has at most 9).
  unit = jnp.ones((CANDIDATES,), bool)
  for p in prime_factors(n):
    unit = unit & (cand % p != 0)
  return jnp.where(jnp.any(unit), cand[jnp.argmax(unit)], 1), b


def affine_indices(a: jax.Array, b: jax.Array, n: int, k: int) -> jax.Array:
  """``(a·i + b) mod n`` for ``i < k``, int32[k], for ``0 <= a, b < n < 2**31`` (distinct if ``gcd(a, n) = 1``)."""
  # a·i mod n by the binary digits of i (only those below k): every sum stays below 2**32,
  # so no 64-bit product is needed.
  i = lax.iota(jnp.uint32, k)
  acc = jnp.full((k,), jnp.asarray(b).astype(jnp.uint32), jnp.uint32)
  step = jnp.asarray(a).astype(jnp.uint32) % jnp.uint32(n)  # a·2^j mod n
  for j in range(max(1, (k - 1).bit_length())):
    acc = _add_mod(acc, jnp.where((i >> j) & 1 == 1, step, jnp.uint32(0)), n)
    step = _add_mod(step, step, n)
  return acc.astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class RandomK(core.Compressor):
  """Random-k sparsification with shared indices (see the module docstring).

  Attributes:
    fraction: the proportion of entries sent, ``k = ceil(fraction·n)``.
    scale: multiply the sent values by ``n/k`` (unbiased; meant without error
      feedback).
    capacity: values on the wire, a fraction of ``n`` or a count (``None``:
      ``k``); needed for a traced ``fraction``, which then fills the first
      ``k`` of the capacity's shared indices.
  """

  fraction: float = 0.01
  scale: bool = False
  capacity: Optional[_select.Capacity] = None

  error_feedback = True
  custom_exchange = True

  def __post_init__(self):
    if not hyperparams.is_number(self.fraction):
      raise TypeError(f"fraction must be a float in (0, 1]; got {self.fraction!r}.")
    _select.check_selection(self.fraction, self.capacity)
    if not isinstance(self.scale, bool):
      raise TypeError(f"scale must be a bool; got {self.scale!r}.")

  @property
  def unbiased(self) -> bool:  # the class attribute, per instance: only the scaled version is
    return self.scale

  def k(self, n: int) -> Any:
    """``ceil(fraction·n)``, at most ``n``: an int, or int32 for a traced ``fraction``."""
    return _select.scheduled_count(self.fraction, n)

  def slots(self, n: int) -> int:
    """Values on the wire (static): ``capacity``, or ``k``."""
    return _select.selection_slots(self.fraction, self.capacity, n)

  def encoded_bytes(self, payload, shape):
    """With a traced ``fraction``, ``4·k``: every worker knows ``k``, so an all-reduce of a variable count moves that."""
    del payload
    return 4 * self.k(core.size_of(shape)) if hyperparams.is_traced(self.fraction) else None

  def validate(self, shape, dtype):
    del dtype
    if core.size_of(shape) > MAX_SIZE:
      raise ValueError(f"randomk draws int32 indices; a tensor of {core.size_of(shape)} elements is too large "
                       f"(at most {MAX_SIZE}).")

  def init_state(self, shape, key):
    del shape
    return key  # replicated on every worker: the shared indices of every step are drawn from it

  def indices(self, state: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """``(S, next state)``: the step's shared indices (one a slot) and the key of the next step."""
    draw, next_key = jax.random.split(state)
    a, b = affine_map(draw, n)
    return affine_indices(a, b, n, self.slots(n)), next_key

  def exchange(self, x, key, axis_name, state):
    del key  # per worker; the indices come from the shared state
    n = x.size
    self.validate(x.shape, x.dtype)
    idx, next_state = self.indices(state, n)
    values = x.reshape(-1)[idx].astype(jnp.float32)
    if self.capacity is not None:  # the first k slots are filled, the rest hold 0 (their indices are distinct)
      values = jnp.where(lax.iota(jnp.int32, idx.shape[0]) < self.k(n), values, 0.0)
    payload = RandomKPayload(values=values)
    total = yield core.Message("sum", payload.values, encoded=self.encoded_bytes(payload, x.shape))
    factor = n / self.k(n) if self.scale else 1.0
    scatter = lambda v: jnp.zeros((n,), jnp.float32).at[idx].set(v * factor, unique_indices=True).reshape(x.shape)
    mean = scatter(total / parallel.axis_size(axis_name))
    return core.Exchanged(mean=mean, own=scatter(payload.values), payload=payload, state=next_state)


@hyperparams.factory(capacity="the number of values on the wire")
def randomk(fraction: float = 0.01, *, scale: bool = False, capacity: Optional[_select.Capacity] = None,
            **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """Random-k sparsification with shared indices as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.randomk(0.01, axis_name="workers"), optax.sgd(0.1, momentum=0.9))

  Args:
    fraction: proportion of each tensor's entries sent, ``k = ceil(fraction·n)``.
    scale: send ``(n/k)·x`` at the chosen entries (unbiased, Wangni et al.);
      error feedback is then off unless ``error_feedback=True`` is given.
    **kwargs: passed to :func:`jaxcomp.compress`: ``axis_name``, ``skip``,
      ``min_size``, ``seed`` (also seeds the shared index draws),
      ``nonfinite``, ``error_feedback`` (default: on without ``scale``, off
      with it).
    capacity: values on the wire per tensor, a fraction of its size or a
      count; ``None``: ``k``. Needed (static) when ``fraction`` is injected
      or on a schedule (``optax.inject_hyperparams``): the all-reduce keeps
      the capacity's size (``bytes_on_wire``), the fraction fills the first
      ``k`` slots, and ``encoded_bytes`` is ``4·k``.

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  if scale and kwargs.get("error_feedback") is None:
    kwargs["error_feedback"] = False
  return transforms.compress(RandomK(fraction=fraction, scale=scale, capacity=capacity), **kwargs)
