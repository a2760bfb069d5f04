r"""Tests and measures jaxcomp on whatever accelerator JAX sees, in one command.

Written for a GPU machine lent for a few minutes, with no network, its own JAX and
no TensorFlow: it installs nothing, reads no dataset (the measurements run on
synthetic inputs: throughput only) and imports nothing that such a machine lacks
(``benchmarks/_absent.py`` makes those absent here too, so a CPU run fails where
a GPU run would). In order:

1. **tests**: the test files that carry the ``accelerator`` marker
   (``pyproject.toml``: no dataset, no second process or device, no package
   beyond the library's and pytest's), in a pytest subprocess on the default
   backend, failures listed by name;
2. **compressors**: every compressor's encode + decode against a jitted float32
   copy of the same tensor (``benchmarks.compressors``: the copy reads and
   writes every byte once, the memory bandwidth's bound), as ``vs copy``;
3. **exchange**: ResNet-110's whole bucketed update (``benchmarks.link``'s
   jitted ``shard_map``'d ``tx.update``) against float's ``pmean``, on the
   devices present;
4. **steps**: whole training steps with simulated workers of LeNet and a GPT
   at N = 8 and 64 (``vmap`` inside ``shard_map``, as ``experiments.step``),
   every compressor of ``benchmarks.step_time``'s LeNet groups against float,
   as ``/ float``.

Parts 2-4 run in this process, each method's calls interleaved with its
baseline's (rotated order, median of the per-repeat ratios: the ratios compare
calls made side by side). After each part ``DIR/accelerator.json`` and
``DIR/accelerator.md`` are written anew (device, JAX version, every command),
so a run cut short keeps what it measured. The tests get ``--tests-timeout``
seconds (240), the measurements ``--budget`` (240): a part or step group that
would start later is skipped and listed, so the whole stays near 8 minutes.
The exit status is 1 when a test failed.

Usage::

  python -m benchmarks.accelerator --out DIR [--parts tests,compressors,exchange,steps]
  python -m benchmarks.accelerator --out DIR --tiny   # a CPU test: toy sizes, tests collected only

``--tiny`` measures at tiny sizes and only collects the marked tests (their
imports with the refusals on); ``tests/test_benchmark_accelerator.py`` runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import Any, Callable

# The tests run in other processes on the same accelerator while this one may hold it: JAX
# would otherwise reserve most of a GPU's memory for the first process (GPU only).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks import _absent  # noqa: E402  (main() refuses the absent packages)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "accelerator"
PARTS = ("tests", "compressors", "exchange", "steps")
SYNTHETIC = "synthetic (Gaussian tensors, random images and tokens): throughput only"


@dataclasses.dataclass(frozen=True)
class Scale:
  """What one run measures: the full sizes for an accelerator, or tiny ones for a CPU test."""

  name: str
  sizes: tuple[int, ...]  # compressors: float32 elements of the tensor
  compressors: str  # comma-separated names ("": every one of benchmarks.compressors)
  repeats: int  # interleaved repeats of every measurement
  workers: tuple[int, ...]  # steps: simulated workers N
  step_methods: tuple[str, ...]  # steps: benchmarks.step_time.LENET_METHODS, float first
  steps_per_repeat: int
  lenet_batch: int  # steps: examples a step, over all workers
  gpt: dict  # steps: jaxcomp.models.GPT's fields (vocabulary 256: bytes)
  gpt_batch: int  # steps: sequences a step, over all workers
  exchange_model: str  # exchange: a jaxcomp.models name
  exchange_methods: tuple[str, ...]  # exchange: benchmarks.link methods, float ("none") first
  calls_per_repeat: int  # exchange
  collect_only: bool  # tests: collect the marked tests (imports) instead of running them


FULL = Scale(
    name="full", sizes=(64 * 2**20,), compressors="", repeats=7, workers=(8, 64),
    step_methods=("float", "terngrad", "threelc", "qsgd"), steps_per_repeat=10, lenet_batch=64,
    gpt={"context": 256, "width": 256, "depth": 4, "heads": 4}, gpt_batch=64,
    exchange_model="resnet110", exchange_methods=("none", "terngrad", "threelc"),
    calls_per_repeat=5, collect_only=False)
TINY = Scale(
    name="tiny", sizes=(2**16,), compressors="terngrad", repeats=2, workers=(2,),
    step_methods=("float", "terngrad"), steps_per_repeat=1, lenet_batch=4,
    gpt={"context": 8, "width": 16, "depth": 1, "heads": 2}, gpt_batch=4,
    exchange_model="lenet", exchange_methods=("none", "terngrad"), calls_per_repeat=1, collect_only=True)


def log(text: str) -> None:
  """Progress, with the time, on stderr (stdout stays for the tables)."""
  print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --- 1. tests -------------------------------------------------------------------------------


def marked_test_files(root: str = REPO) -> list[str]:
  """The files under ``tests/`` that use the marker, relative to ``root``.

  pytest imports every file it is given before ``-m`` deselects anything, so
  the subprocess gets only these: a file that imports TensorFlow is never
  imported at all.
  """
  paths = sorted(glob.glob(os.path.join(root, "tests", "test_*.py")))
  return [os.path.relpath(p, root) for p in paths if f"pytest.mark.{MARKER}" in _read(p)]


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def pytest_command(files: list[str], junit_xml: str, collect_only: bool, workers: int) -> list[str]:
  """The pytest command line: the marked tests of ``files``, the absent packages refused."""
  cmd = [sys.executable, "-m", "pytest", "-m", MARKER, "-p", "benchmarks._absent", "-p", "no:cacheprovider",
         "--junitxml", junit_xml]
  if collect_only:
    cmd.append("--collect-only")
  elif workers > 1 and importlib.util.find_spec("xdist") is not None:
    cmd += ["-n", str(workers), "--dist", "loadfile"]
  return cmd + list(files)


def _test_env() -> dict[str, str]:
  """The subprocess's environment: the backend this process would use, not tests/conftest.py's CPU.

  ``tests/conftest.py`` sets ``JAX_PLATFORMS=cpu`` unless the variable is set;
  set to the empty string it leaves JAX its default, the accelerator.
  """
  return dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", ""))


def _run(cmd: list[str], timeout_s: float, grace_s: float = 30.0) -> tuple[int | None, str]:
  """``(returncode, output)`` of ``cmd`` run in the repository; ``None`` if it ran past ``timeout_s``.

  Past it, its process group (pytest-xdist's workers too) gets SIGINT, as from
  a terminal: pytest stops and still writes its summary and JUnit XML of the
  tests that ran. Whatever outlives ``grace_s`` more is killed.
  """
  proc = subprocess.Popen(cmd, cwd=REPO, env=_test_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
  try:
    output, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, output
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGINT)
  try:
    output, _ = proc.communicate(timeout=grace_s)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    output, _ = proc.communicate()
  return None, output


def junit_summary(path: str) -> dict[str, Any]:
  """Counts and failed tests from pytest's JUnit XML (``{}`` when there is none)."""
  if not os.path.exists(path):
    return {}
  root = ET.parse(path).getroot()
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
  counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
  failed = []
  for case in root.iter("testcase"):
    for outcome in case:
      if outcome.tag in ("failure", "error"):
        message = (outcome.get("message") or outcome.text or "").strip().splitlines()
        failed.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome.tag,
                       "message": message[0][:300] if message else ""})
  return {"counts": counts, "failed": failed}


def summary_line(lines: list[str]) -> str:
  """pytest's closing line ("3 passed, 1 failed in 2.1s", "459/600 tests collected ... in 7.0s"), else the last."""
  closing = [ln.strip("= ") for ln in lines if re.search(r"\b(passed|failed|collected|errors?|no tests ran)\b.* in "
                                                          r"[\d.]+s", ln)]
  return (closing or lines or [""])[-1]


def collected_count(lines: list[str]) -> int:
  """Tests ``--collect-only`` listed: its ``FILE: N`` lines (``-qq``), else its ``FILE::TEST`` lines (``-q``)."""
  per_file = [int(m.group(1)) for ln in lines if (m := re.fullmatch(r"\S+\.py: (\d+)", ln.strip()))]
  return sum(per_file) if per_file else sum("::" in ln and not ln.startswith("ERROR") for ln in lines)


def run_tests(files: list[str], out: str, collect_only: bool, workers: int, timeout_s: float) -> dict[str, Any]:
  """Runs (or collects) the marked tests of ``files`` in a subprocess; its output goes to ``out/tests.log``."""
  junit_xml = os.path.join(out, "tests.xml")
  if os.path.exists(junit_xml):
    os.remove(junit_xml)
  cmd = pytest_command(files, junit_xml, collect_only, workers)
  log(f"tests: {'collecting' if collect_only else 'running'} the marked tests of {len(files)} files")
  t0 = time.perf_counter()
  returncode, output = _run(cmd, timeout_s)
  with open(os.path.join(out, "tests.log"), "w") as f:
    f.write(output)
  lines = [ln for ln in output.splitlines() if ln.strip()]
  result = {"command": shlex.join(["python"] + cmd[1:]), "files": files, "collect_only": collect_only,
            "returncode": returncode, "timed_out": returncode is None, "seconds": time.perf_counter() - t0,
            "summary": summary_line(lines), **junit_summary(junit_xml)}
  if collect_only:
    result["collected"] = collected_count(lines)
    if returncode == 0:
      result["summary"] = f"{result['collected']} tests collected"
  log(f"tests: {result['summary']}")
  return result


@dataclasses.dataclass
class Budget:
  """The seconds the measurements may take: what would start after them is skipped, and listed."""

  seconds: float
  start: float = dataclasses.field(default_factory=time.perf_counter)
  skipped: list = dataclasses.field(default_factory=list)

  def allows(self, what: str) -> bool:
    """Whether ``what`` may start; if not, it is listed in :attr:`skipped`."""
    if time.perf_counter() - self.start < self.seconds:
      return True
    self.skipped.append(what)
    log(f"{what}: skipped, the budget of {self.seconds:.0f} s is spent")
    return False


# --- timing side by side --------------------------------------------------------------------


def side_by_side(calls: dict[str, Callable[[], Any]], repeats: int, per_repeat: int = 1) -> dict[str, dict]:
  """Times every call, interleaved: per name, median seconds a call and median ratio to the first name.

  Each call runs twice untimed (the first compiles; ``first_call_s``). Then,
  ``repeats`` times, every call runs ``per_repeat`` times back to back, the
  names in an order rotated each repeat; a repeat's ratio divides a name's
  time by the first name's in the same repeat.
  """
  import jax  # pylint: disable=g-import-not-at-top
  names = list(calls)
  first = {}
  for name in names:
    t0 = time.perf_counter()
    jax.block_until_ready(calls[name]())
    first[name] = time.perf_counter() - t0
    jax.block_until_ready(calls[name]())
  times = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      t0 = time.perf_counter()
      for _ in range(per_repeat):
        result = calls[name]()
      jax.block_until_ready(result)
      times[name].append((time.perf_counter() - t0) / per_repeat)
  base = times[names[0]]
  return {name: {"median_s": statistics.median(t), "ratio": statistics.median(a / b for a, b in zip(t, base)),
                 "times_s": t, "first_call_s": first[name]} for name, t in times.items()}


# --- 2. compressors -------------------------------------------------------------------------


def bench_compressors(scale: Scale, budget: Budget) -> list[dict]:
  """``benchmarks.compressors``' rows, with the copy's bandwidth (bytes read and written a second)."""
  from benchmarks import compressors  # pylint: disable=g-import-not-at-top
  entries = compressors.compressors_by_name(scale.compressors)
  rows = []
  for size in scale.sizes:
    if budget.allows(f"compressors at n = {size}"):
      rows += compressors.measure(entries, [size], scale.repeats)
  for r in rows:
    r["copy_gb_per_s"] = 8 * r["size"] / r["copy_s"] / 1e9
  return rows


# --- 3. the whole update on the devices present ---------------------------------------------


class Exchange:
  """``benchmarks.link``'s jitted exchange of one method over a model's gradient, its state kept here."""

  def __init__(self, method: str, shapes: Any, mesh: Any, grads: Any):
    from benchmarks import link  # pylint: disable=g-import-not-at-top
    self.step, self.state = link._build(method, shapes, mesh)  # pylint: disable=protected-access
    self.grads = grads
    self.wire = None

  def __call__(self):
    self.state, self.wire, updates = self.step(self.grads, self.state)
    return updates

  def bytes_on_wire(self) -> int:
    """Bytes this worker handed to collectives in the last call (``jaxcomp.metrics``)."""
    from benchmarks import link  # pylint: disable=g-import-not-at-top
    return link.read_counts(self.wire)["bytes_on_wire"]


def bench_exchange(scale: Scale, budget: Budget) -> list[dict]:
  """The model's whole update by each method beside float's ``pmean``, over every device present.

  One measurement (its methods side by side): ``main`` asks the budget before it.
  """
  del budget
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from benchmarks import link  # pylint: disable=g-import-not-at-top
  mesh = link._mesh(1)  # pylint: disable=protected-access
  shapes, grads = link._workload(scale.exchange_model, mesh, 0)  # pylint: disable=protected-access
  log(f"exchange: {scale.exchange_model} over {mesh.devices.size} devices: {', '.join(scale.exchange_methods)}")
  calls = {method: Exchange(method, shapes, mesh, grads) for method in scale.exchange_methods}
  timed = side_by_side(calls, scale.repeats, scale.calls_per_repeat)
  leaves = jax.tree.leaves(shapes)
  return [{"model": scale.exchange_model, "tensors": len(leaves), "n": int(sum(np.prod(s.shape) for s in leaves)),
           "devices": mesh.devices.size, "method": method, "update_s": t.pop("median_s"),
           "ratio_to_float": t.pop("ratio"), "bytes_on_wire": calls[method].bytes_on_wire(), **t}
          for method, t in timed.items()]


# --- 4. training steps with simulated workers -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepModel:
  """A model of the step part: its name, fields, inputs and optimizer."""

  name: str  # jaxcomp.models name
  fields: dict
  num_classes: int
  input_shape: tuple[int, ...]
  tokens: bool  # integer tokens in, a label per position; else images and a label each
  batch: int  # examples a step, over all workers
  optimizer: Callable[[], Any]  # () -> optax transform after the exchange


def step_models(scale: Scale) -> list[StepModel]:
  """TG-F3's LeNet (momentum SGD, 0.01) and a byte-level GPT (AdamW) at ``scale``'s sizes."""
  import optax  # pylint: disable=g-import-not-at-top
  return [
      StepModel("lenet", {}, 10, (28, 28, 1), False, scale.lenet_batch, lambda: optax.sgd(0.01, momentum=0.9)),
      StepModel("gpt", dict(scale.gpt), 256, (scale.gpt["context"],), True, scale.gpt_batch,
                lambda: optax.adamw(1e-3)),
  ]


def synthetic_batch(m: StepModel, workers: int, seed: int = 0):
  """``(inputs, labels)`` with a leading worker axis: ``batch / workers`` examples each."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  per = m.batch // workers
  if m.tokens:
    tokens = rng.integers(0, m.num_classes, (workers, per) + m.input_shape, dtype=np.int32)
    return tokens, np.roll(tokens, -1, axis=-1)
  images = rng.standard_normal((workers, per) + m.input_shape, dtype=np.float32)
  return images, rng.integers(0, m.num_classes, (workers, per), dtype=np.int32)


@dataclasses.dataclass(frozen=True)
class StepSetup:
  """What every method's step of one model at one N shares: the model, its parameters, the batch."""

  model: Any  # the Flax module
  params: Any  # initial parameters (each Stepper copies them: its step donates them)
  inputs: Any  # [workers, batch / workers, ...], laid over the mesh
  labels: Any
  optimizer: Callable[[], Any]
  workers: int
  mesh: Any


def step_setup(m: StepModel, workers: int, mesh: Any) -> StepSetup:
  """``m`` built and initialised once, and its synthetic batch split over ``mesh``."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxcomp import models  # pylint: disable=g-import-not-at-top
  model = models.get_model(m.name, num_classes=m.num_classes, **m.fields)
  batch = NamedSharding(mesh, P(mesh.axis_names))
  inputs, labels = (jax.device_put(a, batch) for a in synthetic_batch(m, workers))
  # One compiled program: run eagerly, the initialisation's every operation compiles alone.
  params = jax.jit(model.init)(jax.random.PRNGKey(0), inputs[0])["params"]
  return StepSetup(model, params, inputs, labels, m.optimizer, workers, mesh)


class Stepper:
  """One jitted training step of ``workers`` simulated workers, its state donated and kept here.

  Laid out as ``experiments.step`` lays a step out: the workers split over the
  mesh's devices, ``vmap`` over each device's share inside ``jax.shard_map``,
  the exchange over both axes (so, as in training, a compressor that encodes a
  bucket at once does).
  """

  AXIS = "workers"

  def __init__(self, setup: StepSetup, compressor: str, kwargs: dict):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import jaxcomp  # pylint: disable=g-import-not-at-top
    from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
    from jaxcomp import parallel  # pylint: disable=g-import-not-at-top
    mesh = setup.mesh
    self.model, self.inputs, self.labels = setup.model, setup.inputs, setup.labels
    # Replicated over the mesh, as the step returns them: else its second call compiles it again.
    self.params = jax.device_put(jax.tree.map(jnp.copy, setup.params), NamedSharding(mesh, P()))
    tx = jaxcomp.make_optimizer(compressor, setup.optimizer(), axis_name=tuple(mesh.axis_names) + (self.AXIS,),
                                **kwargs)
    state = parallel.replicate_workers(tx.init(self.params), setup.workers)
    self.state = jax.device_put(state, parallel.worker_shardings(state, mesh, mesh.axis_names))
    self.step = jax.jit(self._step_fn(tx, state, mesh), donate_argnums=(0, 1))

  def _step_fn(self, tx, state, mesh):
    """``step(params, state, inputs, labels) -> (params, state)`` over ``mesh``, before ``jit``."""
    import jax  # pylint: disable=g-import-not-at-top
    import optax  # pylint: disable=g-import-not-at-top
    from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
    from jaxcomp import parallel  # pylint: disable=g-import-not-at-top

    def loss(params, x, y):
      logits = self.model.apply({"params": params}, x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def worker(params, opt_state, x, y):
      updates, opt_state = tx.update(jax.grad(loss)(params, x, y), opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    axes, specs, batch = parallel.worker_axes(state), parallel.worker_specs(state, mesh.axis_names), P(mesh.axis_names)
    workers = jax.vmap(worker, in_axes=(None, axes, 0, 0), out_axes=(None, axes), axis_name=self.AXIS)
    # check_vma=False: collectives over the inner vmap axis (jaxcomp.parallel), as experiments.step.
    return jax.shard_map(workers, mesh=mesh, in_specs=(P(), specs, batch, batch), out_specs=(P(), specs),
                         check_vma=False)

  def __call__(self):
    self.params, self.state = self.step(self.params, self.state, self.inputs, self.labels)
    return self.params


def bench_steps(scale: Scale, budget: Budget) -> list[dict]:
  """Every model at every N: each method's step beside float's, one row each."""
  from benchmarks import link, step_time  # pylint: disable=g-import-not-at-top
  mesh = link._mesh(1)  # pylint: disable=protected-access
  rows = []
  for m in step_models(scale):
    for workers in scale.workers:
      if not budget.allows(f"steps of {m.name} at N = {workers}"):
        continue
      log(f"steps: {m.name}, N = {workers}: building {', '.join(scale.step_methods)}")
      setup = step_setup(m, workers, mesh)
      steppers = {name: Stepper(setup, *step_time.LENET_METHODS[name]) for name in scale.step_methods}
      timed = side_by_side(steppers, scale.repeats, scale.steps_per_repeat)
      for name, t in timed.items():
        compressor, kwargs = step_time.LENET_METHODS[name]
        rows.append({"model": m.name, "fields": m.fields, "workers": workers, "devices": mesh.devices.size,
                     "batch": m.batch, "method": name, "compressor": compressor, "compressor_kwargs": kwargs,
                     "step_s": t.pop("median_s"), "ratio_to_float": t.pop("ratio"),
                     "compiles": steppers[name].step._cache_size(), **t})  # pylint: disable=protected-access
      log(f"steps: {m.name}, N = {workers}: " + ", ".join(f"{r['method']} {r['ratio_to_float']:.2f}"
                                                         for r in rows[-len(timed):]))
  return rows


# --- the document ---------------------------------------------------------------------------


def environment() -> dict[str, Any]:
  """The device, the software and the checkout this run measured."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  return {"device": device.device_kind, "platform": device.platform, "backend": jax.default_backend(),
          "devices": jax.device_count(), "jax": jax.__version__, "jaxlib": importlib.metadata.version("jaxlib"),
          "python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
          "commit": _commit()}


def _commit() -> str | None:
  """The checkout's commit (``+`` if it has changes), or ``None`` outside a git checkout."""
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None
  return head + ("+" if dirty else "")


def markdown(doc: dict[str, Any]) -> str:
  """The document as Markdown: the environment, then one section per part that ran."""
  sections = [_environment_md(doc)]
  for part, render in (("tests", _tests_md), ("compressors", _compressors_md), ("exchange", _exchange_md),
                       ("steps", _steps_md)):
    if part in doc:
      sections.append(render(doc[part]))
  return "\n\n".join(sections) + "\n"


def _environment_md(doc: dict[str, Any]) -> str:
  env = doc.get("environment", {})
  commands = [doc["command"]] + ([doc["tests"]["command"]] if "tests" in doc else [])
  rows = [("device", f"{env.get('device', '?')} × {env.get('devices', '?')} ({env.get('backend', '?')})"),
          ("JAX / jaxlib", f"{env.get('jax', '?')} / {env.get('jaxlib', '?')}"),
          ("Python, machine", f"{env.get('python', '?')}, {env.get('machine', '?')}"),
          ("commit", str(env.get("commit"))), ("scale", doc["scale"]), ("data", doc["data"])]
  rows += [("command", f"`{c}`") for c in commands]
  if doc.get("skipped"):
    rows.append(("skipped (budget spent)", "; ".join(doc["skipped"])))
  return "\n".join(["## jaxcomp on the accelerator", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows])


def _tests_md(t: dict[str, Any]) -> str:
  lines = ["### Tests (`-m accelerator`)", "",
           f"{t['summary']} ({len(t['files'])} files, {t['seconds']:.0f} s"
           + (", timed out" if t["timed_out"] else "") + ")"]
  if t.get("failed"):
    lines += ["", "| test | outcome | message |", "|---|---|---|"]
    lines += [f"| `{f['test']}` | {f['outcome']} | {f['message'].replace('|', '/')} |" for f in t["failed"]]
  return "\n".join(lines)


def _table(title: str, columns: list[tuple[str, str, Callable[[dict], str]]], rows: list[dict]) -> str:
  """A Markdown table under ``title``; a column is its header, its alignment row (``---``, ``---:``) and its cell."""
  lines = [f"### {title}", "", "| " + " | ".join(c[0] for c in columns) + " |",
           "|" + "|".join(c[1] for c in columns) + "|"]
  lines += ["| " + " | ".join(c[2](r) for c in columns) + " |" for r in rows]
  return "\n".join(lines)


def _ms(seconds: float | None) -> str:
  return "—" if seconds is None else f"{seconds * 1e3:.3f}"


def _size(n: int) -> str:
  from experiments import throughput  # pylint: disable=g-import-not-at-top
  return throughput.size_label(n)


# The first call's seconds: compiling, mostly.
_FIRST_CALL = ("first call s", "---:", lambda r: f"{r['first_call_s']:.1f}")


def _compressors_md(rows: list[dict]) -> str:
  return _table("Compressors: encode + decode against a copy", [
      ("compressor", "---", lambda r: f"`{r['compressor']}`"), ("n", "---:", lambda r: _size(r["size"])),
      ("encode ms", "---:", lambda r: _ms(r.get("encode_s"))), ("decode ms", "---:", lambda r: _ms(r.get("decode_s"))),
      ("copy ms", "---:", lambda r: _ms(r["copy_s"])), ("copy GB/s", "---:", lambda r: f"{r['copy_gb_per_s']:.1f}"),
      ("vs copy", "---:", lambda r: f"{r['vs_copy']:.1%}")], rows)


def _steps_md(rows: list[dict]) -> str:
  return _table("Training steps with simulated workers (vmap in shard_map)", [
      ("model", "---", lambda r: r["model"]), ("N", "---:", lambda r: str(r["workers"])),
      ("batch", "---:", lambda r: str(r["batch"])), ("method", "---", lambda r: f"`{r['method']}`"),
      ("step ms", "---:", lambda r: _ms(r["step_s"])), ("/ float", "---:", lambda r: f"{r['ratio_to_float']:.2f}"),
      _FIRST_CALL], rows)


def _exchange_md(rows: list[dict]) -> str:
  return _table("Whole update on the devices present", [
      ("model (tensors)", "---", lambda r: f"{r['model']} ({r['tensors']})"),
      ("devices", "---:", lambda r: str(r["devices"])), ("method", "---", lambda r: f"`{r['method']}`"),
      ("update ms", "---:", lambda r: _ms(r["update_s"])), ("/ float", "---:", lambda r: f"{r['ratio_to_float']:.2f}"),
      ("bytes on the wire", "---:", lambda r: f"{r['bytes_on_wire']:,}"), _FIRST_CALL], rows)


def write(doc: dict[str, Any], out: str) -> None:
  """``out/accelerator.json`` and ``out/accelerator.md``, anew."""
  with open(os.path.join(out, "accelerator.json"), "w") as f:
    json.dump(doc, f, indent=1, default=float)
    f.write("\n")
  with open(os.path.join(out, "accelerator.md"), "w") as f:
    f.write(markdown(doc))


# --- the command ----------------------------------------------------------------------------

MEASUREMENTS = {"compressors": bench_compressors, "exchange": bench_exchange, "steps": bench_steps}


def _parse(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m benchmarks.accelerator", description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="directory for accelerator.json, accelerator.md and the test log")
  p.add_argument("--tiny", action="store_true", help="tiny sizes, and the tests collected only (a CPU test)")
  p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
  p.add_argument("--tests", nargs="+", default=None, metavar="FILE",
                 help="test files to run (default: every file under tests/ that uses the marker)")
  p.add_argument("--test-workers", type=int, default=max(1, min(8, (os.cpu_count() or 1) // 2)),
                 help="pytest-xdist processes (default: half the CPUs, at most 8)")
  p.add_argument("--tests-timeout", type=float, default=240.0, help="seconds for the whole test run")
  p.add_argument("--budget", type=float, default=240.0,
                 help="seconds for the measurements: a part or group that would start later is skipped")
  args = p.parse_args(argv)
  args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
  unknown = [s for s in args.parts if s not in PARTS]
  if unknown or not args.parts:
    p.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
  return args


def measure(doc: dict[str, Any], parts: list[str], scale: Scale, budget: Budget, out: str) -> None:
  """Runs the measurement ``parts`` in order into ``doc``, writing it after each; the budget's skips too."""
  t0 = time.perf_counter()
  doc["skipped"] = budget.skipped
  for part in parts:
    if budget.allows(part):
      log(f"{part}: measuring ({scale.name})")
      doc[part] = MEASUREMENTS[part](scale, budget)
      doc["measure_s"] = time.perf_counter() - t0
      write(doc, out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  _absent.install()  # in this process too: a part that reaches one of them fails here as on a GPU machine
  argv = sys.argv[1:] if argv is None else list(argv)
  args = _parse(argv)
  scale = TINY if args.tiny else FULL
  os.makedirs(args.out, exist_ok=True)
  t0 = time.perf_counter()
  doc: dict[str, Any] = {"benchmark": "accelerator", "command": shlex.join(["python", "-m", __spec__.name] + argv),
                         "scale": scale.name, "data": SYNTHETIC}
  if "tests" in args.parts:  # first: the test processes start before this one holds the device
    doc["tests"] = run_tests(args.tests or marked_test_files(), args.out, scale.collect_only, args.test_workers,
                             args.tests_timeout)
  doc["environment"] = environment()
  write(doc, args.out)
  measure(doc, [p for p in PARTS if p in args.parts and p in MEASUREMENTS], scale, Budget(args.budget), args.out)
  doc["absent_imported"] = _absent.imported()
  doc["wall_s"] = time.perf_counter() - t0
  write(doc, args.out)
  print(markdown(doc))
  return doc


def _failed(doc: dict[str, Any]) -> bool:
  """Whether the tests (if they ran) failed, timed out or could not be collected."""
  return "tests" in doc and doc["tests"]["returncode"] != 0


if __name__ == "__main__":
  sys.exit(1 if _failed(main()) else 0)
