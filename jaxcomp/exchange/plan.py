"""The plan: which algorithm each tensor takes, and what each moves, read off its own messages.

A tensor of a compressed update travels by one of two algorithms:

* ``"all_gather"`` (:mod:`jaxcomp.exchange.allgather`): every worker gathers
  every payload, ``(N − 1)·P`` bytes received per worker;
* ``"two_phase"`` (:mod:`jaxcomp.exchange.two_phase`): a compressed
  reduce-scatter and an all-gather of the re-encoded shards, about
  ``2(N − 1)/N·P``.

``exchange="auto"`` chooses per bucket (:func:`choose_buckets`): a bucket's
tensors travel together, so a bucket whose tensors took both routes would
pay both routes' rounds.

A compressor with its own exchange (``custom_exchange``: PowerSGD, DGC's
warm-up) runs its own rounds. ``exchange="auto"`` takes, per tensor, the
algorithm under which fewer bytes reach a worker, bucket by bucket. Those bytes are not a
formula written beside the algorithms: :func:`traffic` traces the
algorithm's own steps abstractly (:func:`jax.eval_shape`: nothing runs, no
memory) and has the transport (:mod:`jaxcomp.exchange.transport`) count
their messages, exactly as it counts them in a step. Rounds that run only
sometimes (3LC's fallback) count zero in the plan.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from jaxcomp import core
from jaxcomp.exchange import allgather
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase

Exchange = Literal["all_gather", "two_phase", "auto"]
EXCHANGES = ("all_gather", "two_phase", "auto")
ROUTES = ("all_gather", "two_phase")

_AXIS = "jaxcomp_plan_workers"  # the worker axis of the abstract trace


def check_exchange(exchange: str) -> None:
  if exchange not in EXCHANGES:
    raise ValueError(f"exchange must be one of {', '.join(map(repr, EXCHANGES))}; got {exchange!r}.")


def check(compressor: core.Compressor, exchange: str) -> None:
  """Raises a clear error if ``exchange`` cannot be used with ``compressor``."""
  check_exchange(exchange)
  if exchange == "two_phase":
    reason = two_phase.unsupported(compressor)
    if reason:
      raise ValueError(reason)


class Bytes(NamedTuple):
  """Static bytes of one tensor's exchange, per worker and step (:class:`~jaxcomp.exchange.transport.Traffic`)."""

  sent: int  # handed to collectives (the convention of bytes_on_wire)
  received: int  # arrived from the other workers


def _steps(compressor: core.Compressor, route: str):
  if route == "all_gather":
    return lambda x, key: allgather.exchange_steps(compressor, x, key, _AXIS)
  return lambda x, key: two_phase.two_phase_steps(compressor, x, key, _AXIS)


def traffic(compressor: core.Compressor, n: int, workers: int, route: str) -> Bytes:
  """The bytes one worker moves exchanging a tensor of ``n`` values over ``workers`` by ``route``.

  Counted by the transport from the route's messages, traced abstractly over
  a worker axis of that size. ``route`` is ``"all_gather"`` or
  ``"two_phase"`` (which must apply: :func:`choose`).
  """
  try:
    hash(compressor)
  except TypeError:  # a compressor holding traced hyperparameters is not hashable: traced anew
    return _traffic(compressor, int(n), int(workers), route)
  return _cached_traffic(compressor, int(n), int(workers), route)


@functools.lru_cache(maxsize=4096)
def _cached_traffic(compressor: core.Compressor, n: int, workers: int, route: str) -> Bytes:
  return _traffic(compressor, n, workers, route)


def _traffic(compressor: core.Compressor, n: int, workers: int, route: str) -> Bytes:
  if route not in ROUTES:
    raise ValueError(f"route must be one of {ROUTES}; got {route!r}.")
  # Traced in a thread of its own: JAX's trace state is per thread, and this trace must not sit
  # inside the caller's (under shard_map, a collective over the plan's vmap axis fails JAX's
  # varying-axes check, an AssertionError in jax 0.10).
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(_trace_traffic, compressor, n, workers, route).result()


def _trace_traffic(compressor: core.Compressor, n: int, workers: int, route: str) -> Bytes:
  counted = transport.Traffic()
  steps = _steps(compressor, route)

  def one(x, key):
    transport.run(steps(x, key), _AXIS, counted)

  x = jax.ShapeDtypeStruct((workers, n), jnp.float32)
  keys = jax.ShapeDtypeStruct((workers, 2), jnp.uint32)
  jax.eval_shape(jax.vmap(one, axis_name=_AXIS, axis_size=workers), x, keys)
  return Bytes(sent=counted.sent.static, received=counted.received.static)


def choose(compressor: core.Compressor, n: int, workers: int, exchange: str) -> str:
  """The algorithm one tensor of ``n`` values takes: ``"all_gather"`` or ``"two_phase"``.

  ``"auto"`` picks the one under which fewer bytes reach a worker
  (:func:`traffic`; ties: the all-gather, one round instead of two); a tensor
  too small to split, a single worker, or a compressor with its own exchange
  (and no fixed-size fallback wire) use the all-gather, or their own rounds.
  """
  check_exchange(exchange)
  if exchange == "all_gather" or two_phase.unsupported(compressor) or two_phase.split(compressor, n, workers) is None:
    return "all_gather"
  if exchange == "two_phase":
    return "two_phase"
  ag = traffic(compressor, n, workers, "all_gather").received
  tp = traffic(compressor, n, workers, "two_phase").received
  return "two_phase" if tp < ag else "all_gather"


def choose_buckets(compressor: core.Compressor, sizes: list[int], groups: list[list[int]], workers: int,
                   exchange: str) -> list[str]:
  """Every tensor's algorithm, chosen bucket by bucket: ``"all_gather"`` or ``"two_phase"``.

  ``sizes``: every tensor's values; ``groups``: the buckets' tensors (leaf
  ids; a tensor in none stays on the all-gather). A tensor that cannot take
  the two-phase exchange (:func:`choose` with ``"two_phase"``: too small to
  split, one worker, a compressor with its own exchange) takes the
  all-gather. With ``"auto"`` a bucket's other tensors take the two-phase
  exchange together if, summed over them, fewer bytes reach a worker by it
  (:func:`traffic`; ties: the all-gather), else the all-gather together:
  every route a bucket uses costs its rounds (two-phase: an all-to-all and a
  gather), whatever the bytes. A bucket of one (``bucket_bytes=0``) is
  :func:`choose` on that tensor.
  """
  check_exchange(exchange)
  routes = ["all_gather"] * len(sizes)
  if exchange == "all_gather":
    return routes
  for ids in groups:
    split = [i for i in ids if choose(compressor, sizes[i], workers, "two_phase") == "two_phase"]
    if exchange == "auto" and split:
      gathered = sum(traffic(compressor, sizes[i], workers, "all_gather").received for i in split)
      phased = sum(traffic(compressor, sizes[i], workers, "two_phase").received for i in split)
      split = split if phased < gathered else []
    for i in split:
      routes[i] = "two_phase"
  return routes
