r"""Exchange time over emulated links: one jitted ``shard_map``'d ``tx.update`` at P processes.

Every process (one CPU device each) holds one worker's gradient, a float32
vector of ``--n`` values or, with ``--models``, a tree of the shapes of a
model's parameters (normal values, seeded by rank), and calls the jitted
exchange ``tx.update`` of each method: quantize, the collective across the
processes (gloo over TCP), decode, average, residual update. With
``--link RATE`` the processes run in their own network namespaces joined by
links shaped to RATE (``experiments.launch``), so the collective's bytes cross
a real, rate-limited network stack instead of shared memory.

Usage::

  sudo .venv/bin/python -m benchmarks.link --processes 2 --link 100mbit \
      --n 431000,8000000 --methods none,terngrad,threelc:sparsity=1.75:capacity=0.5 \
      --trials 5 [--json out.json]
  sudo .venv/bin/python -m benchmarks.link --processes 2 --link 100mbit \
      --models resnet110 --methods none,terngrad,terngrad:bucket_bytes=0
  .venv/bin/python -m benchmarks.link --report out1.json out2.json ... [--plot link.png]

A method is a registry name with optional ``:key=value`` arguments for its
factory (``terngrad:exchange=two_phase``; values are Python literals or
strings). ``--report`` turns documents into one Markdown table (time, bytes
on the wire, speedup over float ``none`` at the same size, and that speedup
divided by the wire ratio) and, with ``--plot``, a figure.

Without ``--link`` the processes talk over loopback (no root needed). The
command re-runs itself under ``experiments.launch``; rank 0 prints one JSON
document: per method the median and minimum of ``--trials`` timed calls (after
``--warmup`` untimed ones, the first of which compiles),
``bytes_on_wire`` per worker per step (``jaxcomp.metrics``) and the
collectives in the compiled step (all-gathers, all-reduces, all-to-alls and
the rest, branches of a ``lax.cond`` included).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from typing import NamedTuple, Optional

# Re-exported: the other benchmarks and the tests read results through this module too.
from experiments.link_results import (  # noqa: F401
    bench_compressor, method_spec, modelled_seconds, rate_bits_per_second, table_rows)


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m benchmarks.link", description=__doc__.split("\n")[0])
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--devices", type=int, default=1,
                 help="CPU devices per process (a host of several accelerators): the mesh is "
                      "(processes, devices) with axes (\"d\", \"local\"); a method exchanges over both "
                      "(flat: every device a worker) unless it says within=local (hierarchical: a "
                      "float mean within the process, compressed between processes)")
  p.add_argument("--link", default=None, help="RATE[,DELAY] for experiments.launch --link")
  p.add_argument("--heartbeat-timeout", type=int, default=None, metavar="S",
                 help="for experiments.launch (its default: 30 s); 8 processes on 2 cores compiling a "
                      "large model may need more")
  p.add_argument("--n", type=_sizes, default=None,
                 help="float32 values per worker (default 8,000,000); a comma-separated list runs "
                      "each size; with --report, only these sizes are shown")
  p.add_argument("--models", default=None,
                 help="comma-separated jaxcomp.models names: exchange a gradient tree of each "
                      "model's parameter shapes instead of --n flat values")
  p.add_argument("--methods", default="none,terngrad,threelc",
                 help="comma-separated jaxcomp compressor names (none: float pmean)")
  p.add_argument("--trials", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--json", default=None, help="also write the document here (rank 0)")
  p.add_argument("--profile", default=None, metavar="DIR",
                 help="after timing, rank 0 traces 3 more calls of each method into DIR/<method> "
                      "(jax.profiler: open in TensorBoard or Perfetto)")
  p.add_argument("--report", nargs="+", default=None, metavar="JSON",
                 help="render these documents as a Markdown table instead of measuring")
  p.add_argument("--plot", default=None, help="with --report: also draw the speedups here (PNG)")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.report:
    return args
  if args.models and args.n:
    p.error("--n and --models exclude each other")
  args.models = args.models.split(",") if args.models else []
  if not args.models:
    args.n = args.n or [8_000_000]
  for method in args.methods.split(","):
    try:
      name, _ = method_spec(method)
    except ValueError as e:
      p.error(str(e))
    if name not in _registry():
      p.error(f"{name!r} wraps the optimizer; it has no exchange of its own to time here "
              "(time its training steps with benchmarks.train_step_link)")
  if (args.n and min(args.n) < 1) or min(args.trials, args.warmup, args.processes, args.devices) < 1:
    p.error("--n, --trials, --warmup (it compiles), --processes and --devices must be at least 1")
  return args


def _sizes(text: str) -> list[int]:
  try:
    return [int(float(v)) for v in text.split(",")]
  except ValueError:
    raise argparse.ArgumentTypeError(f"--n: comma-separated integers expected, got {text!r}") from None


def _registry():
  from jaxcomp import compressors  # pylint: disable=g-import-not-at-top
  return compressors.REGISTRY




def launch_self(args, argv, module: str = "benchmarks.link") -> int:
  """Parent mode: runs ``module --worker`` under experiments.launch, ``--devices`` CPU devices per process."""
  from experiments import launch  # pylint: disable=g-import-not-at-top
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +  # the user's flags kept, e.g. a scheduler's
                             f" --xla_force_host_platform_device_count={getattr(args, 'devices', 1)}").strip()
  own = ["--processes", str(args.processes)] + (["--link", args.link] if args.link else [])
  own += ["--heartbeat-timeout", str(args.heartbeat_timeout)] if getattr(args, "heartbeat_timeout", None) else []
  return launch.main(own + ["--", "-m", module, "--worker"] + list(argv))


def model_shapes(name: str) -> dict:
  """The parameter tree of model ``name`` as ``ShapeDtypeStruct`` s (``jax.eval_shape``: no memory)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxcomp import models  # pylint: disable=g-import-not-at-top
  model = models.get_model(name, num_classes=1000 if name in ("alexnet", "googlenet") else 10)
  x = jax.ShapeDtypeStruct((1,) + models.input_shape(name), jnp.float32)
  return jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x), x)["params"]


def _workload(n, mesh, rank):
  """``(label, shapes, g)``: a flat vector of ``n`` values, or a model's gradient tree (``n`` a name)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  shapes = model_shapes(n) if isinstance(n, str) else {"g": jax.ShapeDtypeStruct((n,), np.float32)}
  rng = np.random.default_rng(rank)
  local = jax.local_device_count()
  g = jax.tree.map(lambda s: jax.make_array_from_process_local_data(
      NamedSharding(mesh, P(mesh.axis_names)), rng.standard_normal((local,) + s.shape, dtype=np.float32)),
      shapes)
  return shapes, g


def collectives(compiled_text: str) -> dict:
  """Collective ops in a compiled program's HLO text, by kind (``-start`` forms counted once)."""
  counts = {}
  # A combined collective returns a tuple, "(f32[22]{0}, /*index=5*/f32[24]{0}, ...)".
  for kind in re.findall(r"= (?:\([^()]*\)|\S+) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
                         r"(?:-start)?\(", compiled_text):
    counts[kind] = counts.get(kind, 0) + 1
  return counts


def _build(method, shapes, mesh):
  """``(step, state)``: the jitted exchange of ``method`` over the mesh and its initial state."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  import jaxcomp  # pylint: disable=g-import-not-at-top
  from jaxcomp import parallel  # pylint: disable=g-import-not-at-top

  workers = mesh.devices.size
  axes = tuple(mesh.axis_names)
  name, kwargs = method_spec(method)
  # Flat: every device a worker of the compressed exchange. With within=, the processes are.
  axis_name = "d" if "within" in kwargs else axes
  tx = jaxcomp.get_transform(name, axis_name=axis_name, **kwargs)
  state = parallel.replicate_workers(tx.init(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)), workers)
  specs = parallel.worker_specs(state, axes)

  def per_device(g, s):  # one worker per device: drop its worker axis of size 1, then restore it
    upd, s2 = tx.update(jax.tree.map(lambda a: a[0], g), parallel.worker_slice(s, 0))
    m = jaxcomp.metrics(s2)  # this device's, per step, exact
    counts = {k: jnp.stack([m[k].traced().hi, m[k].traced().lo])[None] for k in COUNTS if k in m}
    return parallel.expand_workers(s2), counts, upd

  # The state is donated, as a training step donates it, and comes first among the outputs: a donated
  # buffer goes to the first output of its size, so each old residual's buffer takes the new residual,
  # as in a train step. (Returned after the updates, the residuals' buffers went to the updates of
  # their shapes, and XLA copied all 329 of ResNet-110's residuals before anything else could run:
  # 1.4 ms at the start of a 3LC step.)
  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(axes), specs),
                               out_specs=(specs, P(axes), P())), donate_argnums=(1,))
  state = jax.tree.map(
      lambda a, sp: jax.make_array_from_callback(a.shape, jax.sharding.NamedSharding(mesh, sp),
                                                 lambda idx: a[idx]), state, specs)
  return step, state


# The exchange's own counts recorded per method (``jaxcomp.metrics``): what a worker hands to the
# collectives, what stays in the process (hierarchical), and, with a routed exchange, what it receives
# (the plan's count that the link's measured bytes are held against).
COUNTS = ("bytes_on_wire", "local_bytes", "received_bytes")


def _words_to_int(words) -> int:
  """The exact count from a Count's (hi, lo) uint32 words."""
  hi, lo = (int(w) for w in words)
  return hi * 2**32 + lo


def read_counts(wire) -> dict[str, int]:
  """The exact :data:`COUNTS` of this process's first device from a step's ``wire`` output."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return {k: _words_to_int(np.asarray(v.addressable_data(0))[0]) for k, v in wire.items()}


@contextlib.contextmanager
def _one_compile_at_a_time():
  """Holds a lock file shared by this host's processes, so that they compile one after another.

  Compiling is not timed, and every process of a launch compiles the same program: at once, their
  compilers' working memory adds up (eight processes compiling ResNet-110's two-phase QSGD step,
  about 3 GB each at its peak, filled this 24 GiB host). One at a time, the peak is one compiler's
  working memory over what the compiled programs keep.
  """
  import fcntl  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  with open(os.path.join(tempfile.gettempdir(), "jaxcomp-benchmark-compile.lock"), "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _time_method(method, n, shapes, mesh, g, args) -> dict:
  """One method on one workload: ``--warmup`` untimed calls, then ``--trials`` timed ones."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  step, state = _build(method, shapes, mesh)
  with _one_compile_at_a_time():
    step = step.lower(g, state).compile()  # the calls below run this executable
  ops = collectives(step.as_text())
  for _ in range(args.warmup):
    state, wire, upd = step(g, state)
    jax.block_until_ready(upd)
  times = []
  sent, tcp = link_tx_bytes(), tcp_counters()
  for _ in range(args.trials):
    t0 = time.perf_counter()
    state, wire, upd = step(g, state)
    jax.block_until_ready(upd)
    times.append(time.perf_counter() - t0)
  sent = None if sent is None else (link_tx_bytes() - sent) // args.trials
  tcp = None if tcp is None else [(b - a) // args.trials for a, b in zip(tcp, tcp_counters())]
  if args.profile:  # every rank takes part in the calls; rank 0 traces them
    tracing = jax.process_index() == 0
    if tracing:
      jax.profiler.start_trace(os.path.join(args.profile, method.replace(":", "_").replace("=", "-")))
    for _ in range(3):
      state, wire, upd = step(g, state)
      jax.block_until_ready(upd)
    if tracing:
      jax.profiler.stop_trace()
  size = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))
  counts = read_counts(wire)
  if jax.local_device_count() > 1:  # what this process's devices hand to collectives between processes
    counts["process_bytes_on_wire"] = counts["bytes_on_wire"] * jax.local_device_count()
  if sent is not None:
    counts["link_tx_bytes"] = sent
  if tcp is not None:
    counts["tcp_payload_bytes"], counts["link_retransmitted_bytes"] = tcp[0] - tcp[1], tcp[1]
  return {"method": method, "n": size, **({"model": n} if isinstance(n, str) else {}),
          "tensors": len(jax.tree.leaves(shapes)), "median_s": statistics.median(times),
          "min_s": min(times), "times_s": times, "collectives": ops, **counts}


def link_tx_bytes():
  """Bytes this process's network namespace has sent over its links (``/proc/self/net/dev``, all
  interfaces but loopback: IP, TCP and gloo's framing included), or ``None`` on an unshaped run."""
  if not os.environ.get("JAXCOMP_LINK"):
    return None
  total = 0
  with open("/proc/self/net/dev") as f:
    for line in f.readlines()[2:]:
      name, fields = line.split(":", 1)
      if name.strip() != "lo":
        total += int(fields.split()[8])  # transmit bytes
  return total


def tcp_counters():
  """``(sent, retransmitted)``: TCP payload bytes this process has handed its links, and of them the
  ones sent again (``ss -ti``'s ``bytes_sent`` and ``bytes_retrans`` over its connections, whose
  counters live as long as they do: gloo keeps its own for the whole run), or ``None`` on an unshaped
  run or without ``ss``.

  On a shaped link a burst that overflows a receiver's queue (several workers sending to one at
  once) is dropped there after it left the sender, so ``link_tx_bytes`` counts it twice: what the
  exchange sent through its sockets is ``sent`` less ``retransmitted`` (gloo's framing included;
  the IP and TCP headers, and the acknowledgements of what this process received, not).
  """
  import subprocess  # pylint: disable=g-import-not-at-top
  if not os.environ.get("JAXCOMP_LINK"):
    return None
  try:
    out = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return None
  count = lambda field: sum(int(v) for v in re.findall(rf"\b{field}:(\d+)", out))
  return count("bytes_sent"), count("bytes_retrans")


def _latency(mesh, calls: int = 30) -> float:
  """α: the median time of a jitted all-reduce of one float32 across the processes."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=mesh, in_specs=P("d"),
                            out_specs=P()))
  x = jax.device_put(jnp.ones((mesh.devices.size,), jnp.float32), NamedSharding(mesh, P("d")))
  jax.block_until_ready(f(x))
  times = []
  for _ in range(calls):
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _mesh(devices: int):
  """``("d",)`` over the processes' devices, or ``("d", "local")`` of (processes, ``devices``)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  if devices == 1:
    return jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  ordered = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  return jax.sharding.Mesh(np.array(ordered).reshape(jax.process_count(), devices), ("d", "local"))


def worker(args) -> int:
  """One process: time each method's exchange; rank 0 prints the JSON document."""
  from experiments import distributed  # pylint: disable=g-import-not-at-top
  if not distributed.initialize_from_env():
    raise SystemExit("benchmarks.link --worker runs under experiments.launch")
  import jax  # pylint: disable=g-import-not-at-top

  if jax.local_device_count() != args.devices:
    raise SystemExit(f"{args.devices} CPU devices per process expected, got {jax.local_device_count()} "
                     "(XLA_FLAGS)")
  rank = jax.process_index()
  mesh = _mesh(args.devices)
  latency = _latency(mesh)
  results = []
  for n in args.models or args.n:
    shapes, g = _workload(n, mesh, rank)
    for method in args.methods.split(","):
      results.append(_time_method(method, n, shapes, mesh, g, args))
      if rank == 0:
        r = results[-1]
        print(f"{n if isinstance(n, str) else f'n={n:,}'} {method}: median {r['median_s']:.3f} s "
              f"over {args.trials} calls, {r['bytes_on_wire']:,} bytes on the wire per worker, "
              f"collectives {r['collectives']}", flush=True)
  return finish("link", results, args.json, latency_s=latency, trials=args.trials, warmup=args.warmup)


def finish(benchmark: str, results: list, json_path, **fields) -> int:
  """Rank 0 prints (and with ``json_path`` writes) the JSON document; every process shuts down."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    doc = {"benchmark": benchmark, "processes": jax.process_count(),
           "link": os.environ.get("JAXCOMP_LINK", "loopback (not shaped)"), **fields,
           "jax": jax.__version__, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
           "results": results}
    text = json.dumps(doc, indent=1)
    print(text, flush=True)
    if json_path:
      with open(json_path, "w") as f:
        f.write(text + "\n")
  jax.distributed.shutdown()
  return 0








class ModelRow(NamedTuple):
  """One method on one whole model in one document, against float ``none`` of the same."""
  processes: int
  link: str
  model: str
  tensors: int
  method: str
  median_s: float
  collectives: int
  bytes_on_wire: int
  speedup: Optional[float]
  wire_ratio: Optional[float]  # float's bytes over the all-gather payload's (the target's measure)
  bound: Optional[float]  # float's bytes over the method's, both as measured leaving a worker's link
  link_over_plan: Optional[float]  # the link's bytes less retransmissions ÷ the plan's received_bytes (routed)
  tcp_over_plan: Optional[float]  # what its sockets sent once (TCP payload) ÷ the plan's received_bytes


def _payload_key(method: str):
  """What a method's all-gather payload depends on: its compressor and arguments, less the route and
  the bucketing (``exchange``, ``bucket_bytes``), which change how it travels, not what it is."""
  name, kwargs = method_spec(method)
  return name, tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in ("exchange", "bucket_bytes")))


def model_rows(docs) -> list[ModelRow]:
  """Whole-model results, speedups over the float ``none`` of the same model and document.

  A routed method (``exchange="two_phase"``/``"auto"``) is held against the all-gather payload of
  the same model, compressor and arguments in any of ``docs`` (its wire ratio: none without one).
  A document without a float run is held against the first of ``docs`` with one at the same
  processes, link and model (a method timed alone, in a launch of its own).
  """
  gathered = lambda r: r["method"] == "none" or method_spec(r["method"])[1].get("exchange", "all_gather") == "all_gather"
  payload = {(r["model"], _payload_key(r["method"])): r["bytes_on_wire"]
             for doc in docs for r in doc["results"] if "model" in r and gathered(r)}
  floats = {(doc["processes"], doc["link"], r["model"]): r  # for a document without its own float run
            for doc in reversed(docs) for r in doc["results"] if "model" in r and r["method"] == "none"}
  rows = []
  for doc in docs:
    by_model = {}
    for r in doc["results"]:
      if "model" in r:
        by_model.setdefault(r["model"], []).append(r)
    for model, results in by_model.items():
      base = next((r for r in results if r["method"] == "none"), floats.get((doc["processes"], doc["link"], model)))
      for r in results:
        wire = r["bytes_on_wire"] if gathered(r) else payload.get((model, _payload_key(r["method"])))
        sent = (base or {}).get("link_tx_bytes"), r.get("link_tx_bytes")
        rows.append(ModelRow(
            doc["processes"], doc["link"], model, r["tensors"], r["method"], r["median_s"],
            sum(r["collectives"].values()), r["bytes_on_wire"],
            base["median_s"] / r["median_s"] if base else None,
            base["bytes_on_wire"] / wire if base and wire else None,
            sent[0] / sent[1] if all(sent) else None,
            _link_over_plan(r), _over_plan(r, r.get("tcp_payload_bytes"))))
  return rows


def _over_plan(r, sent) -> Optional[float]:
  """``sent`` bytes ÷ the plan's ``received_bytes`` (``None`` without both: not a routed exchange)."""
  plan = r.get("received_bytes")
  return sent / plan if sent and plan else None


def _link_over_plan(r) -> Optional[float]:
  """What a routed exchange sent over its link, TCP's retransmissions taken out, ÷ the plan's
  ``received_bytes``: headers and acknowledgements included."""
  sent = r.get("link_tx_bytes")
  return _over_plan(r, sent and sent - r.get("link_retransmitted_bytes", 0))


def _model_table(rows) -> None:
  fmt = lambda v, spec: "" if v is None else format(v, spec)
  print("| processes | link | model (tensors) | method | median s | collectives | bytes on the wire "
        "| speedup | wire ratio | speedup / wire ratio |")
  print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    eff = r.speedup / r.wire_ratio if r.speedup is not None and r.wire_ratio and r.method != "none" else None
    print(f"| {r.processes} | {r.link} | {r.model} ({r.tensors}) | `{r.method}` | {r.median_s:.3f} | "
          f"{r.collectives} | {r.bytes_on_wire:,} | {fmt(r.speedup, '.2f')} | {fmt(r.wire_ratio, '.1f')} | "
          f"{fmt(eff, '.2f')} |")


def pivot_columns(rows) -> list[tuple[int, str]]:
  """The (processes, link) pairs of ``rows`` (each row starts with them), as a pivot table's columns:
  by processes, then link rate; an unshaped link (loopback) last."""
  return sorted({(r[0], r[1]) for r in rows}, key=lambda c: (c[0], rate_bits_per_second(c[1]) or math.inf))


def _pivot(rows, header: str, cell) -> None:
  """A row per (model, method), smallest model first, and ``cell(row)`` ( ``|``-joined columns) per
  (processes, link) column."""
  columns = pivot_columns(rows)
  at = {(r.processes, r.link, r.model, r.method): r for r in rows}
  size = {r.model: r.bytes_on_wire for r in rows if r.method == "none"}
  keys = list(dict.fromkeys((r.model, r.tensors, r.method) for r in rows))
  keys.sort(key=lambda k: size.get(k[0], math.inf))  # stable: each model's methods keep their order
  width = header.count("|") + 1
  print("| model (tensors) | method | " + " | ".join(f"P = {p}, {l}: {header}" for p, l in columns) + " |")
  print("|---|---|" + "---:|" * width * len(columns))
  for model, tensors, method in keys:
    cells = [cell(at[p, l, model, method]) if (p, l, model, method) in at else " | ".join([""] * width)
             for p, l in columns]
    print(f"| {model} ({tensors}) | `{method}` | " + " | ".join(cells) + " |")


def _model_pivot(rows) -> None:
  """Seconds, and each method's speedup ÷ its bound and ÷ the wire ratio, a row per (model, method)
  and three columns per (processes, link): the grid of whole models at a glance."""
  fmt = lambda v: "" if v is None else f"{v:.2f}"
  _pivot(rows, "s | ÷ bound | ÷ wire", lambda r: f"{r.median_s:.3f} | | " if r.method == "none" else
         f"{r.median_s:.3f} | {fmt(r.speedup / r.bound if r.bound else None)} | "
         f"{fmt(r.speedup / r.wire_ratio if r.wire_ratio else None)}")


def _bytes_pivot(rows) -> None:
  """Routed exchanges: the bytes that left a worker's link, and that its sockets sent once (TCP's
  payload, where recorded), ÷ the plan's ``received_bytes``."""
  fmt = lambda v: "" if v is None else f"{v:.3f}"
  routed = [r for r in rows if r.link_over_plan is not None]
  if routed:
    _pivot(routed, "link ÷ plan | TCP ÷ plan", lambda r: f"{r.link_over_plan:.3f} | {fmt(r.tcp_over_plan)}")


def hosts_rows(doc):
  """Flat against hierarchical (``X`` and ``X:within=local``) in a ``--devices`` document: rows
  ``(method, flat s, hierarchical s, flat ÷ hierarchical, (flat, hierarchical) bytes a process hands to
  collectives between processes, (flat, hierarchical) bytes its link carried, measured)``."""
  by_method = {r["method"]: r for r in doc["results"]}
  rows = []
  for method, flat in by_method.items():
    hier = by_method.get(f"{method}:within=local")
    if ":within=" in method or hier is None:
      continue
    rows.append((method, flat["median_s"], hier["median_s"], flat["median_s"] / hier["median_s"],
                 (flat["process_bytes_on_wire"], hier["process_bytes_on_wire"]),
                 (flat.get("link_tx_bytes"), hier.get("link_tx_bytes"))))
  return rows


def _hosts_table(doc) -> None:
  devices = len(doc["results"]) and doc["results"][0]["process_bytes_on_wire"] // doc["results"][0]["bytes_on_wire"]
  print(f"{doc['processes']} processes x {devices} devices, {doc['link']}, "
        f"{doc['results'][0].get('model', '')}: flat (every device a worker) against `within=local`")
  print()
  print("| method | flat s | hierarchical s | flat ÷ hierarchical | bytes a process hands over: flat | "
        "hierarchical | ratio | bytes its link carried: flat | hierarchical | ratio |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for method, tf, th, speed, (bf, bh), (lf, lh) in hosts_rows(doc):
    measured = f"{lf:,} | {lh:,} | {lf / lh:.2f}" if lf and lh else " |  | "
    print(f"| `{method}` | {tf:.3f} | {th:.3f} | {speed:.2f} | {bf:,} | {bh:,} | {bf / bh:.2f} | {measured} |")


def report(paths, plot=None, sizes=None) -> int:
  """Prints the documents at ``paths`` as one Markdown table (only ``sizes``, if given); with
  ``plot``, draws the speedups of every size."""
  docs = []
  for path in paths:
    with open(path) as f:
      docs.append(json.load(f))
  hosts = [doc for doc in docs if any("process_bytes_on_wire" in r for r in doc["results"])]
  docs = [doc for doc in docs if doc not in hosts]
  for doc in hosts:
    _hosts_table(doc)
    print()
  models = model_rows(docs)
  if models:
    _model_pivot(models)
    print()
    _bytes_pivot(models)
    print()
    _model_table(models)
    print()
  every = table_rows(docs)
  if not every:
    if plot:
      _plot([(r.processes, r.link, f"{r.model} ({r.tensors})", r.method, r.median_s, r.bytes_on_wire, r.speedup,
              r.wire_ratio, None) for r in models], plot)
    return 0
  rows = [r for r in every if not sizes or r[2] in sizes]
  fmt = lambda v, spec: "" if v is None else format(v, spec)
  print("| processes | link | n | method | median s | bytes on the wire | speedup | wire ratio "
        "| speedup / wire ratio | modelled s | measured / modelled |")
  print("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
  for p, link, n, method, t, b, sp, ratio, model in rows:
    eff = sp / ratio if sp is not None and method != "none" else None
    print(f"| {p} | {link} | {n:,} | `{method}` | {t:.3f} | {b:,} | {fmt(sp, '.2f')} | "
          f"{fmt(ratio, '.1f')} | {fmt(eff, '.2f')} | {fmt(model, '.3f')} | "
          f"{fmt(t / model if model else None, '.2f')} |")
  if plot:
    _plot(every, plot)
  return 0


def _plot(rows, path) -> None:
  """One panel per (processes, link): speedup over float per method, a bar per size, the wire ratio as a tick."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  panels = sorted({(r[0], r[1]) for r in rows if rate_bits_per_second(r[1])},  # shaped links only
                  key=lambda k: (k[0], rate_bits_per_second(k[1])))
  if not panels:
    return
  methods = [m for m in dict.fromkeys(r[3] for r in rows) if m != "none"]
  sizes = sorted({r[2] for r in rows})
  cols = min(3, len(panels))
  grid_rows = -(-len(panels) // cols)
  fig, axes = plt.subplots(grid_rows, cols, figsize=(5.2 * cols, 4.4 * grid_rows), sharey=True,
                           squeeze=False)
  width = 0.8 / len(sizes)
  for ax in axes.flat[len(panels):]:
    ax.set_visible(False)
  for ax, (p, link) in zip(axes.flat, panels):
    for j, n in enumerate(sizes):
      cell = {r[3]: r for r in rows if (r[0], r[1], r[2]) == (p, link, n) and r[6] is not None}
      xs = [i + (j - (len(sizes) - 1) / 2) * width for i, m in enumerate(methods) if m in cell]
      ax.bar(xs, [cell[m][6] for m in methods if m in cell], width, label=f"n = {n:,}" if isinstance(n, int) else str(n))
      ax.scatter(xs, [cell[m][7] for m in methods if m in cell], marker="_", color="k", s=80, zorder=3)
    ax.set_title(f"{p} processes, {link}")
    ax.set_xticks(range(len(methods)), [m.replace(":", "\n") for m in methods], rotation=60,
                  ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(axis="y", alpha=0.3)
  axes[0][0].set_ylabel("speedup over float pmean (tick: wire ratio)")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)




def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = _parse(argv)
  if args.report:
    return report(args.report, args.plot, args.n)
  return worker(args) if args.worker else launch_self(args, argv)


if __name__ == "__main__":
  sys.exit(main())
