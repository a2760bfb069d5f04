"""Memory per device of a data-parallel GPT step: replicated, sharded optimizer state, sharded parameters.

Builds the project's GPT (``jaxcomp.models.GPT``, byte vocabulary) at
``--width`` and ``--depth``, then for each number of devices ``P`` in
``--devices`` lowers and compiles a ``jaxcomp.data_parallel`` step over a
mesh of ``P`` host devices (one worker per device) with ``--compressor`` and
AdamW, in up to three layouts: the chain replicated (``replicated``), wrapped in
``jaxcomp.shard_optimizer`` (``sharded``: the state cut), and with ``shard_params=True``
(``params``: the parameters cut too, gathered in float for the step).
Everything is abstract (``step.abstract``: shapes and shardings); nothing is
run or allocated.

It also compiles the forward and backward pass alone (one worker, one
device: the gradient and the activations it keeps). Per device it reports the parameters' and the optimizer state's own bytes
(``benchmarks.train_memory.per_device_bytes``) and XLA's compile-time
figures (``compiled.memory_analysis()``: argument, output, temp, alias and
generated-code bytes, and the peak estimate ``argument + output + temp −
alias``: ``benchmarks.train_memory.memory_figures``). The step donates its
parameters and state, so they count once. ``working_bytes`` is the peak less
the parameters, the state and the batch: what the step holds beyond them
(gradients, activations, payloads, the gathered updates).

Usage::

  python -m benchmarks.zero_memory --width 512 --depth 8 --devices 4,8 [--layouts gradient,sharded,params] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from benchmarks import train_memory  # first: it asks for 8 host devices before JAX starts

import jax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-order
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcomp  # noqa: E402
from jaxcomp import models  # noqa: E402
from jaxcomp.exchange import scatter  # noqa: E402

VOCAB = 256  # bytes


def gpt(width: int, depth: int, context: int):
  """The widened GPT and its parameters' shapes (nothing allocated)."""
  model = models.get_model("gpt", VOCAB, width=width, depth=depth, heads=width // 64, context=context)
  tokens = jnp.zeros((1, context), jnp.int32)
  return model, jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, train=False))["params"]


def next_token_loss(model):
  """``loss(params, tokens)``: the mean next-token cross-entropy on ``[b, context + 1]`` tokens."""

  def loss(params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1], train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  return loss


def worker_step(model, tx, axes="workers"):
  """One worker's step: its loss and gradient, then ``tx`` (the exchange and the optimizer); returns the loss too."""
  loss = next_token_loss(model)

  def step(params, opt_state, tokens):
    value, grads = jax.value_and_grad(loss)(jaxcomp.parallel.vary(params, axes), tokens)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return step


LAYOUTS = ("replicated", "sharded", "params")


def chain(compressor: str, devices: int, layout: str, param_gather=None, align: int = scatter.DEFAULT_ALIGN,
          **compressor_kwargs):
  """``compressor`` (with ``compressor_kwargs``) then AdamW, in ``layout``; ``param_gather``: the
  parameters' all-gather codec of the ``params`` layout (``None``: float); ``align``: the cut's
  (``jaxcomp.shard_optimizer``'s)."""
  tx = optax.chain(jaxcomp.get_transform(compressor, axis_name="workers", **compressor_kwargs),
                   optax.adamw(1e-3, weight_decay=0.1))
  if layout == "replicated":
    return tx
  return jaxcomp.shard_optimizer(tx, axis_name="workers", num_workers=devices, shard_params=layout == "params",
                                 param_gather=param_gather, align=align)


def compile_step(model, params, tx, devices: int, batch: int, label: str):
  """The ``data_parallel`` step of ``tx`` over ``devices`` host devices, compiled for its abstract inputs.

  Returns ``(step, compiled, own)``: the ``jaxcomp.data_parallel`` step, the compiled program (callable
  on ``step.init``'s outputs and a batch laid out a row a worker) and the bytes a device holds of its own
  inputs (parameters, optimizer state, batch).
  """
  mesh = Mesh(np.array(jax.devices()[:devices]), ("workers",))
  step = jaxcomp.data_parallel(worker_step(model, tx), tx, mesh=mesh)
  abstract_params, abstract_state = step.abstract(params)
  tokens = jax.ShapeDtypeStruct((devices, batch, model.context + 1), jnp.int32,
                                sharding=NamedSharding(mesh, P("workers")))
  print(f"[zero_memory] {label}: compiling", file=sys.stderr, flush=True)
  compiled = step.lower(abstract_params, abstract_state, tokens).compile()
  own = {"params_bytes": train_memory.per_device_bytes(abstract_params),
         "opt_state_bytes": train_memory.per_device_bytes(abstract_state),
         "batch_bytes": train_memory.per_device_bytes(tokens)}
  return step, compiled, own


def figures(compiled, own: dict[str, int]) -> dict[str, int]:
  """``own`` with XLA's figures (``train_memory.memory_figures``) and ``working_bytes``, the peak beyond ``own``."""
  memory = train_memory.memory_figures(compiled)
  return {**own, **memory, "working_bytes": memory["peak_bytes"] - sum(own.values())}


def measure(model, params, devices: int, compressor: str, layout: str, batch: int,
            align: int = scatter.DEFAULT_ALIGN) -> dict[str, Any]:
  """One compiled step's figures, per device."""
  _, compiled, own = compile_step(model, params, chain(compressor, devices, layout, align=align), devices, batch,
                                  f"P={devices} {layout}")
  return {"devices": devices, "state": layout, **figures(compiled, own)}


def gradient_only(model, params, batch: int) -> dict[str, Any]:
  """The forward and backward pass alone, one worker on one device: its output is the
  gradient, its temp what the backward pass keeps (activations); no exchange, no optimizer."""
  tokens = jax.ShapeDtypeStruct((batch, model.context + 1), jnp.int32)
  print("[zero_memory] the gradient alone: compiling", file=sys.stderr, flush=True)
  compiled = jax.jit(jax.grad(next_token_loss(model))).lower(params, tokens).compile()
  return {"devices": 1, "state": "gradient only", **train_memory.memory_figures(compiled)}


def gpt_arguments(parser: argparse.ArgumentParser, width: int, depth: int, context: int, batch: int) -> None:
  """``--width``, ``--depth``, ``--context`` (the GPT of :func:`gpt`) and ``--batch``, with these defaults."""
  parser.add_argument("--width", type=int, default=width)
  parser.add_argument("--depth", type=int, default=depth)
  parser.add_argument("--context", type=int, default=context)
  parser.add_argument("--batch", type=int, default=batch, help="sequences per worker (one worker a device)")


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  gpt_arguments(parser, width=512, depth=8, context=256, batch=4)
  parser.add_argument("--devices", default="4,8", help="comma-separated mesh sizes")
  parser.add_argument("--compressor", default="terngrad")
  parser.add_argument("--layouts", default="gradient,replicated,sharded,params",
                      help="comma-separated, from: gradient (forward and backward alone), replicated, sharded "
                           "(the state cut), params (the parameters too)")
  parser.add_argument("--align", type=int, default=scatter.DEFAULT_ALIGN,
                      help="chunks hold a multiple of this many values (jaxcomp.shard_optimizer's align=)")
  parser.add_argument("--json", default=None, help="also write the JSON to this file")
  args = parser.parse_args(argv)
  model, params = gpt(args.width, args.depth, args.context)
  doc = {"jax_version": jax.__version__, "backend": jax.default_backend(), "per": "device",
         "model": {"width": args.width, "depth": args.depth, "context": args.context, "vocab": VOCAB,
                   "parameters": sum(leaf.size for leaf in jax.tree.leaves(params))},
         "batch_per_worker": args.batch, "compressor": args.compressor, "optimizer": "adamw", "align": args.align, "results": []}
  layouts = args.layouts.split(",")
  if "gradient" in layouts:
    doc["results"].append(gradient_only(model, params, args.batch))
    print(json.dumps(doc["results"][-1]), file=sys.stderr, flush=True)
  for devices in [int(d) for d in args.devices.split(",")]:
    for layout in [s for s in LAYOUTS if s in layouts]:
      doc["results"].append(measure(model, params, devices, args.compressor, layout, args.batch, args.align))
      print(json.dumps(doc["results"][-1]), file=sys.stderr, flush=True)
  return train_memory.emit(doc, args.json)


if __name__ == "__main__":
  main()
