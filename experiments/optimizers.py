"""The optax chain a run trains with: schedule, base optimizer, weight decay, compression.

:func:`make_tx` builds it from the config: the compression transform of
``config.compressor`` (:func:`jaxcomp.make_optimizer`) in front of the base
optimizer (``config.optimizer``) with its learning-rate schedule.
"""

from __future__ import annotations

import inspect
import re

from absl import logging
import jax
import ml_collections
import optax

import jaxcomp
from jaxcomp import parallel
from jaxcomp import models as models_lib

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adagrad")
SCHEDULES = ("constant", "polynomial", "staircase", "cosine", "piecewise")


def updates_per_step(config: ml_collections.ConfigDict) -> float:
  """Optimizer updates per training step: ``1/k`` under the ``local_steps`` wrapper, else 1.

  ``local_steps`` applies the optimizer (and advances its schedule) only on
  every ``k``-th step, so the learning-rate schedule spans
  ``num_train_steps / k`` updates: every run sweeps its whole LR range (3LC
  §4.3: "to ensure each training run to sweep the entire learning rate range").
  """
  if config.compressor != "local_steps":
    return 1.0
  k = config.compressor_kwargs.get("k", inspect.signature(jaxcomp.local_steps).parameters["k"].default)
  return 1.0 / k


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """The LR schedule, indexed by optimizer update (see :func:`updates_per_step`)."""
  base = config.learning_rate * (config.workers if config.lr_scale_with_workers else 1)
  steps = int(config.num_train_steps * updates_per_step(config)) - config.lr_warmup_steps
  if config.lr_schedule == "constant":
    sched = optax.constant_schedule(base)
  elif config.lr_schedule == "polynomial":
    sched = optax.polynomial_schedule(base, config.lr_end, config.lr_power, max(steps, 1))
  elif config.lr_schedule == "staircase":
    sched = optax.exponential_decay(base, config.lr_decay_steps, config.lr_decay_rate, staircase=True)
  elif config.lr_schedule == "piecewise":
    sched = optax.piecewise_constant_schedule(
        base, {max(int(round(b * steps)), 1): config.lr_decay_rate for b in config.lr_boundaries})
  else:  # cosine
    sched = optax.cosine_decay_schedule(base, max(steps, 1), alpha=config.lr_end / base if base else 0.0)
  if config.lr_warmup_steps:
    warm = optax.linear_schedule(0.0, base, config.lr_warmup_steps)
    sched = optax.join_schedules([warm, sched], [config.lr_warmup_steps])
  return sched


def make_base_optimizer(config: ml_collections.ConfigDict, schedule: optax.Schedule):
  """``config.optimizer`` with ``schedule``, after decoupled weight decay if the config sets it.

  ``adamw`` (Loshchilov and Hutter, arXiv:1711.05101, Alg. 2) applies its decoupled weight decay
  itself (scaled by the schedule, as optax.adamw does) when ``weight_decay_mode == "decoupled"``.
  With ``grad_clip_norm > 0`` the (exchanged, averaged) gradient is first clipped to that global
  norm.
  """
  decoupled = config.weight_decay and config.weight_decay_mode == "decoupled"
  clip = [jaxcomp.clip_by_global_norm(config.grad_clip_norm)] if config.grad_clip_norm else []  # optax's, sharded too
  if config.optimizer == "adamw":
    return optax.chain(*clip, optax.adamw(
        schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
        weight_decay=config.weight_decay if decoupled else 0.0,
        mask=lambda p: decay_mask(config, p)))
  if config.optimizer == "sgd":
    opt = optax.sgd(schedule)
  elif config.optimizer == "momentum":
    opt = optax.sgd(schedule, momentum=config.momentum)
  elif config.optimizer == "adam":
    opt = optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)
  else:
    opt = optax.adagrad(schedule, initial_accumulator_value=config.adagrad_init, eps=config.adagrad_eps)
  if decoupled:
    opt = optax.chain(optax.add_decayed_weights(config.weight_decay,
                                                mask=lambda p: decay_mask(config, p)), opt)
  return optax.chain(*clip, opt) if clip else opt


def decay_mask(config: ml_collections.ConfigDict, params):
  """Booleans over ``params``: which tensors weight decay applies to.

  All of them, unless ``config.weight_decay_pattern`` is set: then those whose
  path (``"fc3/kernel"``) it matches (``re.search``), e.g. only the fc3/fc4
  weights as in the TensorFlow CIFAR-10 tutorial that TernGrad's CifarNet uses.
  """
  pattern = config.weight_decay_pattern
  return jax.tree_util.tree_map_with_path(
      lambda path, _: pattern is None or re.search(pattern, jaxcomp.path_str(path)) is not None,
      params)


def make_skip(config: ml_collections.ConfigDict):
  """The tensors sent uncompressed (last layer, batch norm), or None to compress every one."""
  last, bn = config.skip_last_layer, config.skip_batch_norm

  def predicate(path: str) -> bool:
    return (last and models_lib.is_last_layer(path)) or (bn and models_lib.is_batch_norm(path))

  return jaxcomp.skip_by_path(predicate) if (last or bn) else None


def make_tx(config: ml_collections.ConfigDict, axis_name) -> optax.GradientTransformation:
  """The whole chain: ``config.compressor``'s exchange over ``axis_name``, then the optimizer.

  With a ``"hosts"`` axis (``config.hosts``) the exchange is hierarchical: compressed over
  ``"hosts"``, a float mean over the others (``within``, :mod:`jaxcomp.exchange.hierarchy`).
  With ``config.shard_optimizer`` the chain's state is cut over the workers (:func:`jaxcomp.shard_optimizer`),
  with ``config.shard_params`` the parameters too, gathered by :func:`param_gather`'s codec.
  """
  kwargs = dict(config.compressor_kwargs.to_dict())
  names = parallel.axis_names(axis_name)
  if "hosts" in names:
    kwargs["within"] = tuple(a for a in names if a != "hosts")
    axis_name = "hosts"
  if config.compressor == "none" and kwargs:
    # The floating baseline of an experiment is its config with compressor=none;
    # the compressor's own settings do not apply to it.
    logging.info("compressor 'none' (float32 pmean): ignoring compressor_kwargs %s", kwargs)
    kwargs = {}
  kwargs.setdefault("seed", config.seed)
  if config.compressor != "none":
    kwargs.setdefault("skip", make_skip(config))
    kwargs.setdefault("min_size", config.min_size)
  tx = jaxcomp.make_optimizer(
      config.compressor, make_base_optimizer(config, make_schedule(config)),
      axis_name=axis_name, **kwargs)
  if config.shard_optimizer or config.shard_params:
    tx = jaxcomp.shard_optimizer(tx, axis_name=axis_name, num_workers=config.workers,
                                 shard_params=config.shard_params, param_gather=param_gather(config))
  return tx


def param_gather(config: ml_collections.ConfigDict):
  """The codec of the sharded parameters' all-gather, or ``None``: float32.

  ``config.param_gather`` names a registered compressor, built with ``config.param_gather_kwargs``
  (:func:`experiments.throughput.compressor_of`); :func:`jaxcomp.shard_optimizer` refuses one that
  is stochastic or has no fixed-size payload.
  """
  if not config.param_gather:
    return None
  from experiments import throughput  # pylint: disable=g-import-not-at-top
  return throughput.compressor_of(config.param_gather, **config.param_gather_kwargs.to_dict())
