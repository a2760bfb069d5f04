"""How much variance TernGrad adds to the averaged gradient as the workers grow (TG-F3 diagnostic).

TernGrad's Fig. 3 (TG-F3) splits a total batch of 64 over N workers; our
Fashion-MNIST runs found TernGrad's gap to floating growing with N (momentum:
-0.32 pp at N = 1 to -1.15 pp at N = 16), and its final training loss with it.
This script measures the quantity behind that, at fixed parameters (the
mechanism is in the TG-F3 section of docs/results.md): for a
total batch of 64 real examples split over N workers, the mean squared error
that TernGrad's exchange adds to the averaged gradient,

    E ||avg_ternary - avg_float||^2 / ||avg_float||^2

(``avg_float`` is the batch-64 gradient, what floating exchanges for any N),
beside the minibatch noise of that batch-64 gradient itself,
``||avg_float - g_big||^2 / ||g_big||^2`` against a 4,096-example gradient
(the whole split if it has fewer; ``reference_batch`` in the results).
Both are averaged over batches and TernGrad keys; the exchange is the library's
``jaxcomp.terngrad`` (clipping c = 2.5, scalar sharing) under ``vmap`` with N
workers, exactly as the trainer runs it. Two more measures per N:

* the same added error with the logits layer in float (``skip`` of
  :func:`jaxcomp.models.is_last_layer`), the ablation TernGrad §4.2 advises
  for large models;
* ``s/σ_i``: the shared scalar ``s`` (TernGrad Eq. 2 on the clipped
  gradient, then the maximum over workers, §3.2's scalar sharing) over each
  worker's own standard deviation ``σ_i``, median over tensors, workers and
  batches. Each worker's values are ternarized to {−s, 0, s} with
  probabilities ``|g|/s``, so a large ``s/σ_i`` means worker i's gradient is
  sent as a few ±s values: the variance it adds grows with ``s``.

Parameters: LeNet (TG-F3's model) at initialisation and after ``--train_steps``
steps of floating momentum SGD (batch 64, LR 0.01), on the real offline dataset
(``benchmarks/_lenet.py``).

Usage::

    python -m benchmarks.terngrad_variance [--train_steps 1000] [--batches 8] [--keys 8] \
        [--out runs/TG-F3]

It writes ``<out>/<dataset>/variance/{results.json, config.json, command.txt}``,
which ``experiments.report`` reads for TG-F3's mechanism.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

import jaxcomp
from benchmarks import _results
from benchmarks._lenet import RealLeNet
from jaxcomp import models
from jaxcomp import parallel

WORKERS = (1, 2, 4, 8, 16, 32, 64)
TOTAL_BATCH = 64
RESULT_NAME = "variance"  # runs/TG-F3/<dataset>/variance/
REFERENCE_BATCH = 4096  # the minibatch noise's reference gradient (fewer if the split is smaller)
CLIP_SIGMA = 2.5  # jaxcomp.terngrad's default, TG-F3's setting


@jax.jit  # one program, not one dispatch per leaf and operation (also inlined in jitted callers)
def _rel_sq_error(a, b) -> jax.Array:
  """``||a - b||^2 / ||b||^2`` over all leaves of two pytrees."""
  return otu.tree_norm(otu.tree_sub(a, b), squared=True) / otu.tree_norm(b, squared=True)


def scalar_over_sigma(gs, clip_sigma: float = CLIP_SIGMA) -> np.ndarray:
  """``s/σ_i`` for every tensor and worker of ``gs`` (leaves ``[N, ...]``), flattened.

  ``σ_i`` is worker i's population standard deviation of the tensor; worker
  i's own scalar is ``min(max|g_i|, c·σ_i)`` (Eq. 2 on the clipped tensor);
  ``s`` is their maximum over the workers (scalar sharing).
  """
  out = []
  for g in jax.tree.leaves(gs):
    flat = np.asarray(g, np.float64).reshape(g.shape[0], -1)
    sigma = flat.std(axis=1)
    own = np.minimum(np.abs(flat).max(axis=1), clip_sigma * sigma)
    with np.errstate(divide="ignore"):
      out.append(own.max() / sigma)
  return np.concatenate(out)


def measure(net: RealLeNet, params, batches, keys: int, workers=WORKERS,
            float_logits: bool = False) -> dict[int, float]:
  """Relative squared error TernGrad's exchange adds, per N (mean over batches and keys)."""
  worker_grads = _worker_grads(net)
  skip = jaxcomp.skip_by_path(models.is_last_layer) if float_logits else None
  out = {}
  for n in workers:
    step = _exchange_error(float_logits)
    ratios = []
    for bi, (gs, mean) in enumerate(_split_grads(worker_grads, params, batches, n)):
      for k in range(keys):
        # A fresh seed per draw: the seed only sets the key in the initial
        # state, so one compiled step serves every draw.
        state = parallel.replicate_workers(
            jaxcomp.terngrad(axis_name="w", seed=1000 * bi + k, skip=skip).init(params), n)
        ratios.append(float(step(gs, state, mean)))
    out[n] = float(np.mean(ratios))
  return out


@functools.lru_cache(maxsize=None)
def _exchange_error(float_logits: bool):
  """``step(gs, state, mean)``: the relative squared error TernGrad's exchange adds to the mean of
  the workers' gradients ``gs``; jitted once, kept for every point measured (compiled once per N)."""
  skip = jaxcomp.skip_by_path(models.is_last_layer) if float_logits else None
  tx = jaxcomp.terngrad(axis_name="w", skip=skip)

  @jax.jit
  def step(gs, state, mean):
    axes = parallel.worker_axes(state)
    u = jax.vmap(lambda g, s: tx.update(g, s, None)[0], in_axes=(0, axes), out_axes=None,
                 axis_name="w")(gs, state)
    return _rel_sq_error(u, mean)

  return step


@functools.lru_cache(maxsize=None)
def _grad(net: RealLeNet):
  """The gradient of a batch, jitted once per net (compiled once per batch size)."""
  return jax.jit(jax.grad(net.loss))


@functools.lru_cache(maxsize=None)
def _worker_grads(net: RealLeNet):
  """Every worker's gradient of its share of the batch: one jitted function per net, shared by
  every measure (compiled once per N)."""
  return jax.jit(jax.vmap(jax.grad(net.loss), in_axes=(None, 0, 0)))


def _split_grads(worker_grads, params, batches, n: int):
  """Per batch: the N workers' gradients of their shares, and their mean."""
  for x, y in batches:
    xs = jnp.asarray(x).reshape(n, TOTAL_BATCH // n, *x.shape[1:])
    ys = jnp.asarray(y).reshape(n, TOTAL_BATCH // n)
    gs = worker_grads(params, xs, ys)
    yield gs, jax.tree.map(lambda a: a.mean(0), gs)


def scalar_ratio_medians(net: RealLeNet, params, batches, workers=WORKERS) -> dict[int, float]:
  """Median ``s/σ_i`` per N over tensors, workers and batches."""
  worker_grads = _worker_grads(net)
  return {n: float(np.median(np.concatenate(
      [scalar_over_sigma(gs) for gs, _ in _split_grads(worker_grads, params, batches, n)])))
          for n in workers}


def minibatch_noise(net: RealLeNet, params, batches, big) -> float:
  grad = _grad(net)
  gb = grad(params, jnp.asarray(big[0]), jnp.asarray(big[1]))
  return float(np.mean([float(_rel_sq_error(grad(params, jnp.asarray(x), jnp.asarray(y)), gb))
                        for x, y in batches]))


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--train_steps", type=int, default=1000)
  parser.add_argument("--batches", type=int, default=8)
  parser.add_argument("--keys", type=int, default=8)
  parser.add_argument("--workers", default=",".join(map(str, WORKERS)),
                      help="comma-separated N, each dividing 64")
  parser.add_argument("--dataset", default=None)
  parser.add_argument("--out", default="runs/TG-F3",
                      help="root of the results (<out>/<dataset>/variance/); empty: print only")
  args = parser.parse_args(argv)
  workers = tuple(int(w) for w in args.workers.split(","))
  if any(w < 1 or TOTAL_BATCH % w for w in workers):
    parser.error(f"--workers: every N must divide {TOTAL_BATCH}; got {args.workers}")
  t0 = time.time()
  net = RealLeNet(args.dataset, seed=0)
  stream = net.batches(TOTAL_BATCH)
  batches = [next(stream) for _ in range(args.batches)]
  big = next(net.batches(min(REFERENCE_BATCH, net.num_train)))
  points = {"init": net.params, f"after {args.train_steps} steps": train(net, args.train_steps)}

  res = {"benchmark": "terngrad_variance", "dataset": net.dataset, "total_batch": TOTAL_BATCH,
         "clip_sigma": CLIP_SIGMA, "reference_batch": len(big[1]), "batches": args.batches, "keys": args.keys,
         "train_steps": args.train_steps, "workers": list(workers), "points": {}}
  for name, p in points.items():
    print(f"[terngrad_variance] measuring at {name} ({time.time() - t0:.0f} s)", flush=True)
    res["points"][name] = {
        "terngrad_added": measure(net, p, batches, args.keys, workers),
        "terngrad_added_float_logits": measure(net, p, batches, args.keys, workers, float_logits=True),
        "scalar_over_sigma_median": scalar_ratio_medians(net, p, batches, workers),
        "minibatch_noise_b64": minibatch_noise(net, p, batches, big)}
  res["wall_time_sec"] = time.time() - t0
  print_tables(res)
  if args.out:
    _results.write_run_dir(args.out, "TG-F3", RESULT_NAME, res, vars(args),
                           "benchmarks.terngrad_variance", argv)
  return res


def train(net: RealLeNet, steps: int):
  """LeNet's parameters after ``steps`` steps of floating momentum SGD (batch 64, LR 0.01)."""
  tx = optax.sgd(0.01, momentum=0.9)
  params, opt = net.params, tx.init(net.params)

  @jax.jit
  def train_step(params, opt, x, y):
    g = jax.grad(net.loss)(params, x, y)
    u, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, u), opt

  batches = net.batches(TOTAL_BATCH)
  for _ in range(steps):
    x, y = next(batches)
    params, opt = train_step(params, opt, jnp.asarray(x), jnp.asarray(y))
  return params


def print_tables(res: dict) -> None:
  workers = res["workers"]
  print(f"TernGrad's added error on the averaged gradient, total batch {TOTAL_BATCH} over N workers "
        f"({res['dataset']}, LeNet; mean over {res['batches']} batches x {res['keys']} keys):")
  print("| parameters | measure | batch-64 minibatch noise | "
        + " | ".join(f"N={n}" for n in workers) + " |")
  print("|---|---|---:|" + "---:|" * len(workers))
  for name, r in res["points"].items():
    for key, label, fmt in (("terngrad_added", "added error, every tensor", "{:.3f}"),
                            ("terngrad_added_float_logits", "added error, logits in float", "{:.3f}"),
                            ("scalar_over_sigma_median", "median s/σ_i", "{:.1f}")):
      noise = f"{r['minibatch_noise_b64']:.3f}" if key == "terngrad_added" else ""
      print(f"| {name} | {label} | {noise} | "
            + " | ".join(fmt.format(r[key][n]) for n in workers) + " |")


if __name__ == "__main__":
  main()
