r"""The training and evaluation steps.

How a step runs. ``config.workers`` workers are laid over the devices of a
mesh: ``D`` devices each hold ``N / D`` workers, simulated with ``vmap``
inside a ``shard_map`` over the mesh. Every worker computes gradients on its
own ``batch_size / N`` examples; the compression transform (first link of the
optax chain) quantizes them, moves the packed codes with ``lax.all_gather``
over the axes ``("devices", "workers")`` and returns the average, so the
parameters and the optimizer state stay identical on every worker ("parameter
localization", TernGrad §3.1) and are stored once; only the compressors'
worker-local state (error-feedback residuals) has a worker axis. The layout,
the ``vmap`` inside the ``shard_map`` and their checks are
:func:`jaxcomp.data_parallel`'s, as in a user's program; this module writes
one worker's step (:func:`make_worker_step`) and what a run adds around it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import optimizers
from experiments.state import TrainState
import jaxcomp
from jaxcomp import parallel
from jaxcomp.exchange import transport



def worker_axes(mesh) -> tuple[str, ...]:
  """The workers' axes, major to minor: the mesh's (``"devices"``, or ``"hosts", "devices"``), then
  ``"workers"`` (vmap)."""
  return tuple(mesh.axis_names) + ("workers",)


def cross_entropy(logits, labels, num_classes):
  """Per-example softmax cross-entropy of integer ``labels``."""
  return optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, num_classes))


def ema_decay_at(step, decay):
  """TensorFlow's ExponentialMovingAverage with num_updates: min(decay, (1+t)/(10+t)).

  TernGrad's TensorFlow code keeps its 0.9999 average this way, so early
  parameters do not dominate the average of a short run.
  """
  t = step.astype(jnp.float32)
  return jnp.minimum(decay, (1.0 + t) / (10.0 + t))


def make_loss_fn(config, model, num_classes, has_bn):
  """``loss_fn(params, batch_stats, images, labels, key) -> (loss, (logits, new_vars))``."""

  def loss_fn(params, batch_stats, images, labels, key):
    variables = {"params": params}
    if has_bn:
      variables["batch_stats"] = batch_stats
      logits, new_vars = model.apply(variables, images, train=True, mutable=["batch_stats"],
                                     rngs={"dropout": key})
    else:
      logits = model.apply(variables, images, train=True, rngs={"dropout": key})
      new_vars = {}
    loss = jnp.mean(cross_entropy(logits, labels, num_classes))
    return loss, (logits, new_vars)

  return loss_fn


def loss_and_grad(config, loss_fn, params, batch_stats, images, labels, key):
  """One worker's loss and gradients, with weight decay when ``weight_decay_mode == "loss"``.

  The L2 term ``0.5 * wd * ||w||^2`` of the papers' Caffe/TensorFlow losses
  contributes ``wd * w`` to every worker's gradient (so it is part of what gets
  compressed); it is added after differentiating the data loss, which is the
  same gradient and lets XLA keep the data part fused.

  Returns:
    ``(grads, loss, logits, new_vars)``: ``loss`` is the data loss (without the
    L2 term), ``new_vars`` the updated batch-norm statistics (if any).
  """
  (loss, (logits, new_vars)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, batch_stats, images, labels, key)
  if config.weight_decay and config.weight_decay_mode == "loss":
    grads = jax.tree.map(lambda g, w, on: g + config.weight_decay * w if on else g,
                         grads, params, optimizers.decay_mask(config, params))
  return grads, loss, logits, new_vars


def norms(grads, updates, opt_state, axes) -> dict[str, jax.Array]:
  """One worker's global L2 norms of a step (``config.log_norms``; the columns of :data:`NORMS`).

  They show where a compressed run parts from the float one: an update that
  grows while the averaged gradient does not, or a residual that grows
  without bound (error feedback that never catches up).
  """
  residuals = [x.residual for x in jaxcomp.core.worker_locals(opt_state)]
  return {"grad_norm": optax.tree.norm(grads),
          "mean_grad_norm": optax.tree.norm(parallel.pmean(grads, axes)),
          "update_norm": optax.tree.norm(updates),
          "residual_norm": optax.tree.norm(residuals)}


# The columns config.log_norms adds to metrics.csv (train rows: means over the row's steps).
NORMS = {
    "grad_norm": "‖g‖ of a worker's gradient (mean over workers)",
    "mean_grad_norm": "‖mean of the workers' gradients‖ (what a float exchange would average)",
    "update_norm": "‖update‖ the optimizer applied to the parameters (after exchange, momentum, LR)",
    "residual_norm": "‖error-feedback residual‖ of a worker, over every compressed tensor (0 without)",
}


def make_train_step(config, model, tx, mesh, num_classes, bn_template, *, donate: bool = True):
  """Returns a jitted ``step(state, images[N,b,...], labels[N,b], key) -> (state, metrics)``.

  The data-parallel part is :func:`jaxcomp.data_parallel`'s, with
  ``config.workers / devices`` workers on each device of ``mesh`` (see the
  module docstring); around it, the EMA and the step's metrics.
  ``bn_template`` is the model's ``batch_stats`` (empty for models without
  batch norm). The step donates ``state``: the parameters, optimizer state
  and EMA it replaces are updated in place, not held twice; the caller must
  not use a state after passing it. ``donate=False`` gives the same step
  without donation (``benchmarks/train_memory.py`` compares the two).
  """
  parallel_step = jaxcomp.data_parallel(make_worker_step(config, model, tx, mesh, num_classes, bn_template),
                                        tx, mesh=mesh, workers=config.workers)
  @functools.partial(jax.jit, donate_argnums=(0,) if donate else ())
  def step(state: TrainState, images, labels, key):
    keys = worker_keys(key, config.workers)
    (params, batch_stats), opt_state, m = parallel_step.mapped(
        (state.params, state.batch_stats), state.opt_state, (images, labels, keys))
    ema = state.ema_params
    if config.ema_decay > 0:
      d = ema_decay_at(state.step, config.ema_decay)
      ema = jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, ema, params)
    new_state = TrainState(state.step + 1, params, batch_stats, opt_state, ema)
    metrics = {k: jnp.mean(v) for k, v in m.items()}
    metrics.update(jaxcomp.metrics(opt_state))
    return new_state, metrics

  return step


def share_batch_stats(config, batch_stats):
  """The workers' batch-norm statistics made one (a message, counted by the transport as ``bn_stats_bytes``).

  ``config.batch_norm_stats``: ``"mean"`` averages them; otherwise worker 0's are every worker's.
  """
  if config.batch_norm_stats == "mean":
    return (yield jaxcomp.core.Message("mean", batch_stats))
  return jax.tree.map(lambda a: a[0], (yield jaxcomp.core.Message("gather", batch_stats)))


def worker_keys(key, workers):
  """Worker ``i``'s key of a step: ``fold_in(key, i)``, ``i`` numbered as :func:`jaxcomp.parallel.axis_index` numbers it."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(workers, dtype=jnp.int32))


def make_worker_step(config, model, tx, mesh, num_classes, bn_template):
  """One worker's step: ``((params, batch_stats), opt_state, (images, labels, key))`` to the same and its metrics."""
  has_bn = bool(jax.tree.leaves(bn_template))
  loss_fn = make_loss_fn(config, model, num_classes, has_bn)
  every = worker_axes(mesh)

  def worker(replicated, opt_state, batch):
    params, batch_stats = replicated
    images, labels, key = batch
    # DiLoCo's workers differentiate at their own local parameters (jaxcomp.local_params);
    # under any other optimizer these are ``params``.
    grads, loss, logits, new_vars = loss_and_grad(config, loss_fn, jaxcomp.local_params(opt_state, params),
                                                  batch_stats, images, labels, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    extra = norms(grads, updates, opt_state, every) if config.get("log_norms", False) else {}
    params = optax.apply_updates(params, updates)
    bn_traffic = transport.Traffic()
    if has_bn:
      batch_stats = transport.run(share_batch_stats(config, new_vars["batch_stats"]), every, bn_traffic)
    acc = jnp.mean(jnp.argmax(logits, -1) == labels)
    return (params, batch_stats), opt_state, {"loss": loss, "accuracy": acc,
                                              "bn_stats_bytes": jnp.float32(int(bn_traffic.sent)), **extra}

  return worker


# ----------------------------------------------------------------------------
# Evaluation.


def make_eval_step(model, num_classes, has_bn):
  """Returns a jitted ``eval_step(params, batch_stats, images, labels, mask)`` of masked sums.

  The sums (``loss``, ``correct``, ``correct_top5``, ``count``) count only the
  examples whose ``mask`` is set (the padding of the last batch is not).
  """

  @jax.jit
  def eval_step(params, batch_stats, images, labels, mask):
    variables = {"params": params}
    if has_bn:
      variables["batch_stats"] = batch_stats
    logits = model.apply(variables, images, train=False)
    loss = cross_entropy(logits, labels, num_classes)
    correct = jnp.argmax(logits, -1) == labels
    top5 = jnp.any(jax.lax.top_k(logits, min(5, num_classes))[1] == labels[:, None], axis=-1)
    m = mask.astype(jnp.float32)
    return {"loss": jnp.sum(loss * m), "correct": jnp.sum(correct * m),
            "correct_top5": jnp.sum(top5 * m), "count": jnp.sum(m)}

  return eval_step


def evaluate(eval_step, params, batch_stats, pipeline) -> dict[str, float]:
  """Loss and top-1/top-5 accuracy over the whole test split.

  Each process evaluates its own slice of every eval batch on one of its
  devices (``params`` may be global: this process's copy is used); the
  processes' sums are then added up.
  """
  params, batch_stats = _local_copy(params), _local_copy(batch_stats)
  keys = ("loss", "correct", "correct_top5", "count")
  totals = {k: 0.0 for k in keys}
  for batch in pipeline.reset():
    out = jax.device_get(eval_step(params, batch_stats, batch["image"], batch["label"], batch["mask"]))
    for k in totals:
      totals[k] += float(out[k])
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    summed = np.sum(multihost_utils.process_allgather(np.array([totals[k] for k in keys])), axis=0)
    totals = dict(zip(keys, summed.tolist()))
  n = max(totals["count"], 1.0)
  return {"loss": totals["loss"] / n, "accuracy": totals["correct"] / n,
          "top5_accuracy": totals["correct_top5"] / n, "count": totals["count"]}


def _local_copy(tree):
  """This process's copy of a replicated (global) pytree, on one of its devices."""
  return jax.tree.map(lambda a: a.addressable_data(0) if isinstance(a, jax.Array) else a, tree)
