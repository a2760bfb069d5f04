"""The transport: runs an exchange's messages and counts every byte they move.

An exchange (the all-gather, the two-phase exchange, a compressor's own
rounds) is a generator that yields a :class:`~jaxcomp.core.Message` per
collective and gets its result back. :func:`run` delivers them one
collective each; :func:`jaxcomp.exchange.buckets.run` fuses a bucket's. Both
count each message into the exchange's :class:`Traffic` as it is delivered,
so the bytes in :func:`jaxcomp.metrics` are read off the messages that
travelled, and nothing else computes them:

* ``sent``: the bytes of the message's arrays that this worker hands to the
  collective (an all-to-all hands all ``N`` rows, its own included);
* ``received``: the bytes that reach this worker from the others: ``(N − 1)``
  times a gathered message, ``(N − 1)/N`` of an all-to-all's, and for a
  reduction a ring all-reduce's ``2(N − 1)/N`` (rounded up);
* ``encoded``: ``sent`` with the exact size of a variable-length encoding
  where the message carries one (``Message.encoded``: 3LC's zero-run
  stream); a fallback round that resends a stream carries 0.

A message with ``when`` (a boolean the same on every worker) runs inside a
``lax.cond``: its collective, and its bytes, only where ``when`` holds (3LC's
plain round after a zero-run buffer overflowed). With no worker axis a message
is delivered locally (a gather gets a worker axis of 1) and its ``sent``
bytes still count: what one worker would hand to the wire.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.count import Count


def allreduce_received(nbytes: int, workers: int) -> int:
  """Bytes one worker receives in a bandwidth-optimal (ring) all-reduce of ``nbytes``: ``2(N−1)/N·nbytes``."""
  return -(-2 * (workers - 1) * int(nbytes) // workers) if workers > 1 else 0


def received(kind: str, nbytes: int, workers: int) -> int:
  """Bytes that reach one worker of ``workers`` when each hands a message of ``kind`` of ``nbytes``."""
  if kind == "gather":
    return (workers - 1) * nbytes
  if kind == "all_to_all":
    return nbytes // workers * (workers - 1)  # rows of the other workers
  return allreduce_received(nbytes, workers)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Bytes:
  """``sent``, ``received`` and ``encoded`` bytes (see the module docstring), exact :class:`~jaxcomp.count.Count` s."""

  sent: Count = dataclasses.field(default_factory=Count)
  received: Count = dataclasses.field(default_factory=Count)
  encoded: Count = dataclasses.field(default_factory=Count)

  def __add__(self, other: "Bytes") -> "Bytes":
    return Bytes(self.sent + other.sent, self.received + other.received, self.encoded + other.encoded)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Traffic:
  """The bytes one worker's exchange moved, counted message by message.

  Each message is counted once, under the axes it crossed: ``()`` for the
  exchange's own, a hop's names for a message over part of them
  (``Message.over``). ``sent``, ``received`` and ``encoded`` sum every
  message; :meth:`apart` tells a host's own hop from the rest.
  """

  by_axes: dict = dataclasses.field(default_factory=dict)  # axis names (a tuple; () the exchange's) -> Bytes

  @property
  def total(self) -> Bytes:
    return sum(self.by_axes.values(), Bytes())

  @property
  def sent(self) -> Count:
    return self.total.sent

  @property
  def received(self) -> Count:
    return self.total.received

  @property
  def encoded(self) -> Count:
    return self.total.encoded

  def add(self, message: core.Message, workers: int, kind: Optional[str] = None) -> None:
    """Counts ``message``, delivered as a collective of ``kind`` (its own by default) over ``workers``."""
    axes = () if message.over is None else parallel.axis_names(message.over)
    nbytes = core.tree_nbytes(message.tree)
    counts = (nbytes, received(kind or message.kind, nbytes, workers),
              nbytes if message.encoded is None else message.encoded)
    counted = Bytes(*(Count.of(c) if message.when is None else Count.of(c).where(message.when) for c in counts))
    self.by_axes[axes] = self.by_axes[axes] + counted if axes in self.by_axes else counted

  def __add__(self, other: "Traffic") -> "Traffic":
    by_axes = dict(self.by_axes)
    for axes, counted in other.by_axes.items():
      by_axes[axes] = by_axes[axes] + counted if axes in by_axes else counted
    return Traffic(by_axes)

  def apart(self, within: parallel.AxisName) -> tuple["Traffic", "Traffic"]:
    """``(everything but the hop over within, that hop)``."""
    within = parallel.axis_names(within)
    outside = sum((b for axes, b in self.by_axes.items() if axes != within), Bytes())
    return Traffic({(): outside}), Traffic({(): self.by_axes.get(within, Bytes())})


def _reply_like(message: core.Message, axis_name: parallel.AxisName) -> Any:
  """Zeros shaped as ``message``'s result (the untaken branch of a conditional message)."""
  lead = (parallel.axis_size(axis_name),) if message.kind == "gather" else ()
  return jax.tree.map(lambda a: jnp.zeros(lead + jnp.shape(a), jnp.result_type(a)), message.tree)


def collective(kind: str, tree: Any, axis_name: parallel.AxisName) -> Any:
  """The collective of one message of ``kind`` over ``axis_name``.

  With no worker axis (``None``): a gather adds a worker axis of 1, the
  reductions and the all-to-all return the tree as it is.
  """
  if kind == "gather":
    return parallel.all_gather(tree, axis_name)
  if kind == "all_to_all":
    return parallel.all_to_all(tree, axis_name)
  if kind in ("max", "sum", "mean"):
    reduce = {"max": parallel.pmax, "sum": parallel.psum, "mean": parallel.pmean}[kind]
    return reduce(tree, axis_name) if parallel.axis_names(axis_name) else tree
  raise ValueError(f"unknown message kind {kind!r}; expected one of {core.MESSAGE_KINDS}.")


def axis_of(message: core.Message, axis_name: parallel.AxisName) -> parallel.AxisName:
  """The axes ``message`` travels over: its own hop's (``Message.over``), or the exchange's ``axis_name``."""
  return axis_name if message.over is None else message.over


def deliver(message: core.Message, axis_name: parallel.AxisName, traffic: Optional[Traffic] = None) -> Any:
  """Runs one message's collective over ``axis_name`` (inside a ``lax.cond`` if it has ``when``), counted in ``traffic``."""
  axis_name = axis_of(message, axis_name)
  if traffic is not None:
    traffic.add(message, parallel.axis_size(axis_name))
  run_it = lambda tree: collective(message.kind, tree, axis_name)
  if message.when is None:
    return run_it(message.tree)
  like = _reply_like(message, axis_name)
  return parallel.replicated_cond(message.when, run_it, lambda tree: like, message.tree)


def run(steps: Any, axis_name: parallel.AxisName, traffic: Optional[Traffic] = None) -> Any:
  """Runs one exchange on its own: every message it yields goes through its own collective.

  ``steps`` is a generator that yields :class:`~jaxcomp.core.Message` s and
  returns its result (see :func:`jaxcomp.exchange.allgather.exchange_steps`),
  or an already computed result, which is returned as it is. The bytes are
  counted into ``traffic`` if given.
  """
  if not inspect.isgenerator(steps):
    return steps
  message, result = advance(steps, None)
  while message is not None:
    message, result = advance(steps, deliver(message, axis_name, traffic))
  return result


def advance(steps: Any, reply: Any) -> tuple[Optional[core.Message], Any]:
  """Hands ``reply`` to exchange ``steps``: ``(its next message, None)``, or ``(None, its result)`` at the end."""
  try:
    return steps.send(reply), None
  except StopIteration as done:
    return None, done.value


def counted(steps: Any, axis_name: parallel.AxisName) -> tuple[Any, Traffic]:
  """``(result, traffic)`` of running ``steps`` alone (:func:`run`)."""
  traffic = Traffic()
  return run(steps, axis_name, traffic), traffic
