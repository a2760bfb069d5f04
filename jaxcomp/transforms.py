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
* **accounting**: the bytes handed to collectives, recorded in the state as
  exact :class:`~jaxcomp.count.Count` s and read with :func:`jaxcomp.metrics`.

An update is a sequence of named steps, per tensor: add the residual
(:func:`add_residual`), set aside non-finite input (:func:`set_aside_nonfinite`,
:func:`agree_on_nonfinite`, in the exchange's messages), skip (:func:`send_float`) or exchange (agree,
encode, all_gather, decode: :func:`jaxcomp.exchange.allgather.exchange`, or the
compressor's own :meth:`~jaxcomp.core.Compressor.exchange`), carry the
residual (:func:`carry_residual`), count (:func:`count_tensor`,
:func:`count_all`). The exchange is the one step that differs between
exchange schemes: ``exchange="all_gather"`` (every worker gathers every
payload), ``"two_phase"`` (a compressed reduce-scatter and all-gather,
:mod:`jaxcomp.exchange.two_phase`) or ``"auto"`` (per bucket, whichever receives fewer
bytes for the axis size, decided at trace time: :func:`jaxcomp.exchange.plan.choose_buckets`).

With ``axis_name=None`` the transform quantizes and dequantizes locally (one
worker); with an axis name it performs the exchange, so the train step needs no
``pmean``.
"""


from __future__ import annotations

import re
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import parallel
from jaxcomp.compress_update import Compress
from jaxcomp.exchange import buckets
from jaxcomp.exchange import plan as plan_lib
from jaxcomp.update_steps import CompressState, path_str  # pylint: disable=unused-import  (the public names)
from jaxcomp.update_steps import NonFinitePolicy, SkipSpec, check_float, is_float, resolve_skip


def _pass_through_skipped_nonfloat(
    tx: optax.GradientTransformationExtraArgs, skip: SkipSpec, min_size: int
) -> optax.GradientTransformationExtraArgs:
  """``tx`` with the non-float leaves that ``skip`` (or ``min_size``) keeps in float passed through untouched.

  Such a leaf (an integer counter, the ``float0`` gradient of an integer
  parameter) is neither exchanged nor counted: ``tx`` sees an empty float32
  placeholder in its place, which costs nothing. Any other non-float leaf is
  a TypeError naming its path.
  """

  def split(tree):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    through = [not is_float(leaf) for _, leaf in flat]
    if not any(through):
      return tree, through
    for (path, leaf), kept, t in zip(flat, resolve_skip(skip, tree, min_size), through):
      if t and not kept:
        check_float(leaf, path_str(path))
    return treedef.unflatten([jnp.zeros((0,), jnp.float32) if t else leaf for (_, leaf), t in zip(flat, through)]), through

  def init_fn(params):
    return tx.init(split(params)[0])

  def update_fn(updates, state, params=None, **extra_args):
    inner, through = split(updates)
    new_updates, state = tx.update(inner, state, params, **extra_args)
    if not any(through):
      return new_updates, state
    leaves, treedef = jax.tree.flatten(updates)
    merged = [g if t else u for g, u, t in zip(leaves, treedef.flatten_up_to(new_updates), through)]
    return treedef.unflatten(merged), state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)




# -- the transform -------------------------------------------------------------


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
    exchange: plan_lib.Exchange = "all_gather",
    bucket_bytes: int = buckets.DEFAULT_BUCKET_BYTES,
    within: parallel.AxisName = None,
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
      gradients and returning one. See :func:`skip_by_path`. A non-float
      leaf (an integer counter, the ``float0`` gradient of an integer
      parameter) must be skipped: it then passes through untouched, neither
      exchanged nor counted; otherwise it is a TypeError naming its path.
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
      With ``exchange`` other than ``"all_gather"`` a matched tensor also
      reports ``"two_phase:<path>"``: 1 if it took the two-phase exchange.
    exchange: how each compressed tensor crosses the wire.
      ``"all_gather"`` (default): every worker gathers every worker's payload
      (each receives ``(N − 1)·P`` bytes). ``"two_phase"``: a compressed
      reduce-scatter, re-encoding and all-gather (:mod:`jaxcomp.exchange.two_phase`;
      each receives ``≈ 2(N − 1)/N·P``); tensors too small to split over the
      axis stay on the all-gather. ``"auto"``: per bucket, the one under
      which the bucket's tensors receive fewer bytes for the axis size,
      decided at trace time. A compressor with ``bucket_encode`` (TernGrad,
      QSGD, int8, 3LC) encodes a bucket's two-phase tensors at once in each
      phase (:func:`jaxcomp.exchange.two_phase.bucket_steps`). With
      either, the metric ``two_phase_tensors`` counts the tensors that took
      the two-phase exchange and ``received_bytes`` the bytes that reached
      this worker (see :func:`jaxcomp.metrics`). With error feedback, the two-phase exchange keeps a second,
      full-size residual per tensor for the shard the worker re-encodes (in
      the state's ``shard``; allocated for ``"two_phase"`` and ``"auto"``).
      Compressors with their own exchange (PowerSGD) refuse ``"two_phase"``
      and keep their own with ``"auto"``.
    bucket_bytes: tensors are exchanged in buckets of about this many bytes
      of float32 gradient, filled in reverse order (the last layers first, as
      PyTorch DDP does): each round of a bucket's exchanges (an agreement, an
      all-gather, an all-to-all, the float tensors' mean) is one collective
      per bucket instead of one per tensor (:mod:`jaxcomp.exchange.buckets`). The
      numbers (updates, states, metrics) are the same, bit for bit (PowerSGD: to a
      few ulp, see :mod:`jaxcomp.exchange.buckets`), as with
      ``0``: one exchange per tensor. Over ``vmap``-simulated workers alone
      nothing crosses a wire and tensors go one at a time whatever the value.
    within: a hierarchy (:mod:`jaxcomp.exchange.hierarchy`): the axis (a name or a
      tuple of names) of the devices of one host, over which gradients are
      averaged in float before the compressed exchange over ``axis_name``,
      which then runs once per host, each device of the host exchanging one
      slice of every tensor. ``None`` (default): every worker of
      ``axis_name`` exchanges its own compressed gradient. With ``within``
      the counters are per device and the bytes over ``within`` are counted
      apart, as ``local_bytes``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates are the
    averaged, decompressed gradients in the gradients' dtypes. Its state's
    counters (read with :func:`jaxcomp.metrics`) are those of the last
    update; before the first update they hold the sizes that are static per
    step and zero for the rest. Those sizes are part of the state's pytree
    structure and depend on the configuration (``axis_name`` counts the
    agreement bytes): initialize the state with the transform that updates it.
  """
  if nonfinite not in ("propagate", "zero"):
    raise ValueError(f"nonfinite must be 'propagate' or 'zero'; got {nonfinite!r}.")
  if min_size < 0:
    raise ValueError(f"min_size must be >= 0; got {min_size}.")
  buckets.check_bucket_bytes(bucket_bytes)
  parallel.axis_names(axis_name)  # validates
  if set(parallel.axis_names(within)) & set(parallel.axis_names(axis_name)):
    raise ValueError(f"within={within!r} and axis_name={axis_name!r} share an axis: within names the "
                     "devices of one host (averaged in float), axis_name the hosts (compressed).")
  plan_lib.check_exchange(exchange)
  if compressor is not None:
    plan_lib.check(compressor, exchange)
  if compressor is None and error_feedback:
    raise ValueError("error_feedback needs a compressor.")
  use_ef = bool(compressor is not None and (compressor.error_feedback if error_feedback is None else error_feedback))
  steps = Compress(compressor, axis_name, within, skip, min_size, seed, nonfinite, exchange, bucket_bytes, use_ef,
                    re.compile(tensor_metrics) if tensor_metrics else None)
  return _pass_through_skipped_nonfloat(optax.GradientTransformationExtraArgs(steps.init, steps.update_fn),
                                        skip, min_size)




def skip_by_path(predicate: Callable[[str], bool]) -> Callable[[Any], Any]:
  """A ``skip`` callable from a predicate on a tensor's path.

  The path is the ``/``-joined key path, e.g. ``"params/logits/kernel"``.

  Example::

    jaxcomp.terngrad(skip=jaxcomp.skip_by_path(lambda p: "logits" in p))
  """

  def skip(tree):
    return jax.tree_util.tree_map_with_path(lambda path, _: bool(predicate(path_str(path))), tree)

  return skip


