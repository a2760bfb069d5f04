"""How much variance TernGrad adds to the averaged gradient as the workers grow (TG-F3 diagnostic).

TernGrad's Fig. 3 (TG-F3) splits a total batch of 64 over N workers; our
Fashion-MNIST runs found TernGrad's gap to floating growing with N (momentum:
-0.32 pp at N = 1 to -1.15 pp at N = 16), and its final training loss with it.
This script measures the quantity behind that, at fixed parameters: for a
total batch of 64 real examples split over N workers, the mean squared error
that TernGrad's exchange adds to the averaged gradient,

    E ||avg_ternary - avg_float||^2 / ||avg_float||^2

(``avg_float`` is the batch-64 gradient, what floating exchanges for any N),
beside the minibatch noise of that batch-64 gradient itself,
``||avg_float - g_big||^2 / ||g_big||^2`` against a 4,096-example gradient.
Both are averaged over batches and TernGrad keys; the exchange is the library's
``jaxcomp.terngrad`` (clipping c = 2.5, scalar sharing) under ``vmap`` with N
workers, exactly as the trainer runs it.

Parameters: LeNet (TG-F3's model) at initialisation and after ``--train_steps``
steps of floating momentum SGD (batch 64, LR 0.01), on the real offline dataset
(``benchmarks/_lenet.py``).

Usage::

    python -m benchmarks.terngrad_variance [--train_steps 1000] [--batches 8] [--keys 8]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

import jaxcomp
from benchmarks._lenet import RealLeNet
from jaxcomp import parallel

WORKERS = (1, 2, 4, 8, 16, 32, 64)
TOTAL_BATCH = 64


def _rel_sq_error(a, b) -> jax.Array:
  """``||a - b||^2 / ||b||^2`` over all leaves of two pytrees."""
  return otu.tree_norm(otu.tree_sub(a, b), squared=True) / otu.tree_norm(b, squared=True)


def measure(net: RealLeNet, params, batches, keys: int) -> dict[int, float]:
  """Relative squared error TernGrad's exchange adds, per N (mean over batches and keys)."""
  # Every worker's gradient of its share of the batch, compiled once per N.
  worker_grads = jax.jit(jax.vmap(jax.grad(net.loss), in_axes=(None, 0, 0)))
  out = {}
  for n in WORKERS:
    tx = jaxcomp.terngrad(axis_name="w")
    axes = parallel.worker_axes(parallel.replicate_workers(tx.init(params), n))

    @jax.jit
    def step(gs, state, mean, tx=tx, axes=axes):
      u = jax.vmap(lambda g, s: tx.update(g, s, None)[0], in_axes=(0, axes), out_axes=None,
                   axis_name="w")(gs, state)
      return _rel_sq_error(u, mean)

    ratios = []
    for bi, (x, y) in enumerate(batches):
      xs = jnp.asarray(x).reshape(n, TOTAL_BATCH // n, *x.shape[1:])
      ys = jnp.asarray(y).reshape(n, TOTAL_BATCH // n)
      gs = worker_grads(params, xs, ys)
      mean = jax.tree.map(lambda a: a.mean(0), gs)
      for k in range(keys):
        # A fresh seed per draw: the seed only sets the key in the initial
        # state, so one compiled step serves every draw.
        state = parallel.replicate_workers(
            jaxcomp.terngrad(axis_name="w", seed=1000 * bi + k).init(params), n)
        ratios.append(float(step(gs, state, mean)))
    out[n] = float(np.mean(ratios))
  return out


def minibatch_noise(net: RealLeNet, params, batches, big) -> float:
  grad = jax.jit(jax.grad(net.loss))
  gb = grad(params, jnp.asarray(big[0]), jnp.asarray(big[1]))
  return float(np.mean([float(_rel_sq_error(grad(params, jnp.asarray(x), jnp.asarray(y)), gb))
                        for x, y in batches]))


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--train_steps", type=int, default=1000)
  parser.add_argument("--batches", type=int, default=8)
  parser.add_argument("--keys", type=int, default=8)
  parser.add_argument("--dataset", default=None)
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  t0 = time.time()
  net = RealLeNet(args.dataset, seed=0)
  stream = net.batches(TOTAL_BATCH)
  batches = [next(stream) for _ in range(args.batches)]
  big = next(net.batches(4096))

  tx = optax.sgd(0.01, momentum=0.9)
  params, opt = net.params, tx.init(net.params)

  @jax.jit
  def train_step(params, opt, x, y):
    g = jax.grad(net.loss)(params, x, y)
    u, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, u), opt

  points = {"init": net.params}
  train = net.batches(TOTAL_BATCH)
  for _ in range(args.train_steps):
    x, y = next(train)
    params, opt = train_step(params, opt, jnp.asarray(x), jnp.asarray(y))
  points[f"after {args.train_steps} steps"] = params

  res = {"benchmark": "terngrad_variance", "dataset": net.dataset, "total_batch": TOTAL_BATCH,
         "batches": args.batches, "keys": args.keys, "points": {}}
  for name, p in points.items():
    res["points"][name] = {"terngrad_added": measure(net, p, batches, args.keys),
                           "minibatch_noise_b64": minibatch_noise(net, p, batches, big)}
  res["wall_time_sec"] = time.time() - t0
  print(f"TernGrad's added error on the averaged gradient, total batch {TOTAL_BATCH} over N workers "
        f"({net.dataset}, LeNet; mean over {args.batches} batches x {args.keys} keys):")
  print("| parameters | batch-64 minibatch noise | " + " | ".join(f"N={n}" for n in WORKERS) + " |")
  print("|---|---:|" + "---:|" * len(WORKERS))
  for name, r in res["points"].items():
    print(f"| {name} | {r['minibatch_noise_b64']:.3f} | "
          + " | ".join(f"{r['terngrad_added'][n]:.3f}" for n in WORKERS) + " |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(res, f, indent=1)
  return res


if __name__ == "__main__":
  main()
