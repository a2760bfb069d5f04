"""optax transforms that compress, exchange and average gradients.

:func:`compress` wires one per-tensor :class:`~jaxcomp.core.Compressor` into an
``optax.GradientTransformationExtraArgs`` together with the machinery every
compressor shares:

* **error feedback** (Seide et al. 2014; 3LC Fig. 2): one residual buffer per
  tensor per worker, carried in the optax state. The compressor sees
  ``x = g + r``; after encoding, ``r <- x - decode(own payload)``, so over
  ``T`` steps ``sum(decoded) + r_T == sum(g)`` (conservation);
* **skipped tensors** kept in float (an ``optax.masked``-style ``skip`` tree or
  predicate, and ``min_size``); they are averaged with ``pmean``;
* **dtype handling**: any float dtype in, the same dtype out; compressors and
  residuals work in float32;
* **randomness**: a key in the state, split every step and folded with the
  tensor's position and the worker's ``lax.axis_index``;
* **non-finite input**: an explicit policy (see :func:`compress`);
* **accounting**: the bytes handed to collectives, recorded in the state and
  read with :func:`jaxcomp.metrics`.

With ``axis_name=None`` the transform quantizes and dequantizes locally (one
worker); with an axis name it performs the exchange, so the train step needs no
``pmean``.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Literal, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp import rng

NonFinitePolicy = Literal["propagate", "zero"]
SkipSpec = Union[None, Any, Callable[[Any], Any]]

STANDARD_METRICS = (
    "bytes_on_wire",
    "float32_bytes",
    "compressed_bytes_on_wire",
    "compressed_float32_bytes",
    "float_bytes",
    "encoded_bytes",
    "nonfinite_tensors",
)


class CompressState(NamedTuple):
  """State of :func:`compress`."""

  count: jax.Array  # int32 step counter
  key: jax.Array  # PRNG key, identical on every worker
  inner: Any  # per-tensor compressor states (Compressor.init_state), identical on every worker
  local: core.WorkerLocal


def _resolve_skip(skip: SkipSpec, tree: Any, min_size: int, everything: bool = False) -> list[bool]:
  """Per-leaf booleans: True keeps the leaf in float."""
  leaves, treedef = jax.tree.flatten(tree)
  if everything:
    return [True] * len(leaves)
  if skip is None:
    flags = [False] * len(leaves)
  else:
    spec = skip(tree) if callable(skip) else skip
    try:
      spec_leaves = treedef.flatten_up_to(spec)
    except (ValueError, TypeError) as e:
      raise ValueError(
          "`skip` must be a pytree of booleans with the structure of the "
          "gradients (or a prefix of it), or a callable returning one "
          f"(as optax.masked's mask): {e}"
      ) from None
    flags = []
    for s, leaf in zip(spec_leaves, leaves):
      sub = jax.tree.leaves(s)
      if not all(isinstance(b, (bool, np.bool_)) for b in sub):
        raise TypeError(
            "`skip` must hold Python booleans (it decides statically which "
            f"tensors stay in float); got {sub!r}."
        )
      flags.append(bool(all(sub)) if sub else False)
  for i, leaf in enumerate(leaves):
    if leaf is None:
      continue
    n = int(np.prod(np.shape(leaf), dtype=np.int64))
    if n == 0 or n < min_size:
      flags[i] = True
  return flags


def _check_float(leaf: Any) -> None:
  dtype = jnp.asarray(leaf).dtype if not hasattr(leaf, "dtype") else leaf.dtype
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"jaxcomp compresses floating-point gradients; got a {dtype} leaf.")


def _metric_keys(compressor: Optional[core.Compressor]) -> tuple[str, ...]:
  extra = tuple(getattr(compressor, "metric_keys", ())) if compressor is not None else ()
  return STANDARD_METRICS + extra


def compress(
    compressor: Optional[core.Compressor],
    *,
    axis_name: parallel.AxisName = None,
    error_feedback: Optional[bool] = None,
    skip: SkipSpec = None,
    min_size: int = 0,
    seed: int = 0,
    nonfinite: NonFinitePolicy = "propagate",
    tensor_metrics: Optional[str] = None,
) -> optax.GradientTransformationExtraArgs:
  """Compresses, exchanges and averages gradients.

  Args:
    compressor: a per-tensor compressor, or ``None`` to send every tensor as
      float (the uncompressed ``pmean`` baseline).
    axis_name: the named worker axis (a name or a tuple of names) of the
      surrounding ``vmap``/``pmap``/``shard_map``; ``None`` for one worker.
    error_feedback: keep a residual per tensor (default: the compressor's
      ``error_feedback`` class attribute).
    skip: which tensors stay in float, as ``optax.masked``'s ``mask`` but
      inverted: a pytree of booleans (True = keep in float) with the
      gradients' structure or a prefix of it, or a callable taking the
      gradients and returning one. See :func:`skip_by_path`.
    min_size: tensors with fewer elements stay in float (QSGD §5 keeps tensors
      under 10K elements in float; 3LC §4.2 the small batch-norm tensors).
    seed: seeds the state's PRNG key.
    nonfinite: what a NaN or Inf in a worker's tensor does.
      ``"propagate"`` (default): every worker's averaged tensor becomes all-NaN
      (as in uncompressed training, where the NaN would reach the mean), the
      worker's residual keeps its previous value, and a one-byte-per-tensor
      flag travels with the exchange (counted in ``bytes_on_wire``).
      ``"zero"``: the worker sends that tensor as zeros for this step and keeps
      its residual; nothing extra crosses the wire. Either way the count of
      non-finite tensors is reported as the metric ``nonfinite_tensors``.
    tensor_metrics: a regular expression (``re.search``) on tensor paths
      (see :func:`path_str`, e.g. ``"fc6/kernel"``). Every compressed tensor
      it matches reports two more counters, for this worker's own message:
      ``"zeros:<path>"``, the elements that decode to exactly 0, and
      ``"elements:<path>"``, its size; their ratio is the sparsity of what
      the worker sent (TernGrad Fig. 4(c): 71.32% of AlexNet's fc6 codes are
      0). Counted on the worker, never sent; with neither error feedback nor
      a custom exchange it costs one extra decode of each matched tensor.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates are the
    averaged, decompressed gradients in the gradients' dtypes.
  """
  if nonfinite not in ("propagate", "zero"):
    raise ValueError(f"nonfinite must be 'propagate' or 'zero'; got {nonfinite!r}.")
  if min_size < 0:
    raise ValueError(f"min_size must be >= 0; got {min_size}.")
  parallel._names(axis_name)  # validates
  use_ef = bool(compressor is not None and (compressor.error_feedback if error_feedback is None else error_feedback))
  if compressor is None and error_feedback:
    raise ValueError("error_feedback needs a compressor.")
  keys = _metric_keys(compressor)
  tracked_re = re.compile(tensor_metrics) if tensor_metrics else None

  def tracked(tree, flags) -> dict[int, str]:
    """``{leaf index: path}`` of the compressed leaves ``tensor_metrics`` matches."""
    if tracked_re is None:
      return {}
    paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    return {i: p for i, p in enumerate(paths) if not flags[i] and tracked_re.search(p)}

  def init_fn(params):
    leaves, treedef = jax.tree.flatten(params)
    for leaf in leaves:
      _check_float(leaf)
    flags = _resolve_skip(skip, params, min_size, compressor is None)
    residual = [
        optax.MaskedNode() if (f or not use_ef) else jnp.zeros(jnp.shape(p), jnp.float32)
        for p, f in zip(leaves, flags)
    ]
    if compressor is not None:
      for p, f in zip(leaves, flags):
        if not f:
          compressor.validate(tuple(jnp.shape(p)), jnp.asarray(p).dtype)
    metrics = {k: jnp.zeros((), jnp.int32) for k in keys}
    for path in tracked(params, flags).values():
      metrics[f"zeros:{path}"] = metrics[f"elements:{path}"] = jnp.zeros((), jnp.int32)
    # The per-step reference sizes are static: record them from the start, with no
    # byte sent yet, so that a wrapper that skips an exchange on some steps (local
    # steps) can carry them while reporting zero wire bytes.
    metrics["float32_bytes"] = jnp.int32(sum(4 * core.size_of(jnp.shape(p)) for p in leaves))
    metrics["compressed_float32_bytes"] = jnp.int32(
        sum(4 * core.size_of(jnp.shape(p)) for p, f in zip(leaves, flags) if not f)
    )
    key = jax.random.PRNGKey(seed)
    inner = [
        optax.MaskedNode() if (f or compressor is None)
        else _or_masked(compressor.init_state(tuple(jnp.shape(p)), jax.random.fold_in(key, i)))
        for i, (p, f) in enumerate(zip(leaves, flags))
    ]
    return CompressState(
        count=jnp.zeros((), jnp.int32),
        key=jax.random.fold_in(key, len(leaves)),
        inner=treedef.unflatten(inner),
        local=core.WorkerLocal(residual=treedef.unflatten(residual), metrics=metrics),
    )

  def update_fn(updates, state, params=None, **extra_args):
    del params, extra_args
    leaves, treedef = jax.tree.flatten(updates)
    for leaf in leaves:
      _check_float(leaf)
    flags = _resolve_skip(skip, updates, min_size, compressor is None)
    tracked_paths = tracked(updates, flags)
    residuals = treedef.flatten_up_to(state.local.residual)
    inners = treedef.flatten_up_to(state.inner)
    key, step_key = jax.random.split(state.key)
    worker = parallel.axis_index(axis_name)
    has_axis = bool(parallel._names(axis_name))

    # Pass 1: inputs with error feedback, and non-finite flags.
    xs, bad = [], []
    for g, r, f in zip(leaves, residuals, flags):
      if f:
        xs.append(None)
        bad.append(None)
        continue
      x = g.astype(jnp.float32)
      if use_ef:
        x = x + r
      b = jnp.logical_not(jnp.all(jnp.isfinite(x)))
      xs.append(jnp.where(b, jnp.zeros_like(x), x))
      bad.append(b)
    compressed_idx = [i for i, f in enumerate(flags) if not f]
    flag_bytes = 0
    any_bad = {}
    if compressed_idx:
      local_flags = jnp.stack([bad[i] for i in compressed_idx]).astype(jnp.uint8)
      if nonfinite == "propagate" and has_axis:
        global_flags = parallel.pmax(local_flags, axis_name)
        flag_bytes = local_flags.nbytes
      else:
        global_flags = local_flags
      for j, i in enumerate(compressed_idx):
        any_bad[i] = global_flags[j] > 0

    # Pass 2: exchange.
    out, new_res, new_inner = [], [], []
    m = {k: jnp.zeros((), jnp.int32) for k in keys}
    static = dict.fromkeys(STANDARD_METRICS, 0)
    static["compressed_bytes_on_wire"] = flag_bytes
    for i, (g, r, f) in enumerate(zip(leaves, residuals, flags)):
      n = core.size_of(g.shape)
      static["float32_bytes"] += 4 * n
      if f:
        out.append(parallel.pmean(g, axis_name) if has_axis else g)
        new_res.append(r)
        new_inner.append(inners[i])
        static["float_bytes"] += n * g.dtype.itemsize
        continue
      k = rng.leaf_key(step_key, i, worker)
      if compressor.custom_exchange:
        ex = compressor.exchange(xs[i], k, axis_name, _from_masked(inners[i]))
        mean, own, payload, wire = ex.mean, ex.own, ex.payload, ex.wire_bytes
        enc_metrics = ex.metrics or {}
        new_inner.append(_or_masked(ex.state))
      else:
        mean, own, payload, wire, enc_metrics = parallel.exchange_with_metrics(
            compressor, xs[i], k, axis_name, need_own=use_ef
        )
        new_inner.append(inners[i])
      if nonfinite == "propagate":
        mean = jnp.where(any_bad[i], jnp.full_like(mean, jnp.nan), mean)
      out.append(mean.astype(g.dtype))
      if use_ef:
        new_res.append(jnp.where(bad[i], r, xs[i] - own))
      else:
        new_res.append(r)
      static["compressed_bytes_on_wire"] += wire
      static["compressed_float32_bytes"] += 4 * n
      enc = compressor.encoded_bytes(payload, g.shape)
      m["encoded_bytes"] = m["encoded_bytes"] + (
          jnp.asarray(enc, jnp.int32) if enc is not None else jnp.int32(wire)
      )
      m["nonfinite_tensors"] = m["nonfinite_tensors"] + bad[i].astype(jnp.int32)
      for name, value in {**enc_metrics, **compressor.extra_metrics(payload, g.shape)}.items():
        m[name] = m[name] + jnp.asarray(value, jnp.int32)
      if i in tracked_paths:
        sent = own if own is not None else compressor.decode(payload, g.shape)
        m[f"zeros:{tracked_paths[i]}"] = jnp.sum(sent == 0, dtype=jnp.int32)
        m[f"elements:{tracked_paths[i]}"] = jnp.int32(n)
    static["bytes_on_wire"] = static["compressed_bytes_on_wire"] + static["float_bytes"]
    for name in ("bytes_on_wire", "float32_bytes", "compressed_bytes_on_wire",
                 "compressed_float32_bytes", "float_bytes"):
      m[name] = jnp.int32(static[name])
    m["encoded_bytes"] = m["encoded_bytes"] + jnp.int32(static["float_bytes"] + flag_bytes)
    new_state = CompressState(
        count=optax.safe_increment(state.count),
        key=key,
        inner=treedef.unflatten(new_inner),
        local=core.WorkerLocal(residual=treedef.unflatten(new_res), metrics=m),
    )
    return treedef.unflatten(out), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _or_masked(x: Any) -> Any:
  return optax.MaskedNode() if x is None else x


def _from_masked(x: Any) -> Any:
  return None if isinstance(x, optax.MaskedNode) else x


def pmean(axis_name: parallel.AxisName = None, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """The uncompressed float baseline: averages gradients with ``lax.pmean``.

  Records the same metrics as the compressed transforms (``bytes_on_wire`` is
  the bytes of the gradients as given to ``pmean``), so runs compare directly.
  ``**kwargs`` are accepted for a uniform interface (``seed``, ``skip``,
  ``min_size`` change nothing here: every tensor is sent in float).
  """
  return compress(None, axis_name=axis_name, **kwargs)


def skip_by_path(predicate: Callable[[str], bool]) -> Callable[[Any], Any]:
  """A ``skip`` callable from a predicate on a tensor's path.

  The path is the ``/``-joined key path, e.g. ``"params/logits/kernel"``.

  Example::

    jaxcomp.terngrad(skip=jaxcomp.skip_by_path(lambda p: "logits" in p))
  """

  def skip(tree):
    return jax.tree_util.tree_map_with_path(lambda path, _: bool(predicate(path_str(path))), tree)

  return skip


def path_str(path) -> str:
  """``/``-joined names of a ``jax.tree_util`` key path."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)
