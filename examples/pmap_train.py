r"""A program in the Flax examples' shape, compressed: TrainState, jax.pmap, BatchNorm, orbax.

A small CNN with BatchNorm on MNIST-5k (offline; ``--config.dataset`` takes any
of ``jaxcomp.data.DATASETS``), one worker per local device, the compressor
named by a config field (``"none"``: the float mean). docs/pmap.md shows its
diff from the float program and the accuracies it reaches::

  python -m examples.pmap_train --workdir /tmp/pmap --config.compressor=threelc

Run it again with the same ``--workdir`` and it resumes from the last
checkpoint, every worker's residuals included. On CPU,
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` gives 8 devices.
"""

import os
from typing import Any

from absl import app
from absl import flags
from flax import linen as nn
from flax.training import train_state
import jax
from jax import lax
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np
import optax
import orbax.checkpoint as ocp

import jaxcomp
from jaxcomp import data


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.compressor = "none"  # a name of jaxcomp.names(): "terngrad", "threelc", ...
  config.dataset = "mnist5k"
  config.features = (16, 32)  # the CNN's convolutions
  config.learning_rate = 0.05
  config.momentum = 0.9
  config.batch_size = 128  # global: split over the devices
  config.num_steps = 300
  config.eval_every = 100
  config.checkpoint_every = 100
  config.seed = 0
  config.route = "pmap"  # or "data_parallel": the same train_step through jaxcomp.data_parallel
  return config


class CNN(nn.Module):
  """Two convolutions with BatchNorm, then a linear classifier."""

  features: tuple[int, ...] = (16, 32)

  @nn.compact
  def __call__(self, x, train: bool):
    for f in self.features:
      x = nn.Conv(f, (3, 3))(x)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
      x = nn.avg_pool(nn.relu(x), (2, 2), (2, 2))
    return nn.Dense(10)(x.reshape(x.shape[0], -1))


class TrainState(train_state.TrainState):
  batch_stats: Any


def create_train_state(config, model, image_shape) -> TrainState:
  variables = model.init(jax.random.PRNGKey(config.seed), jnp.zeros((1, *image_shape)), train=False)
  tx = optax.chain(jaxcomp.get_transform(config.compressor, axis_name="batch"), optax.sgd(config.learning_rate, config.momentum))
  state = TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                            batch_stats=variables["batch_stats"])
  return jaxcomp.parallel.replicate_workers(state, jax.local_device_count())


def cross_entropy(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def train_step(state, batch):
  def loss_fn(params):
    logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                     batch["image"], train=True, mutable=["batch_stats"])
    return cross_entropy(logits, batch["label"]), (logits, updates["batch_stats"])

  (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(jaxcomp.parallel.vary(state.params, "batch"))
  state = state.apply_gradients(grads=grads, batch_stats=lax.pmean(batch_stats, "batch"))
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
  return state, lax.pmean({"loss": loss, "accuracy": accuracy}, "batch")


def eval_step(state, batch):
  logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                          batch["image"], train=False)
  correct = (jnp.argmax(logits, -1) == batch["label"]) * batch["mask"]
  return lax.psum({"correct": correct.sum(), "count": batch["mask"].sum()}, "batch")


def shard(batch):
  """``[devices * b, ...]`` to ``[devices, b, ...]``: a row per device."""
  return jax.tree.map(lambda x: np.asarray(x).reshape(jax.local_device_count(), -1, *np.shape(x)[1:]), batch)


def save(mngr, step, state):
  ckpt = jax.tree.map(ocp.utils.fully_replicated_host_local_array_to_global_array, jaxcomp.parallel.to_checkpoint(state))
  jax.block_until_ready(ckpt)  # one cross-device program in flight at a time (below)
  mngr.save(step, args=ocp.args.StandardSave(ckpt))


def restore(mngr, state):
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, jaxcomp.parallel.to_checkpoint(state))
  restored = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(target))
  return jaxcomp.parallel.from_checkpoint(restored, jax.local_device_count())


def pmap_steps(state):
  """The Flax examples' steps: ``jax.pmap`` over the local devices, the state mapped as laid out."""
  axes = jaxcomp.parallel.worker_axes(state)
  p_train_step = jax.pmap(train_step, axis_name="batch", in_axes=(axes, 0), out_axes=(axes, 0))
  p_eval_step = jax.pmap(eval_step, axis_name="batch", in_axes=(axes, 0), out_axes=None)
  return p_train_step, p_eval_step


def data_parallel_steps(state):
  """The same ``train_step`` and ``eval_step`` through ``jaxcomp.data_parallel`` (a jitted ``shard_map``)."""
  mesh = jax.make_mesh((jax.local_device_count(),), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))

  def worker_step(rest, opt_state, batch):  # data_parallel's (params, opt_state, batch): the rest as params
    new, metrics = train_step(rest.replace(opt_state=opt_state), batch)
    return new.replace(opt_state=None), new.opt_state, metrics

  step = jaxcomp.data_parallel(worker_step, state.tx, mesh=mesh)
  rows = jax.jit(jax.shard_map(lambda s, b: eval_step(s, jax.tree.map(lambda x: x[0], b)), mesh=mesh,
                               in_specs=(P(), P("batch")), out_specs=P()))

  def p_train_step(state, batch):
    rest, opt_state, metrics = step(state.replace(opt_state=None), state.opt_state, batch)
    return rest.replace(opt_state=opt_state), metrics

  return p_train_step, lambda state, batch: rows(state.replace(opt_state=None), batch)


def evaluate(p_eval_step, state, config) -> float:
  test = data.make_pipeline(config.dataset, "test", global_batch_size=config.batch_size, seed=config.seed,
                            augment=None, train=False)
  totals = [jax.device_get(p_eval_step(state, shard(batch))) for batch in test]  # one in flight (below)
  return float(sum(t["correct"] for t in totals) / sum(t["count"] for t in totals))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains to ``config.num_steps`` (resuming from ``workdir``'s checkpoints); returns the last state and figures."""
  state = create_train_state(config, CNN(tuple(config.features)), data.get_spec(config.dataset).image_shape)
  mngr = ocp.CheckpointManager(os.path.abspath(workdir), options=ocp.CheckpointManagerOptions(max_to_keep=2))
  start = 0
  if mngr.latest_step() is not None:
    start, state = mngr.latest_step(), restore(mngr, state)
  p_train_step, p_eval_step = {"pmap": pmap_steps, "data_parallel": data_parallel_steps}[config.route](state)
  train = data.make_pipeline(config.dataset, "train", global_batch_size=config.batch_size, seed=config.seed,
                             augment=None, train=True, start_step=start)
  out = {"state": state, "start": start, "accuracy": []}
  for step in range(start + 1, config.num_steps + 1):
    state, metrics = p_train_step(state, shard(next(train)))
    # One cross-device program in flight at a time: XLA:CPU's host devices can deadlock with
    # several (docs/design.md, "Host devices"); on GPUs and TPUs this only waits.
    jax.block_until_ready(metrics)
    if (config.eval_every and step % config.eval_every == 0) or step == config.num_steps:
      out["accuracy"].append((step, evaluate(p_eval_step, state, config)))
      print(f"step {step}: train loss {float(metrics['loss'][0]):.3f}, test accuracy {out['accuracy'][-1][1]:.4f}")
    if config.checkpoint_every and step % config.checkpoint_every == 0:
      save(mngr, step, state)
  mngr.wait_until_finished()
  m = jaxcomp.metrics(state.opt_state)  # a worker's last step, as the transport counted it
  print(f"{m['bytes_on_wire']:.0f} bytes on the wire a step instead of {m['float32_bytes']:.0f} "
        f"({m['compression_ratio']:.1f}x)")
  out["state"] = state
  return out


def main(argv):
  del argv
  train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "Checkpoints go here; a run resumes from them.", required=True)
  config_flags.DEFINE_config_dict("config", get_config())
  app.run(main)
