r"""Data-parallel training with compressed gradient exchange.

Usage::

  python -m experiments.train --config configs/terngrad_lenet.py --workdir /tmp/run
  python -m experiments.train --config configs/terngrad_lenet.py:runlocal --workdir /tmp/run \
      --config.workers=8 --config.num_train_steps=200 --config.compressor=none

``train_and_evaluate(config, workdir)`` is importable (the Flax examples' layout).

How a step runs. ``config.workers`` workers are laid over the available
devices: ``D`` devices (the largest divisor of N not above the device count)
each hold ``N / D`` workers, simulated with ``vmap`` inside a ``shard_map``
over the device mesh. Every worker computes gradients on its own
``batch_size / N`` examples; the compression transform (first link of the
optax chain) quantizes them, moves the packed codes with ``lax.all_gather``
over the axes ``("devices", "workers")`` and returns the average, so the
parameters and the optimizer state stay identical on every worker ("parameter
localization", TernGrad §3.1) and are stored once; only the compressors'
worker-local state (error-feedback residuals) has a worker axis.

Outputs in ``workdir``:

* ``metrics.csv``: one row per logged training interval (``split=train``:
  means over the interval) and per evaluation (``split=test``); the columns
  are documented in :data:`CSV_DOC`.
* ``summary.json``: config, final test accuracy, bytes on the wire, timing.
* ``config.json``: the resolved config.
"""

from __future__ import annotations

import csv
import inspect
import json
import math
import os
import re
import sys
import time
from typing import Any, NamedTuple, Optional

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

import jaxcomp
from jaxcomp import data as data_lib
from jaxcomp import models as models_lib
from jaxcomp import parallel

AXES = ("devices", "workers")

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
}


class TrainState(NamedTuple):
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any
  ema_params: Any


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

  if not isinstance(config.workers, int) or config.workers < 1:
    bad(f"workers must be a positive integer, got {config.workers!r}.")
  if config.batch_size < 1 or config.batch_size % config.workers:
    bad(f"batch_size={config.batch_size} (the total over workers) must be a positive multiple "
        f"of workers={config.workers}.")
  if config.batch_size % jax.process_count():
    bad(f"batch_size={config.batch_size} must divide over {jax.process_count()} processes.")
  if config.dataset not in data_lib.DATASETS:
    bad(f"unknown dataset {config.dataset!r}; known: {', '.join(sorted(data_lib.DATASETS))}.")
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


def worker_gradients(config, loss_fn, params, batch_stats, images, labels, key):
  """One worker's gradients, with weight decay when ``weight_decay_mode == "loss"``.

  The L2 term ``0.5 * wd * ||w||^2`` of the papers' Caffe/TensorFlow losses
  contributes ``wd * w`` to every worker's gradient (so it is part of what gets
  compressed); it is added after differentiating the data loss, which is the
  same gradient and lets XLA keep the data part fused.
  """
  grads, (loss, (logits, new_vars)) = jax.grad(lambda p: (lambda l, a: (l, (l, a)))(
      *loss_fn(p, batch_stats, images, labels, key)), has_aux=True)(params)
  if config.weight_decay and config.weight_decay_mode == "loss":
    grads = jax.tree.map(lambda g, w, on: g + config.weight_decay * w if on else g,
                         grads, params, decay_mask(config, params))
  return grads, loss, logits, new_vars


def make_train_step(config, model, tx, mesh, opt_state_template, num_classes, bn_template):
  """Returns a jitted ``step(state, images[N,b,...], labels[N,b], key) -> (state, metrics)``.

  ``bn_template`` is the model's ``batch_stats`` (empty for models without
  batch norm).
  """
  has_bn = bool(jax.tree.leaves(bn_template))
  loss_fn = make_loss_fn(config, model, num_classes, has_bn)
  axes = parallel.worker_axes(opt_state_template)
  specs = parallel.worker_specs(opt_state_template, "devices")

  def worker(params, batch_stats, opt_state, images, labels, key):
    key = jax.random.fold_in(key, parallel.axis_index(AXES))
    grads, loss, logits, new_vars = worker_gradients(config, loss_fn, params, batch_stats, images,
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

  @jax.jit
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
  totals = {"loss": 0.0, "correct": 0.0, "correct_top5": 0.0, "count": 0.0}
  for batch in pipeline.reset():
    out = jax.device_get(eval_step(params, batch_stats, batch["image"], batch["label"], batch["mask"]))
    for k in totals:
      totals[k] += float(out[k])
  n = max(totals["count"], 1.0)
  return {"loss": totals["loss"] / n, "accuracy": totals["correct"] / n,
          "top5_accuracy": totals["correct_top5"] / n, "count": totals["count"]}


# ----------------------------------------------------------------------------
# The loop.


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
    from tqdm import tqdm
  except ImportError:  # pragma: no cover
    return None
  return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, file=sys.stderr, leave=True)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: Optional[int] = None) -> dict[str, Any]:
  """Trains ``config.model`` on ``config.dataset`` and evaluates it; returns the summary.

  With ``config.checkpoint_every > 0`` the run saves checkpoints in
  ``workdir/checkpoints`` (orbax) and resumes from the latest one when
  started again with the same workdir: parameters, optimizer state with every
  error-feedback residual and PRNG key, EMA, and the step, from which the data
  stream and all randomness continue exactly (a resumed run ends bit-identical
  to an uninterrupted one; ``tests/test_resume.py``).

  Args:
    config: the experiment config (see ``configs/common.py``).
    workdir: output directory.
    stop_after_steps: stop after this many steps of this invocation, as if the
      process had been killed (for preemption tests); no final evaluation.
  """
  config = ml_collections.ConfigDict(config)  # a private, unlocked copy
  validate_config(config)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json(indent=2))

  n_workers = config.workers
  available = jax.local_device_count()
  if config.max_devices:
    available = min(available, config.max_devices)
  n_dev = num_devices_for(n_workers, available)
  mesh = jax.make_mesh((n_dev,), ("devices",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.local_devices()[:n_dev])
  spec = data_lib.get_spec(config.dataset)
  num_classes = spec.num_classes
  pipe_kw = dict(seed=config.seed, augment=config.augment, data_dir=config.data_dir,
                 image_size=config.image_size, channels=config.channels,
                 process_index=jax.process_index(), process_count=jax.process_count())
  image_shape = tuple(data_lib.output_image_shape(config.dataset, config.augment, config.image_size,
                                                  config.channels))
  # The eval pipeline first: absent data (ImageNet here) fails at once, before the model is built.
  eval_bs = min(config.eval_batch_size, spec.num_examples("test"))
  eval_iter = data_lib.make_pipeline(config.dataset, "test", global_batch_size=eval_bs,
                                     train=False, **pipe_kw)

  model = models_lib.get_model(config.model, num_classes, **config.model_kwargs.to_dict())
  init_key, step_root = jax.random.split(jax.random.PRNGKey(config.seed))
  variables = model.init({"params": init_key, "dropout": init_key},
                         jnp.zeros((1,) + image_shape, jnp.float32), train=False)
  params = variables["params"]
  batch_stats = variables.get("batch_stats", {})
  has_bn = bool(jax.tree.leaves(batch_stats))

  tx = make_tx(config, AXES)
  opt_state = parallel.replicate_workers(tx.init(params), n_workers)
  ema = params if config.ema_decay > 0 else {}
  repl = NamedSharding(mesh, P())
  state_shardings = TrainState(
      repl, jax.tree.map(lambda _: repl, params), jax.tree.map(lambda _: repl, batch_stats),
      jax.tree.map(lambda s: NamedSharding(mesh, s), parallel.worker_specs(opt_state, "devices")),
      jax.tree.map(lambda _: repl, ema))
  state = jax.device_put(TrainState(jnp.zeros((), jnp.int32), params, batch_stats, opt_state, ema),
                         state_shardings)

  ckpt = _Checkpointer(os.path.join(workdir, "checkpoints"), config) if config.checkpoint_every else None
  start_step = 0
  if ckpt is not None and ckpt.latest_step() is not None:
    state = ckpt.restore(state)
    start_step = int(state.step)
    logging.info("resumed from the checkpoint of step %d", start_step)
  history = _resume_metrics(os.path.join(workdir, "metrics.csv"), start_step)

  train_iter = data_lib.make_pipeline(config.dataset, "train", global_batch_size=config.batch_size,
                                      train=True, start_step=start_step, **pipe_kw)
  data_sharding = NamedSharding(mesh, P("devices"))

  train_step = make_train_step(config, model, tx, mesh, opt_state, num_classes, batch_stats)
  eval_step = make_eval_step(model, num_classes, has_bn)
  schedule = make_schedule(config)

  n_params = models_lib.param_count(params)
  logging.info("model %s: %s parameters; dataset %s (%s train / %s test examples); "
               "%d workers on %d device(s), %d examples per worker per step; compressor %s %s",
               config.model, f"{n_params:,}", config.dataset, spec.num_examples("train"),
               spec.num_examples("test"), n_workers, n_dev, config.batch_size // n_workers,
               config.compressor, config.compressor_kwargs.to_dict())

  columns = list(CSV_DOC)
  extra = [k for k in jaxcomp.metrics(opt_state) if k not in columns]
  writer = _CsvWriter(os.path.join(workdir, "metrics.csv"), columns + extra)
  bar = _progress(config.num_train_steps, config.progress,
                  f"{config.model}/{config.compressor}/N={n_workers}")
  if bar is not None and start_step:
    bar.update(start_step)

  def shard_batch(batch):
    b = config.batch_size // n_workers
    img = batch["image"].reshape((n_workers // jax.process_count(), b) + image_shape)
    lab = batch["label"].reshape((n_workers // jax.process_count(), b))
    return (jax.make_array_from_process_local_data(data_sharding, img),
            jax.make_array_from_process_local_data(data_sharding, lab))

  def eval_params(s: TrainState):
    return s.ema_params if config.eval_with_ema else s.params

  time_offset = history[-1]["wall_time"] if history else 0.0
  t_start = time.time() - time_offset
  t_interval = time.time()
  pending: list[dict[str, jax.Array]] = []
  last_eval: dict[str, float] = {}
  step = start_step
  last_step = config.num_train_steps
  if stop_after_steps is not None:
    last_step = min(last_step, start_step + stop_after_steps)
  for step in range(start_step + 1, last_step + 1):
    images, labels = shard_batch(next(train_iter))
    state, m = train_step(state, images, labels, jax.random.fold_in(step_root, step))
    pending.append(m)
    final = step == config.num_train_steps
    checkpoint_now = ckpt is not None and (step % config.checkpoint_every == 0 or final)
    # A train row closes at every checkpoint too, so a resumed run writes the same rows.
    if step % config.log_every == 0 or final or checkpoint_now:
      fetched = jax.device_get(pending)
      now = time.time()
      row = {k: float(np.mean([f[k] for f in fetched])) for k in fetched[0]}
      row.update(step=step, split="train",
                 learning_rate=float(schedule(int((step - 1) * updates_per_step(config)))),
                 steps_per_sec=len(fetched) / max(now - t_interval, 1e-9), wall_time=now - t_start)
      if not math.isfinite(row["loss"]):
        logging.warning("step %d: the training loss is %s", step, row["loss"])
      writer.write(row)
      history.append(row)
      pending, t_interval = [], now
      if bar is not None:
        bar.set_postfix(loss=f"{row['loss']:.4f}", acc=f"{row['accuracy']:.3f}",
                        wire=f"{row['bytes_on_wire'] / 1e3:.1f}kB")
    if bar is not None:
      bar.update(1)
    if (config.eval_every and step % config.eval_every == 0) or final:
      res = evaluate(eval_step, eval_params(state), state.batch_stats, eval_iter)
      last_eval = dict(res, step=step)
      writer.write({"step": step, "split": "test", "loss": res["loss"], "accuracy": res["accuracy"],
                    "wall_time": time.time() - t_start})
      logging.info("step %d: test accuracy %.4f, test loss %.4f", step, res["accuracy"], res["loss"])
    if checkpoint_now:
      ckpt.save(step, state)
  if bar is not None:
    bar.close()
  writer.close()
  if ckpt is not None:
    ckpt.close()
  if step < config.num_train_steps:  # stopped early (preemption test)
    return {"steps": step, "stopped_early": True}

  timing = (profile_step(config, train_step, make_loss_fn(config, model, num_classes, has_bn),
                         state, shard_batch, train_iter, step_root)
            if config.profile_steps else {})
  total_time = time.time() - t_start
  last_train = history[-1] if history else {}
  summary = {
      "experiment": config.experiment,
      "dataset": config.dataset,
      "model": config.model,
      "compressor": config.compressor,
      "compressor_kwargs": config.compressor_kwargs.to_dict(),
      "workers": n_workers,
      "devices": n_dev,
      "batch_size": config.batch_size,
      "optimizer": config.optimizer,
      "learning_rate": config.learning_rate,
      "steps": step,
      "seed": config.seed,
      "parameters": n_params,
      "test_accuracy": last_eval.get("accuracy"),
      "test_top5_accuracy": last_eval.get("top5_accuracy"),
      "test_loss": last_eval.get("loss"),
      "test_examples": last_eval.get("count"),
      "evaluated": "ema" if config.eval_with_ema else "params",
      "bytes_on_wire": last_train.get("bytes_on_wire"),
      "float32_bytes": last_train.get("float32_bytes"),
      "compression_ratio": last_train.get("compression_ratio"),
      "compressed_ratio": last_train.get("compressed_ratio"),
      "float_bytes": last_train.get("float_bytes"),
      "encoded_bytes": last_train.get("encoded_bytes"),
      "mean_bytes_on_wire": float(np.mean([h["bytes_on_wire"] for h in history])) if history else None,
      "mean_encoded_bytes": float(np.mean([h["encoded_bytes"] for h in history])) if history else None,
      "final_train_loss": last_train.get("loss"),
      "wall_time_sec": total_time,
      "steps_per_sec": float(np.mean([h["steps_per_sec"] for h in history])) if history else None,
      **timing,
      "resumed_from_step": start_step or None,
      "jax_version": jax.__version__,
      "backend": jax.default_backend(),
      "git_commit": _git_commit(),
  }
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  logging.info("done: %s", json.dumps({k: summary[k] for k in
                                       ("test_accuracy", "bytes_on_wire", "compression_ratio",
                                        "wall_time_sec")}))
  return summary


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
  """orbax checkpoints of the whole TrainState, keyed by step."""

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

  def restore(self, like: TrainState) -> TrainState:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
    return self._mngr.restore(self._mngr.latest_step(), args=self._ocp.args.StandardRestore(abstract))

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()


def _resume_metrics(path: str, start_step: int) -> list[dict[str, float]]:
  """Drops rows written after the checkpoint we resume from; returns the train rows kept."""
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    fieldnames = reader.fieldnames
    rows = [r for r in reader if int(r["step"]) <= start_step]
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fieldnames)
    w.writeheader()
    w.writerows(rows)
  return [{k: float(v) for k, v in r.items() if k != "split" and v not in ("", None)}
          for r in rows if r["split"] == "train"]


def profile_step(config, train_step, loss_fn, state, shard_batch, train_iter,
                 step_root) -> dict[str, float]:
  """Median time of a whole step and of its gradient computation alone.

  ``exchange_time_sec`` = step − compute: compression, the collectives,
  decompression and the optimizer update. With simulated workers there is no
  network, so this is the compute cost of the exchange on this machine.
  Measured after training on ``config.profile_steps`` extra steps whose
  results are discarded.
  """
  grads_fn = jax.jit(jax.vmap(
      lambda p, bs, x, y, k: worker_gradients(config, loss_fn, p, bs, x, y, k)[0],
      in_axes=(None, None, 0, 0, None)))
  batches = [shard_batch(next(train_iter)) for _ in range(3)]
  t_step, t_grad = [], []
  s = state
  for i in range(config.profile_steps + 2):  # two warm-up rounds
    images, labels = batches[i % 3]
    key = jax.random.fold_in(step_root, 2**30 + i)
    t0 = time.perf_counter()
    s, m = train_step(s, images, labels, key)
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
