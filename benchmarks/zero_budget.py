"""A GPT whose replicated parameters and AdamW state exceed a per-device budget, trained sharded (ZeRO-3, compressed).

For the stated budget ``--budget-mb`` (MB = 10⁶ bytes a device), builds the
project's GPT (``benchmarks.zero_memory.gpt``: byte vocabulary, ``--width``,
``--depth``, ``--context``) and compiles its ``jaxcomp.data_parallel`` step
over ``--devices`` host devices (one worker each, ``--batch`` sequences a
worker) in two layouts, with AdamW (``benchmarks.zero_memory.chain``):

* ``zero3``: ``jaxcomp.shard_optimizer(..., shard_params=True)``, the
  parameters and AdamW's moments cut over the workers; the weights gathered
  in int8 blocks (ZeRO++'s qwZ, ``param_gather=jaxcomp.BlockInt(bits=8)``) and
  the gradients reduce-scattered in int4 blocks (qgZ, ``jaxcomp.blockint(bits=4)``
  at the chain's head). Wang et al., *ZeRO++: Extremely Efficient Collective
  Communication for Giant Model Training*, arXiv:2306.10209, §3.1 and §3.3;
* ``replicated``: the same chain, not sharded: every device holds the whole
  parameters and AdamW's state (12 bytes a parameter in float32).

For each it prints a device's own parameters and optimizer state and XLA's
compile-time peak (``compiled.memory_analysis()``: argument + output + temp −
alias, ``benchmarks.train_memory.memory_figures``), each against the budget
("fits" / "exceeds"). It compiles ``zero3`` first and refuses (exit status 1,
the figures in the message) when its peak exceeds the budget. Otherwise it
trains ``zero3`` for ``--steps`` steps on real text (the GCIDE dictionary,
``jaxcomp.data.text``: random windows of the train split, as
``experiments.train`` draws them), running the very program it measured, and
reports each step's mean loss over the workers and seconds, and the process's
peak resident memory (``resource.getrusage``).

What the budget is checked against: the devices are XLA:CPU host devices of
one process (``--xla_force_host_platform_device_count``), so no runtime
enforces a limit per device; the budget is compared with XLA's compile-time
peak per device. The process's resident memory holds every device's buffers
(and the whole initial parameters, made once before they are cut).

qgZ's error feedback is off by default, as ZeRO++ describes qgZ: with
``--error-feedback`` each worker keeps a residual of its whole gradient
(4 bytes a parameter, not cut: each worker encodes every chunk it sends).

Usage::

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.zero_budget \\
      --budget-mb 950 --width 768 --depth 12 --context 64 --batch 1 --devices 8 --steps 12 [--json out.json]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

from benchmarks import train_memory  # first: it asks for 8 host devices before JAX starts
from benchmarks import zero_memory

import jax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-order
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcomp  # noqa: E402
from jaxcomp.data import text  # noqa: E402

MB = 10**6
QGZ = {"bits": 4}  # the gradients' reduce-scatter: int4 blocks (blockint's default block, 2,560 values)
QWZ_BITS = 8  # the weights' all-gather: int8 blocks


def chains(devices: int, error_feedback: bool) -> dict[str, Any]:
  """The two layouts' chains, ``zero3`` first (qwZ + qgZ, then AdamW)."""
  kwargs = dict(QGZ, error_feedback=error_feedback)
  return {"zero3": zero_memory.chain("blockint", devices, "params", param_gather=jaxcomp.BlockInt(bits=QWZ_BITS),
                                     **kwargs),
          "replicated": zero_memory.chain("blockint", devices, "replicated", **kwargs)}


def verdict(nbytes: int, budget_bytes: int) -> str:
  return "fits" if nbytes <= budget_bytes else "exceeds"


def judge(figures: dict[str, int], budget_bytes: int) -> dict[str, Any]:
  """A layout's figures with its parameters + state and its peak, each against the budget."""
  state = figures["params_bytes"] + figures["opt_state_bytes"]
  return {**figures, "state_bytes": state, "state_vs_budget": verdict(state, budget_bytes),
          "peak_vs_budget": verdict(figures["peak_bytes"], budget_bytes)}


def describe(layout: str, r: dict[str, Any], budget_mb: float) -> str:
  return (f"[zero_budget] {layout}: parameters + state {r['state_bytes'] / MB:,.1f} MB a device "
          f"({r['state_vs_budget']} {budget_mb:,.1f} MB), compiled peak {r['peak_bytes'] / MB:,.1f} MB "
          f"({r['peak_vs_budget']})")


def refusal(r: dict[str, Any], args: argparse.Namespace) -> str:
  residual = (" or drop --error-feedback (its residual is a whole float32 gradient a worker)"
              if args.error_feedback else "")
  return (f"zero_budget: refused: the sharded step (ZeRO-3, qwZ + qgZ) needs {r['peak_bytes'] / MB:,.1f} MB a device "
          f"at its compiled peak (parameters + state {r['state_bytes'] / MB:,.1f} MB, scratch "
          f"{r['temp_bytes'] / MB:,.1f} MB), over the budget of {args.budget_mb:,.1f} MB: nothing trained. Raise "
          f"--budget-mb, shrink --batch / --context (the scratch holds the whole gathered weights and gradient){residual}.")


def measure(model, params, args, budget: int) -> tuple[dict[str, Any], tuple[Any, Any]]:
  """Both layouts judged against the budget, and ``zero3``'s step and compiled program; refuses (``SystemExit``)
  before compiling the replicated layout when ``zero3`` does not fit."""
  results, zero3 = {}, None
  for layout, tx in chains(args.devices, args.error_feedback).items():
    step, compiled, own = zero_memory.compile_step(model, params, tx, args.devices, args.batch, layout)
    results[layout] = judge(zero_memory.figures(compiled, own), budget)
    print(describe(layout, results[layout], args.budget_mb), file=sys.stderr, flush=True)
    if zero3 is None:
      if results[layout]["peak_vs_budget"] == "exceeds":
        raise SystemExit(refusal(results[layout], args))
      zero3 = (step, compiled)
  return results, zero3


def windows(pipeline: text.TextPipeline, devices: int, batch: int) -> np.ndarray:
  """The next training batch as ``[devices, batch, context + 1]`` tokens (inputs and the last target)."""
  b = next(pipeline)
  tokens = np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)
  return tokens.reshape(devices, batch, -1)


def initial(model, step, seed: int):
  """The sharded parameters and state at step 0 (``step.init`` of the model's initial parameters), each made
  by one jitted program (not op by op); the whole parameters are dropped once cut."""
  tokens = np.zeros((1, model.context), np.int32)
  params = jax.jit(lambda key: model.init(key, tokens, train=False)["params"])(jax.random.PRNGKey(seed))
  placed = jax.tree.map(lambda leaf: leaf.sharding, step.abstract(params))
  return jax.jit(step.init, out_shardings=placed)(params)


def train(model, step, compiled, args) -> dict[str, Any]:
  """``args.steps`` steps of the compiled sharded program on GCIDE windows; the losses, seconds and peak RSS."""
  shards, state = initial(model, step, args.seed)
  rss_init = peak_rss()
  pipeline = text.TextPipeline(text.load_text("gcide", "train"), seq_len=model.context,
                               global_batch_size=args.devices * args.batch, train=True, seed=args.seed)
  rows = NamedSharding(step.mesh, P("workers"))
  losses, seconds = [], []
  for k in range(1, args.steps + 1):
    batch = jax.device_put(windows(pipeline, args.devices, args.batch), rows)
    start = time.perf_counter()
    shards, state, loss = jax.block_until_ready(compiled(shards, state, batch))
    losses.append(float(np.mean(jax.device_get(loss))))
    seconds.append(time.perf_counter() - start)
    print(f"[zero_budget] step {k}/{args.steps}: loss {losses[-1]:.4f}, {seconds[-1]:.2f} s, "
          f"peak RSS so far {peak_rss() / MB:,.0f} MB", file=sys.stderr, flush=True)
  return {"steps": args.steps, "data": "gcide train windows", "losses": losses, "seconds": seconds,
          "first_loss": losses[0], "last_loss": losses[-1],
          "peak_rss_after_init_bytes": rss_init, "peak_rss_bytes": peak_rss()}


def peak_rss() -> int:
  """The process's peak resident memory so far, in bytes (``getrusage``: kilobytes on Linux)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parse(argv) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--budget-mb", type=float, required=True, help="bytes a device may hold, in 10^6")
  zero_memory.gpt_arguments(parser, width=768, depth=12, context=64, batch=1)
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--steps", type=int, default=12, help="training steps of the sharded layout (0: none)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--error-feedback", action="store_true", help="qgZ with error feedback (a whole residual)")
  parser.add_argument("--json", default=None, help="also write the JSON to this file")
  args = parser.parse_args(argv)
  if args.budget_mb <= 0 or args.steps < 0:
    parser.error(f"--budget-mb must be positive and --steps at least 0; got {args.budget_mb} and {args.steps}")
  return args


def main(argv=None) -> dict[str, Any]:
  args = parse(argv)
  budget = int(args.budget_mb * MB)
  model, params = zero_memory.gpt(args.width, args.depth, args.context)
  doc = {"jax_version": jax.__version__, "backend": jax.default_backend(), "per": "device",
         "budget_bytes": budget, "checked_against": "XLA's compile-time peak per device (host devices: no runtime limit)",
         "model": {"width": args.width, "depth": args.depth, "context": args.context, "vocab": zero_memory.VOCAB,
                   "parameters": sum(leaf.size for leaf in jax.tree.leaves(params))},
         "devices": args.devices, "batch_per_worker": args.batch, "optimizer": "adamw",
         "weights_gather": f"int{QWZ_BITS} blocks", "gradients": f"int{QGZ['bits']} blocks",
         "error_feedback": args.error_feedback, "layouts": {}}
  doc["layouts"], (step, compiled) = measure(model, params, args, budget)
  doc["training"] = train(model, step, compiled, args) if args.steps else None
  return train_memory.emit(doc, args.json)


if __name__ == "__main__":
  main()
