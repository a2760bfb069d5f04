"""Reading the wire accounting out of an optimizer state."""

from __future__ import annotations

from typing import Any, Union

import jax
import jax.numpy as jnp

from jaxcomp import core
from jaxcomp.count import Count

# Counters reported as a sum over workers (the others are a mean: per worker).
SUMMED_OVER_WORKERS = ("nonfinite_tensors",)


def metrics(opt_state: Any) -> dict[str, Union[Count, jax.Array]]:
  """The wire metrics of the last update, whatever the state's layout.

  Finds every compression transform's counters in ``opt_state`` (a chain, a
  ``masked`` or nested states) and sums them. Counters with a leading worker
  axis (a state laid over workers with :func:`jaxcomp.parallel.replicate_workers`)
  are averaged over workers, so the figures are per worker per step (except
  ``nonfinite_tensors``, a sum over workers).

  Keys (bytes are per worker, for the last update):

  * ``bytes_on_wire``: bytes of every array this worker handed to a
    collective (compressed payloads, agreement scalars, non-finite flags, and
    the tensors sent in float).
  * ``float32_bytes``: what all the gradients would cost as float32.
  * ``compressed_bytes_on_wire`` / ``compressed_float32_bytes``: the same two
    restricted to the compressed tensors.
  * ``float_bytes``: bytes of the tensors left in float (skipped).
  * ``encoded_bytes``: like ``bytes_on_wire`` but with the exact size of
    variable-length encodings (zero-run, Elias) where a compressor has one.
  * ``nonfinite_tensors``: the tensors that held NaN/Inf in the last update,
    **summed over workers** (unlike the bytes): 2 when one worker had two
    bad tensors, whatever the number of workers; a tensor bad on 3 workers
    counts 3. 0 exactly when every worker's input was finite.
  * ``received_bytes`` (transforms with ``exchange="two_phase"`` or
    ``"auto"``): bytes that arrive at this worker from the others:
    exact for all-gathers and all-to-alls (``(N − 1)·P`` for the default
    exchange of ``P``-byte payloads), and for all-reduces (tensors sent in
    float, agreed scalars, PowerSGD's factors) a bandwidth-optimal ring's
    ``2(N − 1)/N`` of the operand. It grows with the number of workers ``N``
    for the all-gather, not for the two-phase exchange.
  * ``two_phase_tensors`` (transforms with ``exchange="two_phase"`` or
    ``"auto"``): the tensors that took the two-phase exchange
    (:mod:`jaxcomp.exchange.two_phase`); with ``tensor_metrics``, ``two_phase:<path>``
    per matched tensor.
  * ``local_bytes`` (transforms with ``within``, :mod:`jaxcomp.exchange.hierarchy`):
    bytes this device handed to the collectives inside its host (the float
    reduce-scatter and all-gathers); then every other counter is this
    device's, over its slices of the tensors, and ``bytes_on_wire`` counts
    only what goes between hosts. In a sharded chain
    (:func:`jaxcomp.shard_optimizer`), the first hop of the two-hop
    reduce-scatter (:func:`jaxcomp.exchange.scatter.two_hop_steps`).
  * ``compression_ratio``: ``float32_bytes / bytes_on_wire``;
    ``compressed_ratio`` the same over compressed tensors only.
  * compressor-specific counters (e.g. overflow, fallbacks).

  Every counter is an exact :class:`~jaxcomp.count.Count` (``int(c)``,
  ``float(c)`` and ``numpy.asarray(c)`` read it on the host; it passes
  through ``jit`` as a pytree); the two ratios are float32 arrays. Works
  under ``jit``.

  Raises a ValueError if the state holds no compression transform, or holds
  one that lost its structure (a checkpoint restored without a target, where
  NamedTuples come back as lists and dicts).
  """
  found = [x.metrics for x in core.worker_locals(opt_state)]
  out = _combine(found) if core.is_traced(found) else _combine_jit(found)
  if "float32_bytes" not in out:
    _explain_missing(opt_state)
  return out


def _combine(found: list[dict[str, Count]]) -> dict[str, Union[Count, jax.Array]]:
  """Every transform's counters summed, each reduced over workers, and the two ratios."""
  out: dict[str, Any] = {}
  for m in found:
    for k, v in m.items():
      v = v.sum() if k in SUMMED_OVER_WORKERS else v.mean()
      out[k] = out[k] + v if k in out else v
  if "float32_bytes" in out:
    out["compression_ratio"] = _ratio(out["float32_bytes"], out["bytes_on_wire"])
    out["compressed_ratio"] = _ratio(out["compressed_float32_bytes"], out["compressed_bytes_on_wire"])
  return out


# Called on arrays (not under a trace), the counters are combined by one compiled program.
# Eagerly they would be some fifty small programs, and on a state laid over several devices
# each reduction over workers is a cross-device program: XLA:CPU deadlocks on many such
# programs in flight at once under load (docs/design.md, "Host devices").
_combine_jit = jax.jit(_combine)


def _explain_missing(opt_state: Any) -> None:
  """Raises the ValueError that says why ``opt_state`` has no metrics."""
  if _has_plain_worker_local(opt_state):
    raise ValueError(
        "opt_state holds a compression state that lost its structure (a dict with 'residual' and "
        "'metrics' where a jaxcomp.core.WorkerLocal belongs), as a checkpoint restored without a target "
        "does: NamedTuples come back as lists and dicts, and the counts' static parts are gone. "
        "Restore with the state's structure, e.g. orbax's "
        "args=ocp.args.StandardRestore(abstract_state), with abstract_state laid out as the saved state: "
        "jax.eval_shape(lambda: jaxcomp.parallel.replicate_workers(tx.init(params), num_workers)).")
  raise ValueError(
      f"opt_state ({type(opt_state).__name__}) holds no compression transform: jaxcomp.metrics reads the "
      "counters of jaxcomp.compress (or a compressor such as jaxcomp.terngrad) in the state it updates.")


def _has_plain_worker_local(tree: Any) -> bool:
  """Whether ``tree`` has a dict with a WorkerLocal's fields (a state restored as plain containers)."""
  if isinstance(tree, dict):
    return {"residual", "metrics"} <= set(tree) or any(map(_has_plain_worker_local, tree.values()))
  if isinstance(tree, (list, tuple)):
    return any(map(_has_plain_worker_local, tree))
  return False


def _ratio(num: Count, den: Count) -> jax.Array:
  return num.to_float32() / jnp.maximum(den.to_float32(), 1.0)
