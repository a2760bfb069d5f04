"""Which of optax's optimizers give the replicated numbers with their state sharded.

For every optimizer of optax's alias list (default hyperparameters, a
learning rate of 1e-2), three steps of the float ``none`` exchange over 4
``vmap``-simulated workers on a small tree, replicated and under
``jaxcomp.shard_optimizer``: the largest difference between the two runs'
parameters, relative to the largest parameter, or the error the sharded
chain raised. An optimizer that works element by element gives the
replicated parameters up to float32 rounding; one that looks across a
tensor (a norm, a trust ratio, factored moments) gives other numbers, or is
refused by name.

  python -m benchmarks.zero_optimizers
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import optax

import jaxcomp
from jaxcomp import parallel

WORKERS = 4
PARAMS = {"w": jnp.linspace(-1.0, 1.0, 24 * 100).reshape(24, 100), "v": jnp.linspace(0.5, -0.5, 1201),
          "b": jnp.ones(7)}
SKIP = {"lbfgs": "needs the loss (value_and_grad_from_state): not a gradient-only chain",
        "polyak_sgd": "needs the loss value (extra argument)"}


def _grads(worker):
  key = jax.random.PRNGKey(worker)
  return jax.tree.map(lambda p: jax.random.normal(jax.random.fold_in(key, p.size), p.shape), PARAMS)


def run(tx, params=None, grads=None, steps: int = 3):
  """``steps`` updates of ``tx`` over ``vmap``-simulated workers (one row of ``grads`` each, the same every step).

  Returns the parameters, the state (laid over the workers) and the last updates (a row per worker).
  """
  params = PARAMS if params is None else params
  grads = jax.vmap(_grads)(jnp.arange(WORKERS)) if grads is None else grads
  workers = jax.tree.leaves(grads)[0].shape[0]
  state = parallel.replicate_workers(tx.init(params), workers)
  axes = parallel.worker_axes(state)
  update = jax.jit(jax.vmap(tx.update, in_axes=(0, axes, None), out_axes=(0, axes), axis_name="workers"))
  for _ in range(steps):
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, jax.tree.map(lambda u: u[0], updates))
  return params, state, updates


def compare(name: str) -> dict:
  make = lambda: optax.chain(jaxcomp.get_transform("none", axis_name="workers"), getattr(optax, name)(1e-2))
  try:
    replicated = run(make())[0]
    sharded = run(jaxcomp.shard_optimizer(make(), axis_name="workers", num_workers=WORKERS, align=40))[0]
  except Exception as e:  # pylint: disable=broad-except
    return {"optimizer": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
  scale = max(float(jnp.max(jnp.abs(p))) for p in jax.tree.leaves(replicated))
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(replicated), jax.tree.leaves(sharded)))
  return {"optimizer": name, "max_relative_difference": diff / scale}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--optimizers", default="", help="comma-separated names (default: optax's alias list)")
  args = parser.parse_args(argv)
  alias = vars(optax._src.alias)  # pylint: disable=protected-access
  names = args.optimizers.split(",") if args.optimizers else sorted(
      n for n in dir(optax) if n[0].islower() and alias.get(n) is getattr(optax, n) and callable(alias[n]))
  for name in names:
    row = {"optimizer": name, "skipped": SKIP[name]} if name in SKIP else compare(name)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
