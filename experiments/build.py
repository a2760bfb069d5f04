"""Setting a run up: :func:`build` makes what it needs, :func:`restore` where it starts from."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, NamedTuple, Optional

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import optax

from experiments import lm
from experiments import optimizers
from experiments import state as state_lib
from experiments import step as step_lib
from experiments import validation
from experiments import writers
from experiments.state import TrainState
from jaxcomp import data as data_lib
from jaxcomp import models as models_lib
from jaxcomp import zero


@dataclasses.dataclass
class Run:
  """What :func:`build` makes: everything a run needs besides its state."""

  config: ml_collections.ConfigDict
  workdir: str
  mesh: jax.sharding.Mesh
  spec: Any  # the dataset's DatasetSpec
  image_shape: tuple[int, ...]
  pipeline_kwargs: dict[str, Any]
  eval_pipeline: Any  # data_lib.Pipeline, or a data_lib.TextPipeline for a text dataset
  model: Any
  state: TrainState  # abstract: shapes, dtypes, shardings (jax.ShapeDtypeStruct)
  init_state: Callable[[], TrainState]  # the state at step 0
  train_step: Any
  eval_step: Any
  schedule: optax.Schedule
  step_root: jax.Array  # the per-step keys are fold_in(step_root, step)
  checkpointer: Optional[state_lib.Checkpointer]
  whole_params: Callable[[Any], Any]  # the state's parameters -> the whole model's (:func:`whole_params_fn`)

  @property
  def has_bn(self) -> bool:
    """Whether the model has batch-norm statistics."""
    return bool(jax.tree.leaves(self.state.batch_stats))

  @property
  def is_text(self) -> bool:
    """Whether this is a language-model run on a text corpus (:mod:`experiments.lm`)."""
    return self.spec.modality == "text"

  def train_pipeline(self, start_step: int):
    """The training batches from step ``start_step + 1`` on."""
    c = self.config
    if self.is_text:
      return lm.pipeline(c, "train", start_step=start_step)
    return data_lib.make_pipeline(c.dataset, "train", global_batch_size=c.batch_size, train=True,
                                  start_step=start_step, **self.pipeline_kwargs)

  def shard_batch(self, batch):
    """This process's slice of a global batch -> global ``[workers, b, ...]`` arrays.

    Images and labels, or a language model's input bytes and their next bytes.
    """
    c, local_workers = self.config, self.config.workers // jax.process_count()
    b = c.batch_size // c.workers
    sharding = NamedSharding(self.mesh, P(self.mesh.axis_names))
    x, y = (batch["inputs"], batch["targets"]) if self.is_text else (batch["image"], batch["label"])
    return tuple(jax.make_array_from_process_local_data(sharding, a.reshape((local_workers, b) + a.shape[1:]))
                 for a in (x, y))

  def evaluate(self, state: TrainState) -> dict[str, float]:
    """The evaluation of :func:`experiments.step.evaluate` (images) or :func:`experiments.lm.evaluate`."""
    if self.is_text:
      return lm.evaluate(self.eval_step, self.eval_params(state), self.eval_pipeline)
    return step_lib.evaluate(self.eval_step, self.eval_params(state), state.batch_stats,
                             self.eval_pipeline)

  def eval_params(self, state: TrainState):
    """The parameters evaluated, whole: the EMA with ``config.eval_with_ema``, else the parameters."""
    return self.whole_params(state.ema_params if self.config.eval_with_ema else state.params)


def model_input(config: ml_collections.ConfigDict, spec) -> tuple[tuple[int, ...], Any]:
  """The shape of one example as the model takes it, and its dtype: a window of ``seq_len`` byte
  tokens (int32) for a text corpus, else the image after augmentation (float32)."""
  if spec.modality == "text":
    return (config.seq_len,), jnp.int32
  return tuple(data_lib.output_image_shape(config.dataset, config.augment, config.image_size,
                                           config.channels)), jnp.float32


def build(config: ml_collections.ConfigDict, workdir: str) -> Run:
  """Sets the run up in named steps; nothing is trained yet."""
  mesh = state_lib.make_mesh(config.workers, config.max_devices, config.get("hosts", 0))
  spec = data_lib.get_spec(config.dataset)
  pipeline_kwargs = dict(seed=config.seed, augment=config.augment, data_dir=config.data_dir,
                         image_size=config.image_size, channels=config.channels,
                         process_index=jax.process_index(), process_count=jax.process_count())
  # The eval pipeline first: absent data (ImageNet here) fails at once, before the model is built
  # and before the workdir is made (a run that never started leaves no config.json).
  image_shape, input_dtype = model_input(config, spec)
  if spec.modality == "text":
    eval_pipeline = lm.pipeline(config, "test", global_batch_size=validation.eval_batch_size(config))
  else:
    eval_pipeline = data_lib.make_pipeline(config.dataset, "test", train=False,
                                           global_batch_size=validation.eval_batch_size(config),
                                           **pipeline_kwargs)
  writers.write_config(config, workdir)
  model = models_lib.get_model(config.model, spec.num_classes, **config.model_kwargs.to_dict())
  init_key, step_root = jax.random.split(jax.random.PRNGKey(config.seed))
  init_variables = functools.partial(model.init, {"params": init_key, "dropout": init_key},
                                     jnp.zeros((1,) + image_shape, input_dtype), train=False)
  variables = jax.eval_shape(init_variables)  # the state's layout: nothing is computed
  tx = optimizers.make_tx(config, step_lib.worker_axes(mesh))
  state = state_lib.abstract_state(config, mesh, tx, variables)

  def init_state() -> TrainState:
    """The state at step 0; the model's initial values are computed only here, for a run that
    starts afresh (a resumed run reads its checkpoint instead)."""
    return state_lib.initial_state(config, tx, init_variables(), state)

  train_step = step_lib.make_train_step(config, model, tx, mesh, spec.num_classes, state.batch_stats)
  eval_step = (lm.make_eval_step(model) if spec.modality == "text" else
               step_lib.make_eval_step(model, spec.num_classes, bool(jax.tree.leaves(state.batch_stats))))
  checkpointer = (state_lib.Checkpointer(os.path.join(workdir, "checkpoints"), config)
                  if config.checkpoint_every else None)
  run = Run(config, workdir, mesh, spec, image_shape, pipeline_kwargs, eval_pipeline, model, state,
            init_state, train_step, eval_step, optimizers.make_schedule(config), step_root,
            checkpointer, whole_params_fn(tx, mesh))
  _log_setup(run, variables["params"])
  return run


def whole_params_fn(tx, mesh: jax.sharding.Mesh) -> Callable[[Any], Any]:
  """The whole model's parameters from the state's: the identity, or, with ``config.shard_params``,
  every worker's chunks put together (``tx.unshard``: no exchange), replicated on ``mesh``."""
  if not zero.shards_params(tx):
    return lambda params: params
  return jax.jit(tx.unshard, out_shardings=NamedSharding(mesh, P()))


def _log_setup(run: Run, params) -> None:
  c = run.config
  logging.info("model %s: %s parameters; dataset %s (%s train / %s test examples); "
               "%d workers on %d device(s) in %d process(es), %d examples per worker per step; "
               "compressor %s %s", c.model, f"{models_lib.param_count(params):,}", c.dataset,
               run.spec.num_examples("train"), run.spec.num_examples("test"), c.workers,
               run.mesh.size, jax.process_count(), c.batch_size // c.workers, c.compressor,
               c.compressor_kwargs.to_dict())


class Start(NamedTuple):
  """Where a run starts: a checkpoint's state and metrics, or step 0."""

  state: TrainState
  step: int  # the last step done (0: a fresh run)
  history: list[dict[str, float]]  # the train rows of metrics.csv up to ``step``
  interval: tuple[dict[str, Any], ...] = ()  # each step's metrics since the last train row


def restore(run: Run) -> Start:
  """The newest checkpoint's state and the metrics up to it, else the initial state.

  Every process restores the same step, the newest that all have completely
  and read; a checkpoint that fails is moved aside and the next older one is
  tried (:meth:`experiments.state.Checkpointer.restore`); ``metrics.csv`` is
  cut back to the step restored.
  """
  state = None
  if run.checkpointer is not None:
    afresh = run.config.get("start_afresh_if_unreadable", False)
    state = run.checkpointer.restore(run.state, afresh)
  if state is not None:
    step = int(state.step)  # the checkpointer said which, and why
  else:
    state, step = run.init_state(), 0
  history = writers.resume_metrics(os.path.join(run.workdir, "metrics.csv"), step)
  return Start(state, step, history, writers.resume_interval(run.workdir, step))
