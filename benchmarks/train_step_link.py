r"""Training-step time over emulated links: LeNet and ResNet at P processes, one worker each.

For each config and method, every process builds the run exactly as
``experiments.train`` does (``experiments.build.build``: model, optimizer chain with the
compressor, mesh over all processes' devices, one worker per process) and
the median of ``--steps`` whole training steps is taken (gradient,
compressed exchange over the link, update), after 2 warm-up steps (the first
compiles), on three real batches in turn. Each step's time and its
``bytes_on_wire`` (0 on a silent step of DiLoCo) are kept, and ``--report``
shows the silent and the exchanging steps apart. ``--pipelined`` calls each step
before the previous one has finished, as a training loop does; ``--profile DIR``
traces as many steps again for ``benchmarks.timeline``.

Usage::

  sudo .venv/bin/python -m benchmarks.train_step_link --processes 2 --link 100mbit \
      --configs lenet,resnet --methods none,terngrad,threelc --json out.json
  .venv/bin/python -m benchmarks.train_step_link --report out1.json out2.json ...
  sudo .venv/bin/python -m benchmarks.train_step_link --configs gpt_zoo --link 10mbit --steps 150 \
      --methods diloco:inner_steps=50:fragments=4:delay=1 --pipelined --profile /tmp/steps

``--set KEY=VALUE`` overrides a config key for every method (e.g.
``--set optimizer=sgd`` for 1-bit Adam, which is the optimizer itself), and
``METHOD@KEY=VALUE`` for one method (e.g. ZeRO++'s qwZ + qgZ, with
``--set shard_params=True``: ``blockint:bits=4@param_gather=blockint``).
Each result carries the transport's counts of its last step, per worker
(``bytes_on_wire`` sent, ``received_bytes``); the report's bytes are those.

The configs: ``lenet`` is TG-F3's (``configs/terngrad_lenet.py:runlocal``,
LeNet, total batch 64); ``resnet`` is 3LC-T1-link's
(``configs/threelc_link.py``: ResNet-8, 32 images per worker, batch-norm
tensors in float); ``gpt_zoo`` is the language-model zoo's (``configs/zoo_gpt.py``:
a 0.12M-parameter GPT on GCIDE text, total batch 32 windows of 64 bytes).
Methods as in ``benchmarks.link`` (``name:key=value``).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks import link


def lenet_config(processes: int):
  from configs import terngrad_lenet  # pylint: disable=g-import-not-at-top
  return terngrad_lenet.get_config("runlocal")


def resnet_config(processes: int):
  from configs import threelc_link  # pylint: disable=g-import-not-at-top
  c = threelc_link.get_config()
  c.batch_size = 32 * processes
  return c


def gpt_zoo_config(processes: int):
  from configs import zoo_gpt  # pylint: disable=g-import-not-at-top
  return zoo_gpt.get_config()


CONFIGS = {"lenet": lenet_config, "resnet": resnet_config, "gpt_zoo": gpt_zoo_config}


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m benchmarks.train_step_link", description=__doc__.split("\n")[0])
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--link", default=None, help="RATE[,DELAY] for experiments.launch --link")
  p.add_argument("--configs", default="lenet,resnet", help=f"comma-separated, of {sorted(CONFIGS)}")
  p.add_argument("--methods", default="none,terngrad,threelc")
  p.add_argument("--steps", type=int, default=5, help="timed steps per method (after 2 warm-up steps)")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="a config override for every method, e.g. optimizer=sgd (repeatable)")
  p.add_argument("--pipelined", action="store_true",
                 help="call each step before the previous one's metrics are ready, as a training loop does "
                      "(JAX's asynchronous dispatch); a step's time is then from the previous step's end to its own")
  p.add_argument("--profile", default=None, metavar="DIR",
                 help="after timing, rank 0 traces --steps more steps of each method into DIR/<config>_<method> "
                      "(jax.profiler; benchmarks.timeline reads them)")
  p.add_argument("--json", default=None)
  p.add_argument("--report", nargs="+", default=None, metavar="JSON")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.report:
    return args
  bad = [c for c in args.configs.split(",") if c not in CONFIGS]
  if bad:
    p.error(f"unknown config(s) {bad}; known: {sorted(CONFIGS)}")
  for method in args.methods.split(","):
    try:
      link.method_spec(method.split("@")[0])
    except ValueError as e:
      p.error(str(e))
  for kv in args.set:
    key, eq, _ = kv.partition("=")
    if not eq or key not in lenet_config(1):
      p.error(f"--set {kv!r}: KEY=VALUE with a config key expected")
  if args.steps < 1 or args.processes < 1:
    p.error("--steps and --processes must be at least 1")
  return args


def _override(kv: str) -> tuple[str, object]:
  """``"KEY=VALUE"`` as ``(key, value)``; the value a Python literal, else a string (as in methods)."""
  import ast  # pylint: disable=g-import-not-at-top
  key, _, value = kv.partition("=")
  try:
    return key, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key, value


def _config(name: str, method: str, processes: int, overrides=()):
  import ml_collections  # pylint: disable=g-import-not-at-top
  c = CONFIGS[name](processes)
  method, *own = method.split("@")  # the method's own overrides after the common ones
  for kv in (*overrides, *own):
    setattr(c, *_override(kv))  # ml_collections checks the type
  compressor, kwargs = link.method_spec(method)
  c.workers = processes
  c.max_devices = 1
  c.compressor = compressor
  if compressor == "terngrad" and name == "lenet":
    kwargs = {"clip_sigma": 2.5, **kwargs}  # TG-F3's TernGrad
  c.compressor_kwargs = ml_collections.ConfigDict(kwargs)
  c.checkpoint_every = 0
  c.progress = False
  return c


def time_steps(run, steps: int, pipelined: bool = False) -> tuple[list[float], list[int], int]:
  """Seconds of each of ``steps`` training steps of ``run`` after 2 warm-up steps, and its bytes.

  By default a step runs alone: its time is from its call until its metrics are ready, and only
  then is the next step called. ``pipelined``: the steps are called as a training loop calls
  them, each before the previous one's metrics are waited for (JAX's asynchronous dispatch), and
  a step's time is from the previous step's metrics being ready to its own. The bytes are each
  step's ``bytes_on_wire`` (the transport's count per worker, read after the timing: 0 on a silent
  step), and the last step's ``received_bytes``.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  it = run.train_pipeline(start_step=0)
  batches = [run.shard_batch(next(it)) for _ in range(3)]
  keys = [np.asarray(jax.random.fold_in(run.step_root, i)) for i in range(steps + 2)]  # not between the steps
  state, starts, ready, sent = run.init_state(), [], [], []

  def wait(metrics) -> None:
    jax.block_until_ready(metrics)
    ready.append(time.perf_counter())

  for i in range(steps + 2):
    images, labels = batches[i % 3]
    starts.append(time.perf_counter())
    state, metrics = run.train_step(state, images, labels, keys[i])
    if pipelined and sent:
      wait(sent[-1])
    elif not pipelined:
      wait(metrics)
    sent.append(metrics)
  if pipelined:
    wait(sent[-1])
    times = [b - a for a, b in zip(ready[1:], ready[2:])]
  else:
    times = [b - a for a, b in zip(starts[2:], ready[2:])]
  return times, [int(m.get("bytes_on_wire", 0)) for m in sent[2:]], int(sent[-1].get("received_bytes", 0))


def worker(args) -> int:
  """One process: builds and times each config x method; rank 0 prints the JSON document."""
  from experiments import distributed  # pylint: disable=g-import-not-at-top
  if not distributed.initialize_from_env():
    raise SystemExit("benchmarks.train_step_link --worker runs under experiments.launch")
  import jax  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from experiments import build  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  rank, results = jax.process_index(), []
  for name in args.configs.split(","):
    for method in args.methods.split(","):
      with tempfile.TemporaryDirectory() as workdir:
        run = build.build(_config(name, method, jax.process_count(), args.set), workdir)
        tcp = link.tcp_counters()
        times, sent, received = time_steps(run, args.steps, args.pipelined)
        tcp = tcp and [b - a for a, b in zip(tcp, link.tcp_counters())]
        if args.profile:
          _trace(run, args, os.path.join(args.profile, f"{name}_{method}".replace(":", "_").replace("=", "-")))
      results.append({"config": name, "method": method, "step_time_sec": statistics.median(times),
                      "mean_step_time_sec": statistics.mean(times), "times_s": times, "bytes_on_wire": sent,
                      "received_bytes": received,
                      **({"link_retransmitted_bytes": tcp[1]} if tcp else {})})
      if rank == 0:
        print(f"{name} {method}: median step {results[-1]['step_time_sec']:.3f} s", flush=True)
  return link.finish("train_step_link", results, args.json, steps=args.steps, overrides=args.set,
                     pipelined=args.pipelined, xla_flags=os.environ.get("XLA_FLAGS", ""),
                     load_average=os.getloadavg())  # the machine's, at the end


def _trace(run, args, path: str) -> None:
  """Every process runs ``--steps`` more steps (after 2 warm-up steps); rank 0 traces them into ``path``."""
  import jax  # pylint: disable=g-import-not-at-top
  tracing = jax.process_index() == 0
  if tracing:
    jax.profiler.start_trace(path)
  time_steps(run, args.steps, args.pipelined)
  if tracing:
    jax.profiler.stop_trace()


# The optimizer wrappers that exchange on one step in a period: the keyword argument of the period.
PERIODS = {"local_steps": "k", "diloco": "inner_steps"}


def period(compressor: str, kwargs: dict) -> int:
  """Steps per exchange of ``compressor`` with ``kwargs``: a wrapper's ``k`` or ``H``, else 1."""
  if compressor not in PERIODS:
    return 1
  from jaxcomp import compressors  # pylint: disable=g-import-not-at-top
  key = PERIODS[compressor]
  return int(kwargs.get(key, inspect.signature(compressors.WRAPPERS[compressor]).parameters[key].default))


@functools.lru_cache(maxsize=None)
def wire_bytes(name: str, method: str, processes: int, overrides: tuple = ()) -> float:
  """Bytes one worker hands to collectives in a step of this config and method.

  ``jaxcomp.metrics``' ``bytes_on_wire`` after one update over ``processes``
  workers under ``jax.eval_shape``: exact, and nothing is computed (every
  payload's size is known while tracing; variable-length encodings' exact
  sizes are ``encoded_bytes``, not counted here). An int.

  The wrappers that exchange once in a period (:data:`PERIODS`: ``local_steps``' ``k``,
  DiLoCo's ``H``) send nothing on their other steps, so their count is known only when the
  step runs: two periods of updates run (zero gradients, jitted) and the mean over the second's
  steps is returned, as the zoo's bytes column averages over a run: the exchanging steps' bytes
  over the period's length (a float where it does not divide). The second, because Streaming
  DiLoCo's fragments (``fragments``, ``delay``) exchange on several steps of a period, and a
  delayed fragment's first outer step may fall in the next one.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jaxcomp  # pylint: disable=g-import-not-at-top
  from experiments import build  # pylint: disable=g-import-not-at-top
  from experiments import optimizers  # pylint: disable=g-import-not-at-top
  from jaxcomp import data as data_lib  # pylint: disable=g-import-not-at-top
  from jaxcomp import models  # pylint: disable=g-import-not-at-top
  from jaxcomp import parallel  # pylint: disable=g-import-not-at-top
  c = _config(name, method, processes, overrides)
  spec = data_lib.get_spec(c.dataset)
  shape, dtype = build.model_input(c, spec)
  model = models.get_model(c.model, spec.num_classes, **c.model_kwargs.to_dict())
  key = jax.random.PRNGKey(0)
  params = jax.eval_shape(lambda: model.init({"params": key, "dropout": key}, jnp.zeros((1,) + shape, dtype),
                                             train=False))["params"]
  grads = jax.tree.map(lambda p: jax.ShapeDtypeStruct((processes,) + p.shape, p.dtype), params)
  tx = optimizers.make_tx(c, "w")

  def init(params):
    return parallel.replicate_workers(tx.init(params), processes)

  def update(params, grads, state):
    axes = parallel.worker_axes(state)
    return jax.vmap(lambda g, s: tx.update(g, s, params), in_axes=(0, axes), out_axes=(None, axes),
                    axis_name="w")(grads, state)[1]

  n = period(c.compressor, c.compressor_kwargs.to_dict())
  if n == 1:
    return int(jax.eval_shape(lambda p, g: jaxcomp.metrics(update(p, g, init(p)))["bytes_on_wire"], params, grads))
  zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
  params, grads = zeros(params), zeros(grads)
  state, step = init(params), jax.jit(lambda g, s: update(params, g, s))
  sent = []
  for _ in range(2 * n):
    state = step(grads, state)
    sent.append(int(jaxcomp.metrics(state)["bytes_on_wire"]))
  if not any(sent[n:]) or sent[n:] != sent[:n] and "delay" not in c.compressor_kwargs:
    raise ValueError(f"{method}: expected a period of {n} steps with an exchange, repeated; bytes per step {sent}")
  return sum(sent[n:]) / n


def report(paths) -> int:
  """Markdown: one row per (config, method) with the speedup at every (P, link), then every result."""
  docs = []
  for path in paths:
    with open(path) as f:
      docs.append(json.load(f))
  rows = []  # (P, link, config, method, step s, speedup, bytes, wire ratio)
  for doc in docs:
    p, over = doc["processes"], tuple(doc.get("overrides", ()))
    base = {r["config"]: r for r in doc["results"] if r["method"] == "none"}
    for r in doc["results"]:
      nbytes, none = _sent(r, p, over), base.get(r["config"])
      rows.append((p, doc["link"], r["config"], r["method"], r["step_time_sec"],
                   None if none is None else none["step_time_sec"] / r["step_time_sec"],
                   nbytes, (_sent(none, p, over) if none else wire_bytes(r["config"], "none", p, over)) / nbytes))
  _print_pivot(rows)
  print()
  print("| processes | link | config | method | step s | step speedup | bytes / worker / step "
        "| wire ratio | speedup / wire ratio |")
  print("|---:|---|---|---|---:|---:|---:|---:|---:|")
  for p, link, config, method, t, speedup, nbytes, ratio in rows:
    eff = "" if speedup is None or method == "none" else f"{speedup / ratio:.2f}"
    print(f"| {p} | {link} | {config} | `{method}` | {t:.3f} | "
          f"{'' if speedup is None else f'{speedup:.2f}'} | {nbytes:,} | {ratio:.1f} | {eff} |")
  _print_steps(docs)
  return 0


def _print_steps(docs) -> None:
  """Where a document has each step's bytes: its silent and exchanging steps apart, and the time
  the exchanging ones took beyond a silent step, summed over the timed steps."""
  rows = [(doc, r) for doc in docs for r in doc["results"]
          if isinstance(r.get("bytes_on_wire"), list) and not all(r["bytes_on_wire"])]  # some step silent
  if not rows:
    return
  print()
  print("| processes | link | config | method | steps, XLA flags | mean step ms | silent step ms (median) "
        "| exchanging step ms (median, count) | exchanging beyond silent, ms in all | load average |")
  print("|---:|---|---|---|---|---:|---:|---:|---:|---|")
  for doc, r in rows:
    busy = [t for t, b in zip(r["times_s"], r["bytes_on_wire"]) if b]
    silent = statistics.median(t for t, b in zip(r["times_s"], r["bytes_on_wire"]) if not b)
    load = " / ".join(f"{v:.1f}" for v in doc.get("load_average", ()))
    flags = [f for f in doc.get("xla_flags", "").split() if "device_count" not in f]  # beyond the launcher's own
    print(f"| {doc['processes']} | {doc['link']} | {r['config']} | `{r['method']}` | "
          f"{' '.join(['pipelined' if doc.get('pipelined') else 'waited'] + flags)} | "
          f"{1e3 * statistics.mean(r['times_s']):.1f} | "
          f"{1e3 * silent:.1f} | {1e3 * statistics.median(busy) if busy else 0:.1f} ({len(busy)}) | "
          f"{1e3 * (sum(busy) - len(busy) * silent):.0f} | {load} |")


def _sent(result: dict, processes: int, overrides: tuple) -> float:
  """Bytes a worker sent in a step of ``result``: the transport's count of the run, else (a document
  from before it was kept) :func:`wire_bytes`."""
  if "bytes_on_wire" in result:  # each timed step's (a list), or one step's
    sent = result["bytes_on_wire"]
    return statistics.mean(sent) if isinstance(sent, list) else sent
  return wire_bytes(result["config"], result["method"], processes, overrides)


def _print_pivot(rows) -> None:
  """Float's step time and each method's step speedup, a column per (P, link)."""
  columns = link.pivot_columns(rows)
  cell = {(r[0], r[1], r[2], r[3]): r for r in rows}
  keys = list(dict.fromkeys((r[2], r[3]) for r in rows))
  print("| config | method | wire ratio | " + " | ".join(f"P={p}, {l}" for p, l in columns) + " |")
  print("|---|---|---:|" + "---:|" * len(columns))
  for config, method in keys:
    ratios = sorted({f"{r[7]:.1f}" for r in rows if (r[2], r[3]) == (config, method)}, key=float)
    cells = []
    for p, l in columns:
      r = cell.get((p, l, config, method))
      cells.append("" if r is None else f"{r[4]:.3f} s" if method == "none"
                   else "" if r[5] is None else f"{r[5]:.2f}×")
    print(f"| {config} | `{method}` | {'–'.join(ratios)} | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = _parse(argv)
  if args.report:
    return report(args.report)
  return worker(args) if args.worker else link.launch_self(args, argv, "benchmarks.train_step_link")


if __name__ == "__main__":
  sys.exit(main())
