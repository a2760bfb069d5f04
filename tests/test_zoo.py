"""The compressor zoo: every registered compressor has settings; the runner and report work end to end."""

import json
import os

import optax
import pytest

import jaxcomp
from _report_tables import number, numbers, row, table
from benchmarks import link
from configs import zoo as zoo_config
from experiments import zoo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_registered_compressor_has_a_settings_row():
  # The zoo is every registered compressor, and nothing else.
  missing = set(jaxcomp.names()) - set(zoo_config.SETTINGS)
  assert not missing, f"add a SETTINGS row to configs/zoo.py for {sorted(missing)}"
  assert set(zoo_config.SETTINGS) == set(jaxcomp.names())
  for name, r in zoo_config.SETTINGS.items():
    assert isinstance(r["kwargs"], dict) and r["paper"], name
    assert set(r) <= {"kwargs", "config", "paper", "timing"}, name


@pytest.mark.parametrize("name", zoo_config.registered())
def test_settings_build_each_registered_compressor(name):
  """The row's kwargs are ones the factory accepts (experiments.train passes them the same way)."""
  r = zoo_config.SETTINGS[name]
  kwargs = {} if name == "none" else dict(r["kwargs"], min_size=r.get("config", {}).get("min_size", 0))
  tx = jaxcomp.make_optimizer(name, optax.sgd(0.1), axis_name=None, **kwargs)
  assert tx.init({"w": jax_zeros((4, 3))}) is not None
  c = zoo_config.get_config()
  for key in r.get("config", {}):
    assert key in c, f"{name}: {key} is not a config key"


def jax_zeros(shape):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jnp.zeros(shape, jnp.float32)


def test_sweep_takes_registered_names_at_run_time(monkeypatch):
  # A row for a compressor that is not registered (yet), with keyword arguments
  # nothing accepts, does not reach the sweep.
  monkeypatch.setitem(zoo_config.SETTINGS, "not_registered_yet", {"kwargs": {"no_such": 1}, "paper": "x"})
  sweep = zoo_config.get_sweep()
  names = {n.split("/")[0] for n, _ in sweep}
  assert names == set(jaxcomp.names())
  assert len(sweep) == len(names) * len(zoo_config.SEEDS)
  by_name = dict(sweep)
  assert by_name["qsgd/seed2"] == {"compressor": "qsgd", "seed": 2, "min_size": 10_000,
                                   "compressor_kwargs": {"bits_per_value": 4, "bucket_size": 512}}
  assert by_name["none/seed0"] == {"compressor": "none", "seed": 0}
  assert [n for n, _ in zoo_config.get_sweep("runlocal")] == [f"{n}/seed0" for n in zoo_config.RUNLOCAL_NAMES]


def test_every_rows_overrides_reach_the_config_intact():
  # The sweep passes --config.KEY=format_value(v); ml_collections reads containers with
  # ast.literal_eval, so JSON's `true` (randomk's error_feedback=True) must not be what it gets.
  import ast  # pylint: disable=g-import-not-at-top
  from experiments import sweep  # pylint: disable=g-import-not-at-top
  for name in zoo_config.SETTINGS:
    for key, value in zoo_config.overrides(name, 0).items():
      text = sweep.format_value(value)
      assert (ast.literal_eval(text) if isinstance(value, dict) else text) == (
          value if isinstance(value, dict) else str(value)), (name, key, text)


@pytest.mark.parametrize("name", zoo_config.registered())
def test_link_methods_carry_the_settings(name):
  z = zoo.Zoo("configs/zoo.py", "runs")
  r = zoo_config.SETTINGS[name]
  expected = {**r["kwargs"], **r.get("timing", {})}
  if "min_size" in r.get("config", {}):
    expected["min_size"] = r["config"]["min_size"]
  assert link.method_spec(z.method(name)) == (name, expected)


def test_link_timing_keeps_the_rows_optimizer():
  from benchmarks import train_step_link  # pylint: disable=g-import-not-at-top
  z = zoo.Zoo("configs/zoo.py", "runs")
  assert z.link_overrides("terngrad") == ()
  overrides = z.link_overrides("signsgd")
  assert overrides == ("optimizer=sgd", f"learning_rate={zoo_config.SIGN_LR}")
  c = train_step_link._config("lenet", z.method("signsgd"), 2, overrides)
  assert (c.optimizer, c.learning_rate, c.compressor, c.workers) == ("sgd", zoo_config.SIGN_LR, "signsgd", 2)


def test_link_step_without_root_says_so(monkeypatch, tmp_path):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  assert "root" in zoo.link_available()
  with pytest.raises(SystemExit, match="needs root.*not measured"):
    zoo.run_link(zoo.Zoo("configs/zoo.py:runlocal", str(tmp_path)), 1, False)


@pytest.mark.timeout(600)  # 87 s alone on two cores with other jobs running
def test_runlocal_runs_then_reports_from_files_alone(tmp_path, monkeypatch, capfd):
  # In this process (JAX is up already); the sweep's training runs are subprocesses, on one device each.
  monkeypatch.chdir(ROOT)
  monkeypatch.setenv("XLA_FLAGS", "")
  base = ["--config", "configs/zoo.py:runlocal", "--root", str(tmp_path)]
  docs = ["--out", str(tmp_path / "zoo.md"), "--plot", str(tmp_path / "zoo.png")]
  assert zoo.main(base + ["--steps", "accuracy,throughput,report", "--size", "64K", "--repeats", "1"] + docs) == 0
  assert "2 runs: 0 done, 0 partial, 2 to do" in capfd.readouterr().out

  runs = tmp_path / "zoo" / "mnist5k"
  s = {n: json.load(open(runs / n / "seed0" / "summary.json")) for n in zoo_config.RUNLOCAL_NAMES}
  assert all(v["steps"] == zoo_config.RUNLOCAL_STEPS and v["workers"] == 8 for v in s.values())
  thr = json.load(open(tmp_path / "zoo" / "throughput.json"))
  assert [r["compressor"] for r in thr["results"]] == ["terngrad"] and thr["size"] == 64 * 1024
  assert thr["results"][0]["shape"] == [64, 1024]

  # The report again, from the files alone: nothing is rerun.
  (tmp_path / "zoo.md").unlink()
  assert zoo.main(base + ["--report"] + docs) == 0
  assert "accuracy:" not in capfd.readouterr().out
  text = (tmp_path / "zoo.md").read_text()
  cells = table(text, "compressor", "test accuracy (%)", "bytes / worker / step")
  for name, summary in s.items():
    r = row(cells, compressor=f"`{name}`")
    assert number(r["test accuracy (%)"]) == round(100 * summary["test_accuracy"], 2)
    assert r["spread over seeds"] == "one seed"
    assert number(r["bytes / worker / step"]) == round(summary["mean_bytes_on_wire"] / 1e6, 3)
    assert number(r["ratio to float"]) == round(summary["float32_bytes"] / summary["mean_bytes_on_wire"], 1)
    assert r["step over link (s)"] == "not measured"  # no link JSON: never invented
  tg = row(cells, compressor="`terngrad`")
  assert numbers(tg["encode+decode (vs float32 copy)"])[0] == round(thr["results"][0]["melem_per_s"])
  assert "clip_sigma=2.5" in tg["settings"]
  assert (tmp_path / "zoo.png").stat().st_size > 0
