"""Configuration checks: a config that cannot run fails with a clear error before any compile."""

from __future__ import annotations

import re
from typing import Sequence

import jax
import ml_collections

import jaxcomp
from experiments import cli
from experiments import optimizers
from jaxcomp import data as data_lib
from jaxcomp import models as models_lib


def registries() -> dict[str, Sequence[str]]:
  """The config fields whose value names a registry entry, with the names each accepts."""
  return {"dataset": sorted(data_lib.DATASETS), "model": list(models_lib.MODELS),
          "compressor": jaxcomp.names(), "optimizer": list(optimizers.OPTIMIZERS),
          "lr_schedule": list(optimizers.SCHEDULES)}


def unknown_name(field: str, value: str) -> str:
  """What is wrong with ``value`` for a field of :func:`registries`, or ``""`` if it is known."""
  known = registries()[field]
  if value in known:
    return ""
  return f"unknown {field} {value!r}{cli.closest(value, known)}; known: {', '.join(known)}."


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
  for field in registries():
    problem = unknown_name(field, config[field])
    if problem:
      bad(problem)
  if eval_batch_size(config) % n_proc:
    bad(f"the eval batch ({eval_batch_size(config)}: eval_batch_size, at most the test split) "
        f"must divide over {n_proc} processes.")
  _validate_task(config, bad)
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
  if config.param_gather not in ("", *jaxcomp.REGISTRY):
    bad(f"unknown param_gather {config.param_gather!r}{cli.closest(config.param_gather, list(jaxcomp.REGISTRY))}; "
        f"known: '' (float32), {', '.join(jaxcomp.REGISTRY)}.")
  if (config.param_gather or config.param_gather_kwargs) and not config.shard_params:
    bad("param_gather is the sharded parameters' all-gather: it needs shard_params=True.")
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
  if config.trace_step and not 2 <= config.trace_step <= config.num_train_steps:
    bad(f"trace_step must be 0 (no trace) or a step in [2, num_train_steps={config.num_train_steps}] "
        f"(a trace starts after the step before it), got {config.trace_step}.")


def _validate_task(config: ml_collections.ConfigDict, bad) -> None:
  """A language model goes with a text corpus and a ``seq_len`` it can take; an image model with images."""
  text = data_lib.get_spec(config.dataset).modality == "text"
  language_model = config.model in models_lib.LANGUAGE_MODELS
  if text != language_model:
    bad(f"dataset {config.dataset!r} is {'text' if text else 'images'} but model {config.model!r} "
        f"{'is' if language_model else 'is not'} a language model ({', '.join(models_lib.LANGUAGE_MODELS)}).")
  if not text:
    return
  context = config.model_kwargs.get("context", models_lib.input_shape(config.model)[0])
  if not isinstance(config.seq_len, int) or not 1 <= config.seq_len <= context:
    bad(f"seq_len must be an int in [1, {context}] (the model's context) for text, got {config.seq_len!r}.")
  if config.eval_windows < 0:
    bad(f"eval_windows must be >= 0 (0: every window of the held-out split), got {config.eval_windows}.")


def eval_batch_size(config: ml_collections.ConfigDict) -> int:
  """The global eval batch: ``config.eval_batch_size``, at most the test split."""
  spec = data_lib.get_spec(config.dataset)
  if spec.modality == "text":
    return config.eval_batch_size
  return min(config.eval_batch_size, spec.num_examples("test"))
