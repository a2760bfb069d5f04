"""The optimizer state one worker holds: replicated against sharded (``jaxcomp.shard_optimizer``).

The sizes are the arrays' own (``jax.eval_shape`` of ``init``, then laid out
per worker: nothing is allocated), for a model's parameters with a
compressor and AdamW; a sharded leaf counts the one row a worker holds.
What XLA keeps beyond the state while a step runs (gradients, activations,
the gathered updates) is not in these figures.

  python -m benchmarks.zero_state --model gpt2_small --workers 4,8
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import optax

import jaxcomp
from jaxcomp import models


def state_bytes(tx, params, workers: int) -> int:
  """Bytes of one worker's optimizer state (a worker-local leaf: its row)."""
  state = jax.eval_shape(lambda p: jaxcomp.parallel.replicate_workers(tx.init(p), workers), params)
  total = 0
  for local, leaf in _leaves_with_locality(state):
    n = leaf.size // workers if local else leaf.size
    total += n * leaf.dtype.itemsize
  return total


def _leaves_with_locality(state):
  is_local = lambda x: isinstance(x, jaxcomp.core.WorkerLocal)
  for node in jax.tree.leaves(state, is_leaf=is_local):
    if is_local(node):
      yield from ((True, leaf) for leaf in jax.tree.leaves(node))
    else:
      yield False, node


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="gpt2_small", choices=models.LANGUAGE_MODELS)
  parser.add_argument("--workers", default="4,8")
  parser.add_argument("--compressor", default="terngrad")
  args = parser.parse_args(argv)
  vocab = 50257 if args.model == "gpt2_small" else 256
  model = models.get_model(args.model, vocab)
  tokens = jnp.zeros((1,) + models.input_shape(args.model), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, train=False))["params"]
  n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
  rows = []
  for workers in [int(w) for w in args.workers.split(",")]:
    chain = lambda: optax.chain(jaxcomp.get_transform(args.compressor, axis_name="workers"), optax.adamw(1e-3))
    sharded = jaxcomp.shard_optimizer(chain(), axis_name="workers", num_workers=workers)
    rows.append({"model": args.model, "parameters": n_params, "workers": workers, "compressor": args.compressor,
                 "replicated_state_bytes": state_bytes(chain(), params, workers),
                 "sharded_state_bytes": state_bytes(sharded, params, workers)})
    print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
  main()
