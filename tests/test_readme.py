"""README.md does what it says: its code runs, and what it names exists and behaves so.

The Python blocks run in order, as one program in a fresh interpreter from the
repository root (what a user who copies them gets); the blocks use tiny sizes
already, so nothing is substituted. The metrics, options, compressor names and
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang, text=README):
  return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _section(title):
  """The text of the README section ``## title`` (up to the next ``## ``)."""
  m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
  assert m, f"README has no section {title!r}"
  return m.group(1)


def _run(blocks, tmp_path):
  """Runs ``blocks`` as one program in a fresh interpreter (8 host devices); returns what it printed."""
  program = tmp_path / "readme_program.py"
  program.write_text("\n".join(blocks))
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def test_readme_python_blocks_run_as_one_program(tmp_path):
  blocks = _blocks("python")
  assert len(blocks) >= 2, "the Use example and the shard_map example"
  # The shard_map example's step compiles once: its inputs start as its outputs are laid out.
  i = next(i for i, b in enumerate(blocks) if "over {mesh.size} devices" in b)
  blocks[i] += '\nprint(f"shard_map step compiled {step._cache_size()} time(s)")'
  j = next(i for i, b in enumerate(blocks) if "jaxcomp.per_shard(" in b)
  blocks[j] += '\nprint(f"model-sharded step compiled {m_step._cache_size()} time(s)")'
  out = _run(blocks, tmp_path)
  assert "shard_map step compiled 1 time(s)" in out.stdout, out.stdout
  assert "model-sharded step compiled 1 time(s)" in out.stdout, out.stdout
  lines = [l for l in out.stdout.strip().splitlines() if " step compiled " not in l]
  # The model-sharded block: it learns, and a device's counts are its shards': the column-split
  # kernel's half (64 x 16), the row-split one's (16 x 10), the two replicated biases whole.
  m = re.search(r"model-sharded: loss ([\d.]+), (\d+) bytes per device over 'data' for its shards' (\d+) "
                r"float32 bytes \(kernel P\(None, 'model'\)\)", out.stdout)
  assert m and float(m[1]) < 0.5 * np.log(10), out.stdout
  assert int(m[3]) == 4 * (64 * 16 + 32 + 16 * 10 + 10) and 10 < int(m[3]) / int(m[2]) < 16, out.stdout
  # The vmap example: the toy task is learnt and the wire is about 16x smaller (2-bit codes).
  m = re.match(r"loss ([\d.]+), (\d+) bytes on the wire instead of (\d+) \(([\d.]+)x\)", lines[0])
  assert m, out.stdout
  loss, wire, f32, ratio = float(m[1]), int(m[2]), int(m[3]), float(m[4])
  assert loss < 0.5 * np.log(10)  # well below chance (log 10)
  assert f32 == 4 * (64 * 10 + 10) and 10 < ratio < 16 and abs(f32 / wire - ratio) < 0.1
  # The shard_map example, over the 8 devices: the same wire format, so the same ratio.
  m = re.match(r"([\d.]+)x over (\d+) devices", lines[1])
  assert m and int(m[2]) == 8 and float(m[1]) == pytest.approx(ratio, abs=0.05), out.stdout
  # DiLoCo with H = 4: the float32 pseudo-gradient on the 4th and 8th steps, nothing between.
  m = re.search(r"diloco: bytes on the wire per step \[([\d, ]+)\]", out.stdout)
  assert m and [int(v) for v in m[1].split(",")] == [0, 0, 0, f32] * 2, out.stdout
  # Top-k's fraction on a schedule: 128 then 32 of 256 entries sent, in a payload of 128 slots.
  m = re.search(r"topk schedule: encoded bytes \[([\d, ]+)\], bytes on the wire \[([\d, ]+)\]", out.stdout)
  assert m, out.stdout
  assert [int(v) for v in m[1].split(",")] == [8 * 128] * 2 + [8 * 32] * 2, out.stdout
  assert [int(v) for v in m[2].split(",")] == [8 * 128] * 4, out.stdout


def test_readme_nnx_and_wrapper_blocks_run(tmp_path):
  # The first Use block (which they build on), then the blocks of these subsections only.
  use = _section("Use")
  blocks = _blocks("python", use)[:1] + _blocks("python", use.split("### Flax NNX\n", 1)[1])
  assert len(blocks) == 4, "the Use example, NNX under vmap and shard_map, multi_steps"
  # blocks[2] is NNX under shard_map: its step compiles once (its inputs laid out as its outputs).
  blocks[2] += '\nprint(f"nnx shard_map step compiled {step._cache_size()} time(s)")'
  out = _run(blocks, tmp_path)
  assert "nnx shard_map step compiled 1 time(s)" in out.stdout, out.stdout
  lines = [l for l in out.stdout.strip().splitlines() if " step compiled " not in l][1:]  # after the Use example's
  # nnx.Optimizer under nnx.vmap learns the toy task (chance is log 10), with 2-bit codes ...
  m = re.fullmatch(r"nnx vmap: loss ([\d.]+), ([\d.]+)x", lines[0])
  assert m and float(m[1]) < 0.5 * np.log(10) and 10 < float(m[2]) < 16, out.stdout
  # ... and shard_map over 8 devices gives the same parameters: within 1e-7 for the first 60 steps;
  # later a rounding difference can flip one of TernGrad's random draws (a change of about 1e-3).
  # Gradients summed over devices instead of per worker would be off by about 1.
  m = re.search(r"nnx shard_map: largest difference from vmap ([\d.e+-]+)", lines[1])
  assert m and float(m[1]) < 1e-2, out.stdout
  # multi_steps(tx, 4): bytes on the 4th and 8th steps only, the same both times.
  m = re.fullmatch(r"multi_steps: bytes on the wire per step \[([\d, ]+)\]", lines[2])
  wire = [int(v) for v in m[1].split(",")] if m else None
  assert wire and wire[3] == wire[7] > 0 and wire[:3] == wire[4:7] == [0, 0, 0], out.stdout


_COMPARE_LAYOUTS = """
import json
import numpy as np
vmap_params = params_after_vmap
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


def test_readme_vmap_and_shard_map_blocks_agree(tmp_path):
  """The two blocks train the same model: same parameters, and no float all-reduce of the gradient.

  Under shard_map's default check_vma=True, jax.grad of replicated parameters
  sums the gradient over the devices in float32; the README's step must not
  (its parameters would then move by the 8-worker sum, and the wire would
  carry float gradients beside the compressed ones).
  """
  vmap_block, shard_block = _blocks("python")[:2]
  out = _run(["import re", vmap_block, "params_after_vmap = params", shard_block, _COMPARE_LAYOUTS], tmp_path)
  import json  # pylint: disable=g-import-not-at-top
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["max_param_diff"] < 1e-5, result
  # What may be all-reduced in float: TernGrad's agreed scale, one scalar per tensor (2 here).
  assert result["float_allreduced_elements"] <= 2, result


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
  text = _section("Compressors and what they report")
  listed = text.split("`error_feedback`):", 1)[1].split("The table in", 1)[0]
  named = set(re.findall(r"`([a-z_0-9]+)`", listed)) - {"opt", "pmean"}
  assert named == set(jaxcomp.names())


@pytest.mark.parametrize("name", [n for n in jaxcomp.names() if n not in jaxcomp.compressors.WRAPPERS])
def test_every_compressor_takes_the_options_the_readme_names(name):
  text = _section("Compressors and what they report")
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
  text = _section("Compressors and what they report")
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
  text = _section("Compressors and what they report")
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


def test_every_make_target_the_docs_name_exists():
  makefile = (ROOT / "Makefile").read_text()
  defined = set(re.findall(r"^([a-z][a-z0-9_-]*):", makefile, flags=re.M))
  phony = set(re.search(r"^\.PHONY:(.*)$", makefile, flags=re.M).group(1).split())
  assert phony <= defined, f"listed in .PHONY but not defined: {phony - defined}"
  named = set(re.findall(r"`make ([a-z][a-z0-9_-]*)`", README))
  for block in _blocks("bash"):
    named |= set(re.findall(r"^make ([a-z][a-z0-9_-]*)", block, flags=re.M))
  assert {"quickstart", "test"} <= named
  assert named <= defined, f"named in README.md but not in the Makefile: {named - defined}"


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
  text = _section("Compressors and what they report")
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
