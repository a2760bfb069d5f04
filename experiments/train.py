r"""Data-parallel training with compressed gradient exchange.

Usage::

  python -m experiments.train --config configs/terngrad_lenet.py --workdir /tmp/run
  python -m experiments.train --config configs/terngrad_lenet.py:runlocal --workdir /tmp/run \
      --config.workers=8 --config.num_train_steps=200 --config.compressor=none

``train_and_evaluate(config, workdir)`` is importable (the Flax examples' layout).

How a step runs. ``config.workers`` workers are laid over the devices of a
mesh: ``D`` devices each hold ``N / D`` workers, simulated with ``vmap``
inside a ``shard_map`` over the mesh. Every worker computes gradients on its
own ``batch_size / N`` examples; the compression transform (first link of the
optax chain) quantizes them, moves the packed codes with ``lax.all_gather``
over the axes ``("devices", "workers")`` and returns the average, so the
parameters and the optimizer state stay identical on every worker ("parameter
localization", TernGrad §3.1) and are stored once; only the compressors'
worker-local state (error-feedback residuals) has a worker axis.

Several processes. A run is multi-process when any of these says so, and then
``jax.distributed.initialize`` is called before anything touches a device:

* the environment: ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0's
  coordinator; JAX reads it too), ``JAXCOMP_NUM_PROCESSES`` and
  ``JAXCOMP_PROCESS_ID`` (JAX 0.10 reads no variables for these two, so this
  trainer does; a launcher sets all three);
* a SLURM job step or an Open MPI job of more than one task (``SLURM_NTASKS``,
  ``OMPI_COMM_WORLD_SIZE``): JAX's own cluster detection supplies the rest;
* ``--config.distributed.*`` (``configs/common.py``), which overrides both.

JAX itself also reads ``JAX_LOCAL_DEVICE_IDS`` and
``JAX_COORDINATOR_BIND_ADDRESS``. The mesh then spans every process's devices
(the same number from each, process by process), so process ``p`` holds
workers ``p * N/P .. (p+1) * N/P - 1``, and reads only their examples: the
``p``-th slice of every global batch (``jaxcomp.data.pipeline``), the same
global batches in the same order as a single-process run. Metrics, the
summary and the config are written by process 0; every process takes part in
the (orbax) checkpoints. One process or several, with the same config and
seed a run computes the same numbers (``tests/test_multiprocess_train.py``).
When a process dies, the others stop within
``config.distributed.heartbeat_timeout_seconds`` (a collective with it fails
at once, the coordination service then ends them); started again with the
same workdir, the run resumes from its last checkpoint and ends as if nothing
had happened.

Outputs in ``workdir``:

* ``metrics.csv``: one row per logged training interval (``split=train``:
  means over the interval) and per evaluation (``split=test``); the columns
  are documented in :data:`CSV_DOC`.
* ``summary.json``: config, final test accuracy, bytes on the wire, timing.
* ``config.json``: the resolved config.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import inspect
import json
import math
import os
import re
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
from ml_collections import config_flags
import numpy as np
import optax

from experiments import distributed as distributed_env
import jaxcomp
from jaxcomp import data as data_lib
from jaxcomp import models as models_lib
from jaxcomp import parallel

AXES = ("devices", "workers")

# The launcher's variables (experiments.launch sets them; experiments.distributed documents them).
ENV_COORDINATOR_ADDRESS = distributed_env.COORDINATOR_ENV
ENV_NUM_PROCESSES = distributed_env.NUM_PROCESSES_ENV
ENV_PROCESS_ID = distributed_env.PROCESS_ID_ENV

CSV_DOC = {
    "step": "training step after which the row was written (1-based)",
    "split": "train (means over the steps since the previous train row; rows close every "
             "log_every steps, at every checkpoint and at the end) or test",
    "loss": "cross-entropy (train: mean over workers and steps; test: over the test set)",
    "accuracy": "top-1 accuracy in [0, 1]",
    "learning_rate": "learning rate of the last step",
    "bytes_on_wire": "bytes one worker handed to collectives per step (jaxcomp.metrics)",
    "float32_bytes": "the same gradients as float32",
    "compression_ratio": "float32_bytes / bytes_on_wire",
    "encoded_bytes": "as bytes_on_wire, with exact variable-length encoding sizes",
    "bn_stats_bytes": "bytes of batch-norm statistics exchanged per step",
    "steps_per_sec": "training steps per second over the interval (wall clock)",
    "wall_time": "seconds since training started",
    "train_time": "seconds spent in training steps since training started: evaluations, "
                  "checkpoints and the first step of each invocation (it compiles) excluded",
}


class TrainState(NamedTuple):
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any
  ema_params: Any


# ----------------------------------------------------------------------------
# Several processes.


def _env_int(name: str) -> Optional[int]:
  value = os.environ.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"${name}={value!r} is not an integer.") from None


def _cluster_tasks() -> int:
  """Tasks of the SLURM job step or Open MPI job this process belongs to (1 if none).

  The same variables JAX's cluster detection reads; only a job of more than
  one task makes the run multi-process (a one-task job stays single-process).
  """
  if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_NODELIST" in os.environ:
    return _env_int("SLURM_NTASKS") or 1
  if "OMPI_MCA_orte_hnp_uri" in os.environ:
    return _env_int("OMPI_COMM_WORLD_SIZE") or 1
  return 1


def distributed_settings(config: ml_collections.ConfigDict) -> Optional[dict[str, Any]]:
  """The arguments of ``jax.distributed.initialize`` for this run, or None (one process).

  ``config.distributed`` overrides the environment (see the module docstring);
  what neither gives is left to JAX's cluster detection.

  Raises:
    ValueError: inconsistent or incomplete settings.
  """
  d = config.get("distributed") or ml_collections.ConfigDict()
  address = d.get("coordinator_address") or os.environ.get(ENV_COORDINATOR_ADDRESS) or None
  num = d.get("num_processes")
  num = _env_int(ENV_NUM_PROCESSES) if num is None else num
  pid = d.get("process_id")
  pid = _env_int(ENV_PROCESS_ID) if pid is None else pid
  method = d.get("cluster_detection_method")
  if num == 1:
    return None
  if num is None and method is None:
    if _cluster_tasks() > 1:
      pass  # JAX detects the address, count and id of a SLURM / Open MPI job.
    elif address is None and pid is None:
      return None
    else:
      raise ValueError(
          f"Bad config: a coordinator address or process id is set but not the number of "
          f"processes; set ${ENV_NUM_PROCESSES} and ${ENV_PROCESS_ID} (or "
          f"--config.distributed.num_processes / process_id), or unset ${ENV_COORDINATOR_ADDRESS}.")
  if num is not None and (num < 1 or (pid is not None and not 0 <= pid < num)):
    raise ValueError(f"Bad config: process_id={pid} must be in [0, num_processes={num}).")
  heartbeat = d.get("heartbeat_timeout_seconds")
  if heartbeat is None:  # the launcher's --heartbeat-timeout, else JAX's default
    heartbeat = _env_int(distributed_env.HEARTBEAT_TIMEOUT_ENV) or 100
  if heartbeat < 1:
    raise ValueError(f"Bad config: distributed.heartbeat_timeout_seconds must be >= 1, got {heartbeat}.")
  return dict(coordinator_address=address, num_processes=num, process_id=pid,
              cluster_detection_method=method, heartbeat_timeout_seconds=heartbeat,
              initialization_timeout=d.get("initialization_timeout_seconds", 300))


def initialize_distributed(config: ml_collections.ConfigDict) -> bool:
  """Starts multi-process JAX if this run is multi-process; returns whether it is.

  Idempotent: a process where ``jax.distributed`` is already initialized (by
  an earlier call, or by its launcher) is left as it is. Must run before
  anything touches a device (``train_and_evaluate`` calls it first).

  Raises:
    RuntimeError: the run is multi-process but a device was already used.
  """
  if jax.distributed.is_initialized():
    return True
  settings = distributed_settings(config)
  if settings is None:
    return False
  # XLA:CPU moves cross-process collectives through gloo (JAX 0.10's default;
  # set for releases without one). GPU and TPU backends ignore this option.
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(**settings)
  except RuntimeError as e:
    if "before" in str(e):
      raise RuntimeError(
          "This run is multi-process, but JAX already used a device in this process: call "
          "experiments.train.initialize_distributed(config) before any JAX computation.") from e
    raise
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


def is_writer() -> bool:
  """Whether this process writes the run's files (process 0)."""
  return jax.process_index() == 0


# ----------------------------------------------------------------------------
# Configuration checks (before anything is compiled).

OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad")
SCHEDULES = ("constant", "polynomial", "staircase", "cosine", "piecewise")


def num_devices_for(workers: int, available: int) -> int:
  """The largest divisor of ``workers`` that is at most ``available``."""
  return max(d for d in range(1, min(workers, available) + 1) if workers % d == 0)


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises a clear error for a config that cannot run, before any compile."""

  def bad(msg):
    raise ValueError(f"Bad config: {msg}")

  n_proc = jax.process_count()
  if not isinstance(config.workers, int) or config.workers < 1:
    bad(f"workers must be a positive integer, got {config.workers!r}.")
  if config.batch_size < 1 or config.batch_size % config.workers:
    bad(f"batch_size={config.batch_size} (the total over workers) must be a positive multiple "
        f"of workers={config.workers}.")
  if config.workers % n_proc:
    bad(f"workers={config.workers} must divide over {n_proc} processes (each holds "
        "workers / processes of them).")
  if config.dataset not in data_lib.DATASETS:
    bad(f"unknown dataset {config.dataset!r}; known: {', '.join(sorted(data_lib.DATASETS))}.")
  if eval_batch_size(config) % n_proc:
    bad(f"the eval batch ({eval_batch_size(config)}: eval_batch_size, at most the test split) "
        f"must divide over {n_proc} processes.")
  if config.model not in models_lib.MODELS:
    bad(f"unknown model {config.model!r}; known: {', '.join(models_lib.MODELS)}.")
  if config.compressor not in jaxcomp.names():
    bad(f"unknown compressor {config.compressor!r}; known: {', '.join(jaxcomp.names())}.")
  if config.optimizer not in OPTIMIZERS:
    bad(f"unknown optimizer {config.optimizer!r}; known: {', '.join(OPTIMIZERS)}.")
  if config.lr_schedule not in SCHEDULES:
    bad(f"unknown lr_schedule {config.lr_schedule!r}; known: {', '.join(SCHEDULES)}.")
  if config.lr_schedule == "staircase" and config.lr_decay_steps <= 0:
    bad("lr_schedule='staircase' needs lr_decay_steps > 0.")
  bounds = list(config.lr_boundaries)
  if config.lr_schedule == "piecewise" and not (all(0.0 < b < 1.0 for b in bounds) and bounds == sorted(bounds)):
    bad(f"lr_boundaries must be increasing fractions in (0, 1), got {config.lr_boundaries!r}.")
  if config.weight_decay_mode not in ("loss", "decoupled"):
    bad(f"weight_decay_mode must be 'loss' or 'decoupled', got {config.weight_decay_mode!r}.")
  if config.weight_decay_pattern is not None:
    try:
      re.compile(config.weight_decay_pattern)
    except re.error as e:
      bad(f"weight_decay_pattern {config.weight_decay_pattern!r} is not a regular expression: {e}.")
  if config.batch_norm_stats not in ("mean", "worker0"):
    bad(f"batch_norm_stats must be 'mean' or 'worker0', got {config.batch_norm_stats!r}.")
  if config.num_train_steps < 1:
    bad(f"num_train_steps must be >= 1, got {config.num_train_steps}.")
  if not 0.0 <= config.ema_decay < 1.0:
    bad(f"ema_decay must be in [0, 1), got {config.ema_decay}.")
  if config.eval_with_ema and config.ema_decay == 0.0:
    bad("eval_with_ema needs ema_decay > 0.")
  if config.max_devices < 0:
    bad(f"max_devices must be >= 0 (0: all), got {config.max_devices}.")
  if config.log_every < 1:
    bad(f"log_every must be >= 1, got {config.log_every}.")


def eval_batch_size(config: ml_collections.ConfigDict) -> int:
  """The global eval batch: ``config.eval_batch_size``, at most the test split."""
  return min(config.eval_batch_size, data_lib.get_spec(config.dataset).num_examples("test"))


# ----------------------------------------------------------------------------
# Optimizer.


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
  if config.optimizer == "sgd":
    opt = optax.sgd(schedule)
  elif config.optimizer == "momentum":
    opt = optax.sgd(schedule, momentum=config.momentum)
  elif config.optimizer == "adam":
    opt = optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)
  else:
    opt = optax.adagrad(schedule, initial_accumulator_value=config.adagrad_init, eps=config.adagrad_eps)
  if config.weight_decay and config.weight_decay_mode == "decoupled":
    opt = optax.chain(optax.add_decayed_weights(config.weight_decay,
                                                mask=lambda p: decay_mask(config, p)), opt)
  return opt


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
  last, bn = config.skip_last_layer, config.skip_batch_norm

  def predicate(path: str) -> bool:
    return (last and models_lib.is_last_layer(path)) or (bn and models_lib.is_batch_norm(path))

  return jaxcomp.skip_by_path(predicate) if (last or bn) else None


def make_tx(config: ml_collections.ConfigDict, axis_name) -> optax.GradientTransformation:
  kwargs = dict(config.compressor_kwargs.to_dict())
  if config.compressor == "none" and kwargs:
    # The floating baseline of an experiment is its config with compressor=none;
    # the compressor's own settings do not apply to it.
    logging.info("compressor 'none' (float32 pmean): ignoring compressor_kwargs %s", kwargs)
    kwargs = {}
  kwargs.setdefault("seed", config.seed)
  if config.compressor != "none":
    kwargs.setdefault("skip", make_skip(config))
    kwargs.setdefault("min_size", config.min_size)
  return jaxcomp.make_optimizer(
      config.compressor, make_base_optimizer(config, make_schedule(config)),
      axis_name=axis_name, **kwargs)


# ----------------------------------------------------------------------------
# The step.


def cross_entropy(logits, labels, num_classes):
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
                         grads, params, decay_mask(config, params))
  return grads, loss, logits, new_vars


def make_train_step(config, model, tx, mesh, opt_state_template, num_classes, bn_template, *,
                    donate: bool = True):
  """Returns a jitted ``step(state, images[N,b,...], labels[N,b], key) -> (state, metrics)``.

  ``bn_template`` is the model's ``batch_stats`` (empty for models without
  batch norm). The step donates ``state``: the parameters, optimizer state
  and EMA it replaces are updated in place, not held twice; the caller must
  not use a state after passing it. ``donate=False`` gives the same step
  without donation (``benchmarks/train_memory.py`` compares the two).
  """
  has_bn = bool(jax.tree.leaves(bn_template))
  loss_fn = make_loss_fn(config, model, num_classes, has_bn)
  axes = parallel.worker_axes(opt_state_template)
  specs = parallel.worker_specs(opt_state_template, "devices")

  def worker(params, batch_stats, opt_state, images, labels, key):
    key = jax.random.fold_in(key, parallel.axis_index(AXES))
    grads, loss, logits, new_vars = loss_and_grad(config, loss_fn, params, batch_stats, images,
                                                  labels, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    if has_bn:
      if config.batch_norm_stats == "mean":
        batch_stats = parallel.pmean(new_vars["batch_stats"], AXES)
      else:
        batch_stats = jax.tree.map(lambda a: a[0], parallel.all_gather(new_vars["batch_stats"], AXES))
    acc = jnp.mean(jnp.argmax(logits, -1) == labels)
    return params, batch_stats, opt_state, {"loss": loss, "accuracy": acc}

  vworker = jax.vmap(worker, in_axes=(None, None, axes, 0, 0, None),
                     out_axes=(None, None, axes, 0), axis_name="workers")
  sharded = jax.shard_map(
      vworker, mesh=mesh,
      in_specs=(P(), P(), specs, P("devices"), P("devices"), P()),
      out_specs=(P(), P(), specs, P("devices")),
      check_vma=False,  # collectives over the inner vmap axis (see jaxcomp.parallel)
  )
  bn_bytes = jaxcomp.core.tree_nbytes(bn_template)

  @functools.partial(jax.jit, donate_argnums=(0,) if donate else ())
  def step(state: TrainState, images, labels, key):
    params, batch_stats, opt_state, m = sharded(
        state.params, state.batch_stats, state.opt_state, images, labels, key)
    ema = state.ema_params
    if config.ema_decay > 0:
      d = ema_decay_at(state.step, config.ema_decay)
      ema = jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, ema, params)
    new_state = TrainState(state.step + 1, params, batch_stats, opt_state, ema)
    metrics = {k: jnp.mean(v) for k, v in m.items()}
    metrics.update(jaxcomp.metrics(opt_state))
    metrics["bn_stats_bytes"] = jnp.float32(bn_bytes)
    return new_state, metrics

  return step


# ----------------------------------------------------------------------------
# Evaluation.


def make_eval_step(model, num_classes, has_bn):
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


# ----------------------------------------------------------------------------
# Build: mesh, data, model, optimizer, state and compiled steps.


def make_mesh(workers: int, max_devices: int = 0) -> jax.sharding.Mesh:
  """The global mesh ``("devices",)`` the workers are laid over.

  Every process contributes the same number ``d`` of its devices (the largest
  divisor of ``workers / processes`` that it has, at most ``max_devices``),
  process by process, so process ``p`` holds the ``p``-th contiguous block of
  workers: the examples of the ``p``-th slice of every global batch.
  """
  by_process: dict[int, list[Any]] = {}
  for dev in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
    by_process.setdefault(dev.process_index, []).append(dev)
  available = min(len(devs) for devs in by_process.values())
  if max_devices:
    available = min(available, max_devices)
  per_process = num_devices_for(workers // len(by_process), available)
  devices = [dev for p in sorted(by_process) for dev in by_process[p][:per_process]]
  return jax.sharding.Mesh(np.array(devices), ("devices",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def state_shardings(mesh: jax.sharding.Mesh, state: TrainState) -> TrainState:
  """Replicated everywhere, but worker-local optimizer state split over ``"devices"``."""
  repl = NamedSharding(mesh, P())
  return TrainState(
      repl, jax.tree.map(lambda _: repl, state.params),
      jax.tree.map(lambda _: repl, state.batch_stats),
      jax.tree.map(lambda s: NamedSharding(mesh, s), parallel.worker_specs(state.opt_state, "devices")),
      jax.tree.map(lambda _: repl, state.ema_params))


def _to_global(tree, shardings):
  """Host values, identical in every process, as (global) arrays laid out by ``shardings``.

  Every leaf gets its own buffer (the step donates them: two leaves must not
  share one, as the initial EMA and parameters otherwise would).
  """

  def put(x, sharding):
    x = np.array(x)  # a private host copy
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, tree, shardings)


def _host_state(config, tx, variables) -> TrainState:
  """The state at step 0, as this process computes it (the same in every process)."""
  params = variables["params"]
  opt_state = parallel.replicate_workers(tx.init(params), config.workers)
  ema = params if config.ema_decay > 0 else {}
  return TrainState(jnp.zeros((), jnp.int32), params, variables.get("batch_stats", {}), opt_state, ema)


def initial_state(config, tx, variables, abstract: TrainState) -> TrainState:
  """The state at step 0, laid out as ``abstract``."""
  return _to_global(_host_state(config, tx, variables), jax.tree.map(lambda a: a.sharding, abstract))


def abstract_state(config, mesh, tx, variables) -> TrainState:
  """Shapes, dtypes and shardings of the state, computing nothing."""
  shapes = jax.eval_shape(lambda v: _host_state(config, tx, v), variables)
  return jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                      shapes, state_shardings(mesh, shapes))


@dataclasses.dataclass
class Run:
  """What :func:`build` makes: everything a run needs besides its state."""

  config: ml_collections.ConfigDict
  workdir: str
  mesh: jax.sharding.Mesh
  spec: Any  # the dataset's DatasetSpec
  image_shape: tuple[int, ...]
  pipeline_kwargs: dict[str, Any]
  eval_pipeline: data_lib.Pipeline
  model: Any
  state: TrainState  # abstract: shapes, dtypes, shardings (jax.ShapeDtypeStruct)
  init_state: Callable[[], TrainState]  # the state at step 0
  train_step: Any
  eval_step: Any
  schedule: optax.Schedule
  step_root: jax.Array  # the per-step keys are fold_in(step_root, step)
  checkpointer: Optional["_Checkpointer"]

  @property
  def has_bn(self) -> bool:
    return bool(jax.tree.leaves(self.state.batch_stats))

  def shard_batch(self, batch):
    """This process's slice of a global batch -> global ``[workers, b, ...]`` arrays."""
    c, local_workers = self.config, self.config.workers // jax.process_count()
    b = c.batch_size // c.workers
    sharding = NamedSharding(self.mesh, P("devices"))
    img = batch["image"].reshape((local_workers, b) + self.image_shape)
    lab = batch["label"].reshape((local_workers, b))
    return (jax.make_array_from_process_local_data(sharding, img),
            jax.make_array_from_process_local_data(sharding, lab))

  def eval_params(self, state: TrainState):
    return state.ema_params if self.config.eval_with_ema else state.params


def build(config: ml_collections.ConfigDict, workdir: str) -> Run:
  """Sets the run up in named steps; nothing is trained yet."""
  _write_config(config, workdir)
  mesh = make_mesh(config.workers, config.max_devices)
  spec = data_lib.get_spec(config.dataset)
  pipeline_kwargs = dict(seed=config.seed, augment=config.augment, data_dir=config.data_dir,
                         image_size=config.image_size, channels=config.channels,
                         process_index=jax.process_index(), process_count=jax.process_count())
  image_shape = tuple(data_lib.output_image_shape(config.dataset, config.augment,
                                                  config.image_size, config.channels))
  # The eval pipeline first: absent data (ImageNet here) fails at once, before the model is built.
  eval_pipeline = data_lib.make_pipeline(config.dataset, "test", train=False,
                                         global_batch_size=eval_batch_size(config), **pipeline_kwargs)
  model = models_lib.get_model(config.model, spec.num_classes, **config.model_kwargs.to_dict())
  init_key, step_root = jax.random.split(jax.random.PRNGKey(config.seed))
  variables = model.init({"params": init_key, "dropout": init_key},
                         jnp.zeros((1,) + image_shape, jnp.float32), train=False)
  tx = make_tx(config, AXES)
  state = abstract_state(config, mesh, tx, variables)
  init_state = functools.partial(initial_state, config, tx, variables, state)
  train_step = make_train_step(config, model, tx, mesh, state.opt_state, spec.num_classes,
                               state.batch_stats)
  eval_step = make_eval_step(model, spec.num_classes, bool(jax.tree.leaves(state.batch_stats)))
  checkpointer = (_Checkpointer(os.path.join(workdir, "checkpoints"), config)
                  if config.checkpoint_every else None)
  run = Run(config, workdir, mesh, spec, image_shape, pipeline_kwargs, eval_pipeline, model, state,
            init_state, train_step, eval_step, make_schedule(config), step_root, checkpointer)
  _log_setup(run, variables["params"])
  return run


def _write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  if is_writer():
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json(indent=2))


def _log_setup(run: Run, params) -> None:
  c = run.config
  logging.info("model %s: %s parameters; dataset %s (%s train / %s test examples); "
               "%d workers on %d device(s) in %d process(es), %d examples per worker per step; "
               "compressor %s %s", c.model, f"{models_lib.param_count(params):,}", c.dataset,
               run.spec.num_examples("train"), run.spec.num_examples("test"), c.workers,
               run.mesh.size, jax.process_count(), c.batch_size // c.workers, c.compressor,
               c.compressor_kwargs.to_dict())


# ----------------------------------------------------------------------------
# Restore.


class Start(NamedTuple):
  state: TrainState
  step: int  # the last step done (0: a fresh run)
  history: list[dict[str, float]]  # the train rows of metrics.csv up to ``step``


def restore(run: Run) -> Start:
  """The latest checkpoint's state and the metrics up to it, else the initial state."""
  if run.checkpointer is not None and run.checkpointer.latest_step() is not None:
    state = run.checkpointer.restore(run.state)
    step = int(state.step)
    logging.info("resumed from the checkpoint of step %d", step)
  else:
    state, step = run.init_state(), 0
  history = _resume_metrics(os.path.join(run.workdir, "metrics.csv"), step)
  return Start(state, step, history)


def _resume_metrics(path: str, start_step: int) -> list[dict[str, float]]:
  """The train rows up to ``start_step``; process 0 drops the rows written after it."""
  rows, fieldnames = [], None
  if os.path.exists(path):
    with open(path, newline="") as f:
      reader = csv.DictReader(f)
      fieldnames = reader.fieldnames
      rows = [r for r in reader if int(r["step"]) <= start_step]
  if jax.process_count() > 1:  # every process has read the file before process 0 rewrites it
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices("experiments.train: metrics.csv read")
  if fieldnames is not None and is_writer():
    with open(path, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=fieldnames)
      w.writeheader()
      w.writerows(rows)
  return [{k: float(v) for k, v in r.items() if k != "split" and v not in ("", None)}
          for r in rows if r["split"] == "train"]


# ----------------------------------------------------------------------------
# The loop.


class End(NamedTuple):
  state: TrainState
  step: int  # the last step done
  history: list[dict[str, float]]  # every train row
  last_eval: dict[str, float]  # the last evaluation ({} if none)
  wall_time: float  # seconds since the run (not this invocation) started
  train_time: float  # seconds of it spent in training steps (CSV_DOC["train_time"])


def loop(run: Run, start: Start, stop_after_steps: Optional[int] = None) -> End:
  """Trains from ``start.step`` to the end, or for ``stop_after_steps`` steps.

  Logs train rows, evaluates every ``eval_every`` steps and at the end, and
  saves checkpoints every ``checkpoint_every`` steps and at the end.
  """
  c = run.config
  train_iter = data_lib.make_pipeline(c.dataset, "train", global_batch_size=c.batch_size,
                                      train=True, start_step=start.step, **run.pipeline_kwargs)
  log = _Log(run, start)
  state, step, last_eval = start.state, start.step, {}
  last_step = c.num_train_steps
  if stop_after_steps is not None:
    last_step = min(last_step, start.step + stop_after_steps)
  for step in range(start.step + 1, last_step + 1):
    images, labels = run.shard_batch(next(train_iter))
    key = np.asarray(jax.random.fold_in(run.step_root, step))  # host value: the same in every process
    state, metrics = run.train_step(state, images, labels, key)
    if step == start.step + 1:
      log.exclude(state)  # the first step compiles: not training time
    final = step == c.num_train_steps
    checkpoint_now = run.checkpointer is not None and (step % c.checkpoint_every == 0 or final)
    # A train row closes at every checkpoint too, so a resumed run writes the same rows.
    log.train(step, metrics, close=step % c.log_every == 0 or final or checkpoint_now)
    evaluate_now = (c.eval_every and step % c.eval_every == 0) or final
    if evaluate_now or checkpoint_now:
      log.pause(state)
    if evaluate_now:
      last_eval = log.test(step, evaluate(run.eval_step, run.eval_params(state), state.batch_stats,
                                          run.eval_pipeline))
    if checkpoint_now:
      run.checkpointer.save(step, state)
    if evaluate_now or checkpoint_now:
      log.resume()
  log.pause(state)
  log.close()
  if run.checkpointer is not None:
    run.checkpointer.close()
  return End(state, step, log.history, last_eval, log.elapsed(), log.train_time())


class TrainClock:
  """Seconds spent training: a stopwatch that evaluations and checkpoints pause.

  Args:
    total: seconds already counted (a resumed run's).
    now: the time source.
  """

  def __init__(self, total: float = 0.0, now: Callable[[], float] = time.time):
    self.now, self.counted, self.mark = now, float(total), now()

  def total(self) -> float:
    return self.counted + (self.now() - self.mark if self.mark is not None else 0.0)

  def pause(self) -> None:
    self.counted, self.mark = self.total(), None

  def resume(self) -> None:
    """Counts from now on; time since the last pause or resume is dropped (it was not training)."""
    self.mark = self.now()


class _Log:
  """The rows of ``metrics.csv`` (written by process 0), the progress bar and the history."""

  def __init__(self, run: Run, start: Start):
    self.run = run
    self.history = list(start.history)
    columns = list(CSV_DOC)
    extra = [k for k in jax.eval_shape(jaxcomp.metrics, run.state.opt_state) if k not in columns]
    self.writer = (_CsvWriter(os.path.join(run.workdir, "metrics.csv"), columns + extra)
                   if is_writer() else None)
    c = run.config
    self.bar = _progress(c.num_train_steps, c.progress and is_writer(),
                         f"{c.model}/{c.compressor}/N={c.workers}")
    if self.bar is not None and start.step:
      self.bar.update(start.step)
    self.t_start = time.time() - (self.history[-1]["wall_time"] if self.history else 0.0)
    self.t_interval = time.time()
    # A resumed run continues the count of its last train row.
    self.clock = TrainClock(self.history[-1].get("train_time", 0.0) if self.history else 0.0)
    self.pending: list[dict[str, jax.Array]] = []

  def elapsed(self) -> float:
    return time.time() - self.t_start

  def train_time(self) -> float:
    return self.clock.total()

  def pause(self, state) -> None:
    """Stops the training clock once the steps dispatched so far have run."""
    jax.block_until_ready(state)
    self.clock.pause()

  def resume(self) -> None:
    self.clock.resume()

  def exclude(self, state) -> None:
    """Drops the time until ``state`` is ready from the training clock (a compiling step)."""
    jax.block_until_ready(state)
    self.clock.resume()

  def train(self, step: int, metrics: dict[str, jax.Array], close: bool) -> None:
    """Adds a step's metrics; ``close``: writes the interval's means as a train row."""
    self.pending.append(metrics)
    if close:
      fetched = jax.device_get(self.pending)
      now = time.time()
      row = {k: float(np.mean([f[k] for f in fetched])) for k in fetched[0]}
      lr_step = int((step - 1) * updates_per_step(self.run.config))
      row.update(step=step, split="train", learning_rate=float(self.run.schedule(lr_step)),
                 steps_per_sec=len(fetched) / max(now - self.t_interval, 1e-9),
                 wall_time=now - self.t_start, train_time=self.train_time())
      if not math.isfinite(row["loss"]):
        logging.warning("step %d: the training loss is %s", step, row["loss"])
      self._write(row)
      self.history.append(row)
      self.pending, self.t_interval = [], now
      if self.bar is not None:
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", acc=f"{row['accuracy']:.3f}",
                             wire=f"{row['bytes_on_wire'] / 1e3:.1f}kB")
    if self.bar is not None:
      self.bar.update(1)

  def test(self, step: int, res: dict[str, float]) -> dict[str, float]:
    """Writes an evaluation's row; returns it with its step."""
    self._write({"step": step, "split": "test", "loss": res["loss"], "accuracy": res["accuracy"],
                 "wall_time": self.elapsed(), "train_time": self.train_time()})
    logging.info("step %d: test accuracy %.4f, test loss %.4f", step, res["accuracy"], res["loss"])
    return dict(res, step=step)

  def _write(self, row: dict[str, Any]) -> None:
    if self.writer is not None:
      self.writer.write(row)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
    if self.writer is not None:
      self.writer.close()


# ----------------------------------------------------------------------------
# Write.


def write(run: Run, start: Start, end: End, timing: dict[str, float]) -> dict[str, Any]:
  """The summary of a finished run; process 0 writes it to ``summary.json``."""
  summary = _summary(run, start, end, timing)
  if is_writer():
    with open(os.path.join(run.workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  logging.info("done: %s", json.dumps({k: summary[k] for k in
                                       ("test_accuracy", "bytes_on_wire", "compression_ratio",
                                        "wall_time_sec")}))
  return summary


def _summary(run: Run, start: Start, end: End, timing: dict[str, float]) -> dict[str, Any]:
  c, history, last_eval = run.config, end.history, end.last_eval
  last_train = history[-1] if history else {}

  def mean(key):
    return float(np.mean([h[key] for h in history])) if history else None

  return {
      "experiment": c.experiment,
      "dataset": c.dataset,
      "model": c.model,
      "compressor": c.compressor,
      "compressor_kwargs": c.compressor_kwargs.to_dict(),
      "workers": c.workers,
      "devices": run.mesh.size,
      "processes": jax.process_count(),
      "batch_size": c.batch_size,
      "optimizer": c.optimizer,
      "learning_rate": c.learning_rate,
      "steps": end.step,
      "seed": c.seed,
      "parameters": models_lib.param_count(run.state.params),
      "test_accuracy": last_eval.get("accuracy"),
      "test_top5_accuracy": last_eval.get("top5_accuracy"),
      "test_loss": last_eval.get("loss"),
      "test_examples": last_eval.get("count"),
      "evaluated": "ema" if c.eval_with_ema else "params",
      **{k: last_train.get(k) for k in ("bytes_on_wire", "float32_bytes", "compression_ratio",
                                        "compressed_ratio", "float_bytes", "encoded_bytes")},
      "mean_bytes_on_wire": mean("bytes_on_wire"),
      "mean_encoded_bytes": mean("encoded_bytes"),
      "final_train_loss": last_train.get("loss"),
      "wall_time_sec": end.wall_time,
      "train_time_sec": end.train_time,
      "steps_per_sec": mean("steps_per_sec"),
      **timing,
      "resumed_from_step": start.step or None,
      "jax_version": jax.__version__,
      "backend": jax.default_backend(),
      "git_commit": _git_commit(),
  }


# ----------------------------------------------------------------------------
# The whole run.


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: Optional[int] = None) -> dict[str, Any]:
  """Trains ``config.model`` on ``config.dataset`` and evaluates it; returns the summary.

  The run is a sequence of named steps: :func:`initialize_distributed`,
  :func:`validate_config`, :func:`build`, :func:`restore`, :func:`loop`
  (which calls :func:`evaluate`), optionally :func:`profile_step`, and
  :func:`write`.

  With ``config.checkpoint_every > 0`` the run saves checkpoints in
  ``workdir/checkpoints`` (orbax) and resumes from the latest one when
  started again with the same workdir: parameters, optimizer state with every
  error-feedback residual and PRNG key, EMA, and the step, from which the data
  stream and all randomness continue exactly (a resumed run ends bit-identical
  to an uninterrupted one; ``tests/test_resume.py``).

  Args:
    config: the experiment config (see ``configs/common.py``).
    workdir: output directory (shared by all processes of a multi-process run).
    stop_after_steps: stop after this many steps of this invocation, as if the
      process had been killed (for preemption tests); no final evaluation.
  """
  config = ml_collections.ConfigDict(config)  # a private, unlocked copy
  initialize_distributed(config)
  validate_config(config)
  run = build(config, workdir)
  start = restore(run)
  end = loop(run, start, stop_after_steps)
  if end.step < config.num_train_steps:  # stopped early (preemption test)
    return {"steps": end.step, "stopped_early": True}
  timing = profile_step(run, end.state) if config.profile_steps else {}
  return write(run, start, end, timing)


def profile_step(run: Run, state: TrainState) -> dict[str, float]:
  """Median time of a whole step and of its gradient computation alone.

  ``exchange_time_sec`` = step − compute: compression, the collectives,
  decompression and the optimizer update. With simulated workers there is no
  network, so this is the compute cost of the exchange on this machine.
  Measured after training on ``config.profile_steps`` extra steps whose
  results are discarded (``state`` is donated to them).
  """
  config = run.config
  loss_fn = make_loss_fn(config, run.model, run.spec.num_classes, run.has_bn)
  grads_fn = jax.jit(jax.vmap(
      lambda p, bs, x, y, k: loss_and_grad(config, loss_fn, p, bs, x, y, k)[0],
      in_axes=(None, None, 0, 0, None)))
  train_iter = data_lib.make_pipeline(config.dataset, "train", global_batch_size=config.batch_size,
                                      train=True, start_step=config.num_train_steps,
                                      **run.pipeline_kwargs)
  batches = [run.shard_batch(next(train_iter)) for _ in range(3)]
  t_step, t_grad = [], []
  s = state
  for i in range(config.profile_steps + 2):  # two warm-up rounds
    images, labels = batches[i % 3]
    key = np.asarray(jax.random.fold_in(run.step_root, 2**30 + i))
    t0 = time.perf_counter()
    s, m = run.train_step(s, images, labels, key)
    jax.block_until_ready(m)
    t1 = time.perf_counter()
    jax.block_until_ready(grads_fn(s.params, s.batch_stats, images, labels, key))
    t2 = time.perf_counter()
    if i >= 2:
      t_step.append(t1 - t0)
      t_grad.append(t2 - t1)
  step_t, grad_t = float(np.median(t_step)), float(np.median(t_grad))
  return {"step_time_sec": step_t, "compute_time_sec": grad_t,
          "exchange_time_sec": max(step_t - grad_t, 0.0)}


# ----------------------------------------------------------------------------
# Files.


class _CsvWriter:

  def __init__(self, path: str, columns: list[str]):
    self.columns = columns
    new = not os.path.exists(path)
    self._f = open(path, "a", newline="")
    self._w = csv.DictWriter(self._f, fieldnames=columns, extrasaction="ignore")
    if new:
      self._w.writeheader()

  def write(self, row: dict[str, Any]) -> None:
    self._w.writerow({k: _fmt(v) for k, v in row.items()})
    self._f.flush()

  def close(self):
    self._f.close()


def _fmt(v):
  if isinstance(v, float):
    return f"{v:.6g}" if not v.is_integer() or abs(v) >= 1e15 else str(int(v))
  return v


def _progress(total: int, enabled: bool, desc: str):
  if not enabled:
    return None
  try:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover
    return None
  return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, file=sys.stderr, leave=True)


def _git_commit() -> Optional[str]:
  """The commit of the code that ran (with ``+dirty`` for local changes), if in a checkout."""
  import subprocess  # pylint: disable=g-import-not-at-top

  here = os.path.dirname(os.path.abspath(__file__))
  try:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                         timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "jaxcomp",
                            "experiments", "configs"], cwd=here, capture_output=True, text=True,
                           timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return (rev + ("+dirty" if dirty else "")) or None


class _Checkpointer:
  """orbax checkpoints of the whole TrainState, keyed by step.

  In a multi-process run every process calls every method: orbax writes each
  array's shards from the processes that hold them (process 0 writes the
  replicated ones and the metadata) into the one shared directory.
  """

  def __init__(self, directory: str, config: ml_collections.ConfigDict):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._ocp = ocp
    self._mngr = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=config.checkpoint_keep, create=True))

  def latest_step(self) -> Optional[int]:
    return self._mngr.latest_step()

  def save(self, step: int, state: TrainState) -> None:
    self._mngr.save(step, args=self._ocp.args.StandardSave(state))

  def restore(self, abstract: TrainState) -> TrainState:
    """The latest checkpoint, laid out as ``abstract`` (``jax.ShapeDtypeStruct`` with shardings)."""
    return self._mngr.restore(self._mngr.latest_step(), args=self._ocp.args.StandardRestore(abstract))

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()


FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and the summary.")
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
