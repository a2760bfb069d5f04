"""README.md and the docs pages do what they say: their code runs, and what they name exists and behaves so.

The README's Python blocks run in order, as one program in a fresh interpreter
(what a user who copies them gets); each docs page's blocks run after the
README's first program, which they build on. The blocks use tiny sizes
already, so nothing is substituted (the model-sharded recipe also runs with
its mesh's axes made Explicit). The metrics, options, compressor names and
make targets the README names are checked against the library and the Makefile.
"""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcomp
from jaxcomp import codecs

from _processes import worker_xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
OPTIONS = (ROOT / "docs" / "options.md").read_text()  # the compressors, their options and metrics


def _blocks(lang, text=README):
  return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _run(blocks, tmp_path):
  """Runs ``blocks`` as one program in a fresh interpreter (8 host devices); returns what it printed."""
  program = tmp_path / "readme_program.py"
  program.write_text("\n".join(blocks))
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS=worker_xla_flags(8))
  out = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


_COMPARE_LAYOUTS = """
import json
import re
import numpy as np
print(f"shard_map step compiled {step.compiles()} time(s)")
compiled = step.lower(params, opt_state, device_batches).compile().as_text()
float_reduced = 0  # elements of float arrays all-reduced by the shard_map step
for line in compiled.splitlines():
  if " all-reduce(" in line or " all-reduce-start(" in line:
    for dtype, dims in re.findall(r"\\b(f32|bf16|f16)\\[([\\d,]*)\\]", line.split("=", 1)[1].split("all-reduce")[0]):
      float_reduced += int(np.prod([int(d) for d in dims.split(",") if d]))
diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
           for a, b in zip(jax.tree.leaves(vmap_params), jax.tree.leaves(params)))
print(json.dumps({"max_param_diff": diff, "float_allreduced_elements": float_reduced}))
"""


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
  """The README's two programs, run as one, then the shard_map step compared with the vmap one."""
  vmap_block, shard_block = _blocks("python")
  return _run([vmap_block, "vmap_params = params", shard_block, _COMPARE_LAYOUTS],
              tmp_path_factory.mktemp("readme")).stdout


def test_readme_python_blocks_run_as_one_program(readme_run):
  lines = readme_run.strip().splitlines()
  # The vmap program: the toy task is learnt and the wire is about 16x smaller (2-bit codes).
  m = re.match(r"loss ([\d.]+), (\d+) bytes on the wire instead of (\d+) \(([\d.]+)x\)", lines[0])
  assert m, readme_run
  loss, wire, f32, ratio = float(m[1]), int(m[2]), int(m[3]), float(m[4])
  assert loss < 0.5 * np.log(10)  # well below chance (log 10)
  assert f32 == 4 * (64 * 10 + 10) and 10 < ratio < 16 and abs(f32 / wire - ratio) < 0.1
  # The shard_map program, over the 8 devices: the same wire format, so the same ratio; one compile.
  m = re.match(r"([\d.]+)x over (\d+) devices", lines[1])
  assert m and int(m[2]) == 8 and float(m[1]) == pytest.approx(ratio, abs=0.05), readme_run
  assert "shard_map step compiled 1 time(s)" in readme_run


def test_readme_programs_use_three_jaxcomp_calls_beyond_the_compressor_and_metrics():
  for block in _blocks("python"):
    calls = set(re.findall(r"\bjaxcomp\.([\w.]+)\(", block)) | set(re.findall(r"\b(step\.init)\(", block))
    assert calls - {"terngrad", "metrics"} <= {"data_parallel", "step.init", "parallel.vary"}, calls


def test_readme_vmap_and_shard_map_blocks_agree(readme_run):
  """The two programs train the same model: same parameters, and no float all-reduce of the gradient.

  Under shard_map's default check_vma=True, jax.grad of replicated parameters
  sums the gradient over the devices in float32; the README's step must not
  (its parameters would then move by the 8-worker sum, and the wire would
  carry float gradients beside the compressed ones).
  """
  import json  # pylint: disable=g-import-not-at-top
  result = json.loads(readme_run.strip().splitlines()[-1])
  assert result["max_param_diff"] < 1e-5, result
  # What may be all-reduced in float: TernGrad's agreed scale, one scalar per tensor (2 here).
  assert result["float_allreduced_elements"] <= 2, result


def _run_page(name, tmp_path, extra=()):
  """The README's first program, then the Python blocks of ``docs/name`` (and ``extra``), as one program."""
  page = (ROOT / "docs" / name).read_text()
  return _run(_blocks("python")[:1] + _blocks("python", page) + list(extra), tmp_path).stdout


@pytest.mark.slow
def test_meshes_page_blocks_run_on_auto_and_explicit_axes(tmp_path):
  """Hosts, the model-sharded recipe as written on Auto axes and again on Explicit ones, and the step by hand."""
  page = (ROOT / "docs" / "meshes.md").read_text()
  sharded = next(b for b in _blocks("python", page) if "jaxcomp.per_shard(" in b)
  explicit = sharded.replace("AxisType.Auto", "AxisType.Explicit")
  assert explicit != sharded
  count = 'print(f"model-sharded step compiled {m_step.compiles()} time(s)")'
  out = _run_page("meshes.md", tmp_path, [count, explicit, count])
  assert re.search(r"per device: \d+ bytes between hosts, \d+ within", out), out
  assert out.count("model-sharded step compiled 1 time(s)") == 2, out
  # Auto and Explicit: it learns, and a device's counts are its shards': the column-split kernel's
  # half (64 x 16), the row-split one's (16 x 10), the two replicated biases whole.
  runs = re.findall(r"model-sharded: loss ([\d.]+), (\d+) bytes per device over 'data' for its shards' (\d+) "
                    r"float32 bytes \(kernel P\(None, 'model'\)\)", out)
  assert len(runs) == 2, out
  for loss, wire, f32 in runs:
    assert float(loss) < 0.5 * np.log(10), out
    assert int(f32) == 4 * (64 * 16 + 32 + 16 * 10 + 10) and 10 < int(f32) / int(wire) < 16, out
  assert runs[0] == runs[1], "Explicit axes must give the Auto numbers"
  m = re.search(r"8 workers on 4 devices: loss ([\d.]+)", out)
  assert m and float(m[1]) < 0.5 * np.log(10), out
  m = re.search(r"by hand: ([\d.]+)x over 8 devices", out)
  assert m and 10 < float(m[1]) < 16, out


def test_nnx_page_blocks_run(tmp_path):
  lines = _run_page("nnx.md", tmp_path).strip().splitlines()[1:]  # after the README program's
  # nnx.Optimizer under nnx.vmap learns the toy task (chance is log 10), with 2-bit codes ...
  m = re.fullmatch(r"nnx vmap: loss ([\d.]+), ([\d.]+)x", lines[0])
  assert m and float(m[1]) < 0.5 * np.log(10) and 10 < float(m[2]) < 16, lines
  # ... and shard_map over 8 devices gives the same parameters: within 1e-7 for the first 60 steps;
  # later a rounding difference can flip one of TernGrad's random draws (a change of about 1e-3).
  # Gradients summed over devices instead of per worker would be off by about 1.
  m = re.search(r"nnx shard_map: largest difference from vmap ([\d.e+-]+)", lines[1])
  assert m and float(m[1]) < 1e-2, lines
  # The Flax NNX examples' nnx.jit program with a sharded batch learns in float, as the compressed one.
  m = re.fullmatch(r"nnx jit: loss ([\d.]+) in float, ([\d.]+) compressed", lines[2])
  assert m and max(float(m[1]), float(m[2])) < 0.5 * np.log(10), lines


def test_wrappers_page_blocks_run(tmp_path):
  out = _run_page("wrappers.md", tmp_path)
  # multi_steps(tx, 4): bytes on the 4th and 8th steps only, the same both times.
  m = re.search(r"multi_steps: bytes on the wire per step \[([\d, ]+)\]", out)
  wire = [int(v) for v in m[1].split(",")] if m else None
  assert wire and wire[3] == wire[7] > 0 and wire[:3] == wire[4:7] == [0, 0, 0], out


def test_language_models_and_schedules_blocks_run(tmp_path):
  page = lambda name: (ROOT / "docs" / name).read_text()
  out = _run(_blocks("python")[:1] + _blocks("python", page("language_models.md"))
             + _blocks("python", page("schedules.md")), tmp_path).stdout
  f32 = 4 * (64 * 10 + 10)
  # DiLoCo with H = 4: the float32 pseudo-gradient on the 4th and 8th steps, nothing between.
  m = re.search(r"diloco: bytes on the wire per step \[([\d, ]+)\]", out)
  assert m and [int(v) for v in m[1].split(",")] == [0, 0, 0, f32] * 2, out
  # Top-k's fraction on a schedule: 128 then 32 of 256 entries sent, in a payload of 128 slots.
  m = re.search(r"topk schedule: encoded bytes \[([\d, ]+)\], bytes on the wire \[([\d, ]+)\]", out)
  assert m, out
  assert [int(v) for v in m[1].split(",")] == [8 * 128] * 2 + [8 * 32] * 2, out
  assert [int(v) for v in m[2].split(",")] == [8 * 128] * 4, out


def test_zero_page_blocks_run(tmp_path):
  out = _run_page("zero.md", tmp_path)
  # Sharded AdamW learns the toy task (chance is log 10); w's moment is a row of 640 / 8 values a
  # worker; each worker sends its 80 float32 values of w's update to the all-gather (b, 10 values, whole).
  m = re.search(r"sharded AdamW: loss ([\d.]+), mu of w \((\d+), (\d+)\), (\d+) bytes gathered", out)
  assert m and float(m[1]) < 0.5 * np.log(10), out
  assert (int(m[2]), int(m[3]), int(m[4])) == (8, 80, 4 * 80), out
  assert "resumed bit for bit: True" in out, out  # a checkpoint of the sharded state, restored
  # ZeRO-3: w stored as a row of 80 values a worker, gathered whole; 80 int8 codes and a float32 scale sent.
  m = re.search(r"ZeRO-3: loss ([\d.]+), w stored as \((\d+), (\d+)\), whole \((\d+), (\d+)\), (\d+) bytes", out)
  assert m and float(m[1]) < 0.5 * np.log(10), out
  assert [int(v) for v in m.groups()[1:]] == [8, 80, 64, 10, 80 + 4], out
  # Two hops (2 hosts of 4): a 4-bit chunk of w is 40 bytes of codes and 2 block scales (48); inside
  # the host all 8 chunks, between hosts 2, and b whole (5 bytes, a scale) with the 2 flag bytes.
  m = re.search(r"two hops: loss ([\d.]+), gradient bytes per device (\d+) within the host, (\d+) between", out)
  assert m and float(m[1]) < 0.5 * np.log(10), out
  assert (int(m[2]), int(m[3])) == (8 * 48, 2 * 48 + 9 + 2), out
  # One copy a host, cut over its 4 devices: w's chunk is 160 values (80 bytes and 4 block scales), all
  # 4 inside the host with the weights' float32 gather (4 x 160), and between hosts this device's one.
  m = re.search(r"one copy a host: loss ([\d.]+), (\d+) bytes between hosts per device, (\d+) within", out)
  assert m and float(m[1]) < 0.5 * np.log(10), out
  assert (int(m[2]), int(m[3])) == (96 + 9 + 2, 4 * 96 + 4 * 160), out


# Every page whose Python blocks a test runs: these tests, and compressors.md's (test_custom_compressor).
RUN_PAGES = {"meshes.md", "nnx.md", "wrappers.md", "language_models.md", "schedules.md", "compressors.md",
             "zero.md", "options.md"}


def test_every_docs_page_with_code_is_run():
  with_code = {p.name for p in (ROOT / "docs").glob("*.md") if _blocks("python", p.read_text())}
  assert with_code == RUN_PAGES


def test_readme_is_a_quick_path():
  assert len(README.splitlines()) <= 400
  linked = set(re.findall(r"\]\(docs/([\w.]+\.md)\)", README))
  assert RUN_PAGES | {"options.md", "multiprocess.md", "experiments.md"} <= linked


def test_grads_of_replicated_params_under_checked_shard_map_are_refused():
  """check_vma=True and gradients of P() params: a clear error, not a second exchange of a float sum."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  n = 4
  mesh = jax.make_mesh((n,), ("w",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])
  tx = jaxcomp.terngrad(axis_name="w")
  params = {"k": jnp.ones((8, 4))}
  state = jaxcomp.parallel.replicate_workers(tx.init(params), n)
  specs = jaxcomp.parallel.worker_specs(state, "w")

  def step(vary):
    def device_step(params, state, x):
      p = jaxcomp.parallel.vary(params, "w") if vary else params
      grads = jax.grad(lambda p: jnp.sum((x[0] @ p["k"]) ** 2))(p)
      upd, s = tx.update(grads, jaxcomp.parallel.worker_slice(state, 0), params)
      return optax.apply_updates(params, upd), jaxcomp.parallel.expand_workers(s)
    return jax.jit(jax.shard_map(device_step, mesh=mesh, in_specs=(P(), specs, P("w")),
                                 out_specs=(P(), specs)))

  x = jax.random.normal(jax.random.PRNGKey(0), (n, 3, 8))
  with pytest.raises(ValueError, match=r"'k' is the same on every worker of 'w'.*jaxcomp.parallel.vary"):
    step(vary=False)(params, state, x)
  new_params, _ = step(vary=True)(params, state, x)
  # The same step under vmap (vary is a no-op there) gives the same parameters.
  axes = jaxcomp.parallel.worker_axes(state)

  def worker_step(params, state, x):
    grads = jax.grad(lambda p: jnp.sum((x @ p["k"]) ** 2))(jaxcomp.parallel.vary(params, "w"))
    upd, s = tx.update(grads, state, params)
    return optax.apply_updates(params, upd), s

  ref, _ = jax.jit(jax.vmap(worker_step, in_axes=(None, axes, 0), out_axes=(None, axes), axis_name="w"))(
      params, state, x)
  np.testing.assert_allclose(new_params["k"], ref["k"], atol=1e-6)


def test_readme_compressor_list_is_the_registry():
  text = OPTIONS
  listed = text.split("`error_feedback`):", 1)[1].split("The table in", 1)[0]
  named = set(re.findall(r"`([a-z_0-9]+)`", listed)) - {"opt", "pmean"}
  assert named == set(jaxcomp.names())


@pytest.mark.parametrize("name", [n for n in jaxcomp.names() if n not in jaxcomp.compressors.WRAPPERS])
def test_every_compressor_takes_the_options_the_readme_names(name):
  text = OPTIONS
  options = re.search(r"each takes (.*?)\)", text, flags=re.S).group(1)
  options = re.findall(r"`([a-z_]+)`", options)
  assert options == ["axis_name", "skip", "min_size", "seed", "nonfinite", "error_feedback"]
  values = {"axis_name": None, "skip": None, "min_size": 8, "seed": 3, "nonfinite": "zero",
            "error_feedback": name not in ("none",)}
  if name == "none":  # the float32 pmean baseline: only the exchange axis
    values = {"axis_name": None}
  tx = jaxcomp.get_transform(name, **values)
  params = {"w": jnp.linspace(-1.0, 1.0, 64), "tiny": jnp.ones(4)}
  state = tx.init(params)
  updates, _ = jax.jit(tx.update)(params, state, params)
  assert jax.tree.structure(updates) == jax.tree.structure(params)
  if name != "none":  # min_size=8: the 4-element tensor stays in float32, bit for bit
    np.testing.assert_array_equal(updates["tiny"], params["tiny"])


def test_local_steps_as_the_readme_says():
  opt = optax.sgd(0.1)
  tx = jaxcomp.make_optimizer("local_steps", opt, k=2, axis_name=None)
  params = {"w": jnp.ones(16)}
  state = tx.init(params)
  g = {"w": jnp.full(16, 0.5)}
  first, state = tx.update(g, state, params)
  second, state = tx.update(g, state, params)
  # k=2: the first step only accumulates (no update, nothing on the wire); the second exchanges
  # the mean of the two gradients and the optimizer steps on it.
  np.testing.assert_array_equal(first["w"], 0.0)
  np.testing.assert_allclose(second["w"], -0.1 * 0.5)
  assert float(jaxcomp.metrics(state)["bytes_on_wire"]) > 0


def _metrics_after_one_step(factory, grads, workers=2, **kwargs):
  """The metrics of one exchange among ``workers`` simulated workers (all with ``grads``)."""
  tx = factory(axis_name="w", **kwargs)
  state = jaxcomp.parallel.replicate_workers(tx.init(grads), workers)
  axes = jaxcomp.parallel.worker_axes(state)
  # Compiled as one program: run op by op, the vmapped exchange dispatches hundreds of small ops.
  step = jax.jit(jax.vmap(lambda g, s: tx.update(g, s, g)[1], in_axes=(None, axes), out_axes=axes,
                          axis_name="w"))
  return {k: float(v) for k, v in jaxcomp.metrics(step(grads, state)).items()}


def test_the_metrics_the_readme_names_exist_and_mean_what_it_says():
  text = OPTIONS
  named = set(re.findall(r"^\* `([a-z_0-9]+)`:", text, flags=re.M))
  assert named == {"bytes_on_wire", "float32_bytes", "compression_ratio", "encoded_bytes"}
  g = {"w": jax.random.normal(jax.random.PRNGKey(0), (1000,)), "b": jnp.ones(10)}
  m = _metrics_after_one_step(jaxcomp.terngrad, g, min_size=100)
  assert named <= set(m)
  # TernGrad: 1000 values at 2 bits (250 bytes) + the float32 scale of the payload + the float32
  # agreed on (pmax of the scalars, Eq. 4) + 1 non-finite flag byte; the 10-element tensor stays
  # in float32 (min_size=100): 40 bytes.
  assert m["bytes_on_wire"] == 250 + 4 + 4 + 1 + 40
  assert m["float32_bytes"] == 4 * 1010
  assert m["compression_ratio"] == pytest.approx(4040 / 299)
  assert m["encoded_bytes"] == m["bytes_on_wire"]  # no variable-length encoding
  # nonfinite="zero" exchanges no flags.
  assert _metrics_after_one_step(jaxcomp.terngrad, g, min_size=100, nonfinite="zero")[
      "bytes_on_wire"] == 299 - 1


def test_encoded_bytes_is_the_variable_length_size_where_the_readme_says():
  text = OPTIONS
  assert "`threelc`" in text and "`threshold`" in text and "`adaptive`" in text
  x = jnp.where(jnp.arange(4000) % 50 == 0, 1.0, 1e-4) * jnp.where(jnp.sin(jnp.arange(4000.0)) < 0, -1.0, 1.0)
  g = {"w": x}
  # 3LC: the exact zero-run size of the base-3^5 bytes, plus the 4-byte scale and the flag byte.
  m = _metrics_after_one_step(jaxcomp.threelc, g, sparsity=1.0)
  payload = jaxcomp.ThreeLC(sparsity=1.0).encode(x, jax.random.PRNGKey(0), None)
  assert m["encoded_bytes"] == int(codecs.zero_run_length(payload.codes)) + 4 + 1
  assert m["encoded_bytes"] < m["bytes_on_wire"]
  # threshold: 4 bytes per sent word (80 entries above tau) instead of the fixed slots.
  m = _metrics_after_one_step(jaxcomp.threshold, g, tau=0.5)
  assert m["encoded_bytes"] == 4 * 80 + 1 and m["bytes_on_wire"] > m["encoded_bytes"]
  # every other compressor: encoded_bytes is bytes_on_wire.
  for name in ("qsgd", "onebit", "int8", "topk", "signsgd"):
    m = _metrics_after_one_step(lambda **kw: jaxcomp.get_transform(name, **kw), g)
    assert m["encoded_bytes"] == m["bytes_on_wire"], name


def test_options_page_says_how_the_two_phase_exchange_cuts_a_tensor():
  from jaxcomp.compressors.qsgd import QSGD  # pylint: disable=g-import-not-at-top
  from jaxcomp.compressors.terngrad import TernGrad  # pylint: disable=g-import-not-at-top
  from jaxcomp.exchange import plan, two_phase  # pylint: disable=g-import-not-at-top
  text = " ".join(OPTIONS.split())
  assert "c = ceil(n / N) rounded up to a multiple of 40" in text
  assert two_phase.split(TernGrad(), 1000, 8).chunk == 160  # ceil(1000 / 8) = 125 -> 160
  assert "a 500-value tensor at 8 workers travels as 640" in text
  assert two_phase.split(TernGrad(), 500, 8).padded == 640
  assert "fewer than N·40 values (320 at 8 workers; N·512 = 4,096 for `qsgd`" in text
  assert two_phase.split(TernGrad(), 319, 8) is None and two_phase.split(TernGrad(), 320, 8).chunk == 40
  assert two_phase.split(QSGD(), 4095, 8) is None and two_phase.split(QSGD(), 4096, 8).chunk == 512
  assert "with `exchange=\"two_phase\"` as with `\"auto\"`; so does every tensor when there is one worker" in text
  assert plan.choose(TernGrad(), 319, 8, "two_phase") == plan.choose(TernGrad(), 319, 8, "auto") == "all_gather"
  assert plan.choose(TernGrad(), 10**6, 1, "two_phase") == "all_gather"


def test_options_page_measures_the_bytes_it_says_to_compare(tmp_path):
  """The page's program prints the figures its text gives: more bytes_on_wire, fewer received."""
  import ast  # pylint: disable=g-import-not-at-top
  out = _run(_blocks("python", OPTIONS), tmp_path).stdout
  m = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1]) for line in out.strip().splitlines()}
  ag, tp = m["all_gather"], m["two_phase"]
  assert "received_bytes" not in ag  # reported with "two_phase" or "auto", as the page says
  assert tp["bytes_on_wire"] > ag["bytes_on_wire"] and tp["received_bytes"] < 7 * ag["bytes_on_wire"]
  text = " ".join(OPTIONS.split())
  assert (f"`bytes_on_wire` {ag['bytes_on_wire']:,} bytes with the all-gather and {tp['bytes_on_wire']:,} with the "
          f"two-phase exchange ({tp['bytes_on_wire'] / ag['bytes_on_wire']:.2f}× more); received 7 × "
          f"{ag['bytes_on_wire']:,} = {7 * ag['bytes_on_wire']:,} bytes against a `received_bytes` of "
          f"{tp['received_bytes']:,} ({7 * ag['bytes_on_wire'] / tp['received_bytes']:.1f}× less)") in text


def test_every_make_target_the_docs_name_exists():
  makefile = (ROOT / "Makefile").read_text()
  defined = set(re.findall(r"^([a-z][a-z0-9_-]*):", makefile, flags=re.M))
  phony = set(re.search(r"^\.PHONY:(.*)$", makefile, flags=re.M).group(1).split())
  assert phony <= defined, f"listed in .PHONY but not defined: {phony - defined}"
  docs = README + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
  named = set(re.findall(r"`make ([a-z][a-z0-9_-]*)`", docs))
  for block in _blocks("bash", docs):
    named |= set(re.findall(r"^make ([a-z][a-z0-9_-]*)", block, flags=re.M))
  assert {"quickstart", "test"} <= named
  assert named <= defined, f"named in README.md or docs/ but not in the Makefile: {named - defined}"


def test_quick_start_is_two_commands():
  block = _blocks("bash")[0]
  commands = [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
  assert commands == ["make quickstart", "make test"]


def _compressor_class(name):
  import importlib
  from jaxcomp import core
  module = importlib.import_module(f"jaxcomp.compressors.{name}")
  (cls,) = [v for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, core.Compressor) and v.__module__ == module.__name__]
  return cls


def test_the_common_options_do_what_the_readme_says():
  text = OPTIONS
  listed = re.search(r"on by\s+default for the biased compressors: (.*?)\)", text, flags=re.S).group(1)
  with_ef = {n for n in jaxcomp.names() if n != "none" and n not in jaxcomp.compressors.WRAPPERS
             and _compressor_class(n).error_feedback}
  assert set(re.findall(r"`([a-z_0-9]+)`", listed)) == with_ef
  g = {"w": jax.random.normal(jax.random.PRNGKey(1), (512,)), "b": jnp.linspace(-1.0, 1.0, 16)}

  def one_step(**kwargs):
    tx = jaxcomp.terngrad(**kwargs)
    updates, state = tx.update(g, tx.init(g), g)
    return updates, state, {k: float(v) for k, v in jaxcomp.metrics(state).items()}

  # skip: True keeps the tensor in float32, bit for bit, and it is counted as float bytes.
  upd, _, m = one_step(skip={"w": False, "b": True})
  np.testing.assert_array_equal(upd["b"], g["b"])
  assert m["float_bytes"] == 4 * 16 and not np.array_equal(upd["w"], g["w"])
  # seed: the same seed draws the same ternary codes, another seed others.
  a, b, c = (one_step(seed=s)[0]["w"] for s in (0, 0, 1))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  # nonfinite: a NaN makes the tensor's average NaN ("propagate") or is sent as zeros ("zero").
  bad = dict(g, w=g["w"].at[3].set(jnp.nan))
  for policy, check in (("propagate", lambda u: np.isnan(u).all()), ("zero", lambda u: (u == 0).all())):
    tx = jaxcomp.terngrad(nonfinite=policy)
    upd, state = tx.update(bad, tx.init(bad), bad)
    assert check(np.asarray(upd["w"])), policy
    assert float(jaxcomp.metrics(state)["nonfinite_tensors"]) == 1
  # error_feedback: what quantization dropped is kept: update + residual = gradient.
  upd, state, _ = one_step(error_feedback=True)
  residual = state.local.residual
  np.testing.assert_allclose(upd["w"] + residual["w"], g["w"], rtol=1e-6, atol=1e-6)
  assert float(jnp.abs(residual["w"]).sum()) > 0
