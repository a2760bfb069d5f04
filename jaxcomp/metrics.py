"""Reading the wire accounting out of an optimizer state."""

from __future__ import annotations

from typing import Any, Union

import jax
import jax.numpy as jnp

from jaxcomp import core
from jaxcomp.count import Count


def metrics(opt_state: Any) -> dict[str, Union[Count, jax.Array]]:
  """The wire metrics of the last update, whatever the state's layout.

  Finds every compression transform's counters in ``opt_state`` (a chain, a
  ``masked`` or nested states) and sums them. Counters with a leading worker
  axis (a state laid over workers with :func:`jaxcomp.parallel.replicate_workers`)
  are averaged over workers, so the figures are per worker per step.

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
  * ``nonfinite_tensors``: tensors that held NaN/Inf in the last update.
  * ``received_bytes`` (transforms with ``exchange="two_phase"`` or
    ``"auto"``): bytes that arrive at this worker from the others:
    exact for all-gathers and all-to-alls (``(N − 1)·P`` for the default
    exchange of ``P``-byte payloads), and for all-reduces (tensors sent in
    float, agreed scalars, PowerSGD's factors) a bandwidth-optimal ring's
    ``2(N − 1)/N`` of the operand. It grows with the number of workers ``N``
    for the all-gather, not for the two-phase exchange.
  * ``two_phase_tensors`` (transforms with ``exchange="two_phase"`` or
    ``"auto"``): the tensors that took the two-phase exchange
    (:mod:`jaxcomp.two_phase`); with ``tensor_metrics``, ``two_phase:<path>``
    per matched tensor.
  * ``compression_ratio``: ``float32_bytes / bytes_on_wire``;
    ``compressed_ratio`` the same over compressed tensors only.
  * compressor-specific counters (e.g. overflow, fallbacks).

  Every counter is an exact :class:`~jaxcomp.count.Count` (``int(c)``,
  ``float(c)`` and ``numpy.asarray(c)`` read it on the host; it passes
  through ``jit`` as a pytree); the two ratios are float32 arrays. Works
  under ``jit``.

  Returns an empty dict if the state holds no compression transform.
  """
  found = [
      x.metrics
      for x in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, core.WorkerLocal))
      if isinstance(x, core.WorkerLocal)
  ]
  if not found:
    return {}
  out: dict[str, Any] = {}
  for m in found:
    for k, v in m.items():
      v = v.mean()
      out[k] = out[k] + v if k in out else v
  out["compression_ratio"] = _ratio(out["float32_bytes"], out["bytes_on_wire"])
  out["compressed_ratio"] = _ratio(out["compressed_float32_bytes"], out["compressed_bytes_on_wire"])
  return out


def _ratio(num: Count, den: Count) -> jax.Array:
  return num.to_float32() / jnp.maximum(den.to_float32(), 1.0)
