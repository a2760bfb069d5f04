"""The multi-process test's cases, shared by the worker processes and the vmap reference.

CASES[name](num_workers) -> (make_tx(axis_name), grads(step) with a leading worker axis, steps).
ALSO[name]: more transforms the worker runs on the same gradients, by the prefix of their outputs.
"""

import jax
import jax.numpy as jnp
import optax

import jaxcomp


def _grads(num_workers, nan_at=None):
  """Every worker's gradients, identical in every process (each picks its own row)."""

  def grads(step):
    k = jax.random.PRNGKey(100 + step)
    g = {"w": jax.random.normal(k, (num_workers, 37, 11)), "b": jax.random.normal(k, (num_workers, 11)) * 0.1}
    if step == nan_at:  # worker 1's gradient is not finite: every worker skips the step
      g["w"] = g["w"].at[1, 0, 0].set(jnp.nan)
    return g

  return grads


def _wrapped(axis):
  chain = optax.chain(jaxcomp.terngrad(axis_name=axis), optax.sgd(0.1, momentum=0.9))
  return jaxcomp.apply_if_finite(jaxcomp.multi_steps(chain, 2), 1, axis_name=axis)


CASES = {
    "terngrad": lambda n: (lambda axis: jaxcomp.terngrad(axis_name=axis), _grads(n), 2),
    # Exchanges at steps 1 and 4 (step 2 is skipped everywhere, so multi_steps does not count it).
    "wrappers": lambda n: (_wrapped, _grads(n, nan_at=2), 5),
    # DiLoCo, H = 2: Adam inside each process, int8 pseudo-gradients at steps 1 and 3.
    "diloco": lambda n: (lambda axis: jaxcomp.diloco(optax.adam(0.1), 2, axis_name=axis, exchange="int8"),
                         _grads(n), 4),
    # Streaming DiLoCo, H = 2, two fragments ("w", "b"), each applied a step after its send (steps
    # 1, 2 and 3), 4-bit outer gradients.
    "streaming_diloco": lambda n: (lambda axis: jaxcomp.diloco(optax.adam(0.1), 2, fragments=2, delay=1,
                                                               axis_name=axis, exchange="fp4"), _grads(n), 4),
}

# Buckets across processes, per tensor and bucketed: int8 (with error feedback, so residuals
# too) in one bucket, and TernGrad with each tensor a bucket of its own (the second bucket's
# agreed scalar rides on the first bucket's all-gather).
ALSO = {
    "terngrad": {
        "int8_per_tensor_": lambda axis: jaxcomp.int8(axis_name=axis, bucket_bytes=0),
        "int8_bucketed_": lambda axis: jaxcomp.int8(axis_name=axis),
        "terngrad_per_tensor_": lambda axis: jaxcomp.terngrad(axis_name=axis, bucket_bytes=0),
        "terngrad_bucketed_": lambda axis: jaxcomp.terngrad(axis_name=axis, bucket_bytes=64),
    },
}


def DATA_PARALLEL(num_workers):  # pylint: disable=invalid-name
  """``jaxcomp.data_parallel``'s case: (make_tx(axis), worker_step(tx, axis), params, batch, steps)."""
  make_tx = lambda axis: optax.chain(jaxcomp.int8(axis_name=axis), optax.sgd(0.5, momentum=0.9))
  return make_tx, _classifier_step, {"w": jnp.zeros((6, 3)), "b": jnp.zeros(3)}, _classes(num_workers, 6, 3), 3


# jaxcomp.shard_optimizer's runs of ZERO by name: the gradients' compressor, and with ZeRO-3
# (shard_params) the parameters' gather (qwZ: int8 blocks of 40 values, as the chunks are aligned).
ZERO_RUNS = {
    "float": ("none", {}),
    "terngrad": ("terngrad", {}),
    "float_params": ("none", {"shard_params": True}),
    "qwz_terngrad": ("terngrad", {"shard_params": True, "param_gather": jaxcomp.BlockInt(bits=8, block=40)}),
}


def ZERO(num_workers):  # pylint: disable=invalid-name
  """``jaxcomp.shard_optimizer``'s case: (make_tx(run, axis), worker_step(tx, axis), params, batch, steps).

  AdamW sharded over the workers, after ``"none"`` (float) or TernGrad with
  error feedback, the parameters whole or sharded too (``run``, a name of
  ``ZERO_RUNS``); ``w`` (640 values) is cut into a chunk a worker, ``b``
  stays whole. ``steps``: before and after a checkpoint.
  """

  def make_tx(run, axis):
    compressor, stage3 = ZERO_RUNS[run]
    head = (jaxcomp.get_transform("none", axis_name=axis) if compressor == "none"
            else jaxcomp.terngrad(axis_name=axis, error_feedback=True))
    return jaxcomp.shard_optimizer(optax.chain(head, optax.adamw(0.05, weight_decay=0.1)), axis_name=axis,
                                   num_workers=num_workers, align=40, **stage3)

  return make_tx, _classifier_step, {"w": jnp.zeros((40, 16)), "b": jnp.zeros(16)}, _classes(num_workers, 40, 16), (2, 2)


def _classes(num_workers, features, classes):
  """A batch of 4 examples a worker: ``features`` normal inputs, labelled by the largest of the first ``classes``."""
  x = jax.random.normal(jax.random.PRNGKey(7), (num_workers, 4, features))
  return x, jnp.argmax(x[..., :classes], axis=-1)


def _classifier_step(tx, axis):
  """One worker's step of a linear softmax classifier, its chain ``tx`` exchanging over ``axis``."""

  def step(params, opt_state, batch):
    loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(batch[0] @ p["w"] + p["b"], batch[1]).mean()
    updates, opt_state = tx.update(jax.grad(loss)(jaxcomp.parallel.vary(params, axis)), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return step


def save_checkpoint(directory, step, tree):
  """``tree`` saved as orbax's checkpoint ``step`` in ``directory``; every process calls it and writes its shards."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  with ocp.CheckpointManager(directory) as mngr:
    mngr.save(step, args=ocp.args.StandardSave(tree))
    mngr.wait_until_finished()


def restore_checkpoint(directory, target):
  """The latest checkpoint in ``directory``, laid out as ``target`` (``jax.ShapeDtypeStruct`` leaves)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  with ocp.CheckpointManager(directory) as mngr:
    return mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(target))


def leaves_by_path(tree):
  """``{path: leaf}`` of a pytree (``jax.tree_util.keystr`` paths), to compare two runs leaf by leaf."""
  return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
