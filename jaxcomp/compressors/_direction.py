"""An optimizer that is a direction then a learning rate, from a config (1-bit Adam, DeMo).

Experiment configs name an optimizer (``config.optimizer``, with its schedule, warm-up and
decoupled weight decay) and a compressor. For a compressor that *is* the optimizer, the
config's optimizer may only scale its direction: :func:`optimizer_after` chains the two and
refuses an optimizer with moments of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def optimizer_after(tx: optax.GradientTransformation, optimizer: optax.GradientTransformation,
                    owner: str) -> optax.GradientTransformationExtraArgs:
  """``optax.chain(tx, optimizer)``, refusing an ``optimizer`` whose state keeps moments.

  Args:
    tx: the direction (``owner``'s transform: it exchanges and preconditions).
    optimizer: an optimizer that only scales (``optax.sgd(learning_rate)``, possibly after
      ``optax.add_decayed_weights``): its state may hold step counters, no moments.
    owner: the name of the compressor, for the error.

  Raises:
    ValueError: at ``init``, if ``optimizer`` keeps moments of its own (momentum, Adam, ...).
  """
  tx = optax.with_extra_args_support(tx)
  opt = optax.with_extra_args_support(optimizer)

  def init_fn(params):
    shapes = jax.eval_shape(opt.init, params)
    if any(jnp.issubdtype(s.dtype, jnp.floating) and s.ndim for s in jax.tree.leaves(shapes)):
      raise ValueError(
          f"{owner} is the optimizer: the optimizer after it must only apply the learning rate "
          "(optax.sgd(schedule); in a config, optimizer='sgd'), but this one keeps moments of its own "
          "(momentum, Adam, AdaGrad ...).")
    return tx.init(params), opt.init(params)

  def update_fn(updates, state, params=None, **extra_args):
    direction, s1 = tx.update(updates, state[0], params, **extra_args)
    new_updates, s2 = opt.update(direction, state[1], params, **extra_args)
    return new_updates, (s1, s2)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
