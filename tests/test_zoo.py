"""The compressor zoo: every registered compressor has settings; the runner and report work end to end."""

import json
import os

import optax
import pytest

import jaxcomp
from _processes import compilation_cache_env, worker_xla_flags
from _report_tables import number, numbers, row, table
from benchmarks import link
from configs import zoo as zoo_config
from configs import zoo_gpt
from experiments import zoo, zoo_studies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_registered_compressor_has_a_settings_row():
  # A row named after every registered compressor (its paper's settings), and labelled rows
  # "<compressor>.<label>" of registered compressors, each with its committed sweep.
  missing = set(jaxcomp.names()) - set(zoo_config.SETTINGS)
  assert not missing, f"add a SETTINGS row to configs/zoo.py for {sorted(missing)}"
  for name, r in zoo_config.SETTINGS.items():
    assert isinstance(r["kwargs"], dict) and r["paper"], name
    assert set(r) <= {"kwargs", "config", "paper", "timing", "compressor", "finding"}, name
    if name not in jaxcomp.names():
      assert name.startswith(r["compressor"] + ".") and r["compressor"] in jaxcomp.names(), name
      key, values = zoo_config.TUNING[name]
      assert r["kwargs"][key] in values, name
  assert set(zoo_config.DIAGNOSES) <= set(zoo_config.SETTINGS)


def test_rows_with_error_feedback_run_their_papers_optimizer():
  """Momentum on top of error feedback made random-k (Stich et al.'s Alg. 1 is plain SGD) and
  adaptive quantization (Dryden et al. train with AdaGrad) diverge in the zoo: their rows run
  their papers' optimizers, and the diagnoses compare against TG-F3's."""
  base = zoo_config.get_config()
  assert zoo_config.TG_F3_OPTIMIZER == {"optimizer": base.optimizer, "learning_rate": base.learning_rate}
  assert zoo_config.overrides("randomk", 0)["optimizer"] == "sgd"
  for name in ("threshold", "adaptive", "threshold.tuned"):
    o = zoo_config.overrides(name, 0)
    assert (o["optimizer"], o["learning_rate"]) == ("adagrad", 0.005), name
  diagnose = dict(zoo_config.get_sweep("diagnose"))
  assert diagnose["randomk/momentum"]["optimizer"] == "momentum"
  assert diagnose["adaptive/momentum"]["learning_rate"] == base.learning_rate
  assert zoo_config.get_config("diagnose").log_norms and zoo_config.get_config("diagnose").log_every == 1
  tune = dict(zoo_config.get_sweep("tune"))
  key, values = zoo_config.TUNING["threshold.tuned"]
  assert [tune[f"threshold.tuned/{key}={v}"]["compressor_kwargs"][key] for v in values] == list(values)


@pytest.mark.parametrize("name", zoo_config.registered())
def test_settings_build_each_registered_compressor(name):
  """The row's kwargs are ones the factory accepts (experiments.train passes them the same way)."""
  r = zoo_config.SETTINGS[name]
  kwargs = {} if name == "none" else dict(r["kwargs"], min_size=r.get("config", {}).get("min_size", 0))
  tx = jaxcomp.make_optimizer(zoo_config.compressor_of(name), optax.sgd(0.1), axis_name=None, **kwargs)
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
  assert names == set(zoo_config.SETTINGS) - {"not_registered_yet"}
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
  assert link.method_spec(z.method(name)) == (zoo_config.compressor_of(name), expected)


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
@pytest.mark.slow
def test_runlocal_runs_then_reports_from_files_alone(tmp_path, monkeypatch, capfd):
  # In this process (JAX is up already); the sweep's training runs are subprocesses, on one device each.
  monkeypatch.chdir(ROOT)
  monkeypatch.setenv("XLA_FLAGS", worker_xla_flags(1))
  for key, value in compilation_cache_env(tmp_path / "xla_cache").items():  # a zoo's runs share programs
    monkeypatch.setenv(key, value)
  base = ["--config", "configs/zoo.py:runlocal", "--config", "configs/zoo_gpt.py:runlocal", "--root", str(tmp_path)]
  docs = ["--out", str(tmp_path / "zoo.md"), "--plot", str(tmp_path / "zoo.png")]
  assert zoo.main(base + ["--steps", "accuracy,throughput,report", "--size", "64K", "--repeats", "1"] + docs) == 0
  assert capfd.readouterr().out.count("2 runs: 0 done, 0 partial, 2 to do") == 2  # each zoo's sweep

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

  # The language model's section, on the same page, ranked by bits per byte; no throughput timed.
  assert not (tmp_path / "zoo_gpt" / "throughput.json").exists()
  lm = text.split("## A language model")[1]
  cells = table(lm, "compressor", "held-out bits per byte")
  for name in zoo_gpt.RUNLOCAL_NAMES:
    summary = json.load(open(tmp_path / "zoo_gpt" / "gcide" / name / "seed0" / "summary.json"))
    assert summary["steps"] == zoo_gpt.RUNLOCAL_STEPS and summary["model"] == "gpt"
    bits = number(row(cells, compressor=f"`{name}`")["held-out bits per byte"])
    assert bits == round(summary["test_bits_per_byte"], 3) and 0 < bits < 9
  assert (tmp_path / "zoo_gpt.png").stat().st_size > 0


def _fake_run(workdir, accuracy, norms=((1.0, 0.5), (2.0, 0.25))):
  """A finished run's files as the report reads them: summary.json and train rows with norms."""
  os.makedirs(workdir)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"test_accuracy": accuracy, "final_train_loss": 1.5, "optimizer": "adagrad",
               "learning_rate": 0.005}, f)
  with open(os.path.join(workdir, "metrics.csv"), "w") as f:
    f.write("step,split,loss,update_norm,residual_norm,bits_per_byte\n")
    f.writelines(f"{k + 1},train,1.0,{u},{r},\n" for k, (u, r) in enumerate(norms))
    f.write(f"{len(norms)},test,1.0,,,\n")


def test_findings_sweeps_and_diagnoses_are_reported_from_their_files(tmp_path):
  z = zoo.Zoo("configs/zoo.py", str(tmp_path))
  studies = z.studies()
  tuned = "threshold.tuned"
  key, values = zoo_config.TUNING[tuned]
  accuracy = dict(zip(values, (0.10, 0.30, 0.70, 0.72, 0.74, 0.60)))  # best 74: within 5 points from 0.01 on
  for v in values:
    _fake_run(os.path.join(studies["tune"].runs_dir, f"{tuned}/{key}={v}"), accuracy[v])
  for name, _ in zoo_config.get_sweep("diagnose"):
    _fake_run(os.path.join(studies["diagnose"].runs_dir, name), 0.5, norms=((0.1, 3.0), (7.0, 40.0), (0.2, 9.0)))
  lines = zoo_studies.findings(z, str(tmp_path / "zoo.png"), str(tmp_path / "zoo.md"))
  text = "\n".join(lines)
  for name, r in zoo_config.SETTINGS.items():
    assert ("finding" in r) == (r.get("finding", "") in text and f"* `{name}`:" in text), name
  diagnosis = table(text, "run", "largest ‖update‖ (step)")
  assert len(diagnosis) == len(zoo_config.get_sweep("diagnose"))
  r = row(diagnosis, run="`randomk/momentum`")
  assert r["largest ‖update‖ (step)"] == "7 (2)" and r["‖residual‖ at the end"] == "9"
  assert (tmp_path / "zoo_diagnosis.png").stat().st_size > 0
  picked = 0.01
  used = zoo_config.SETTINGS[tuned]["kwargs"][key]
  assert f"{key} = 0.1: 74.00%" in text
  assert (f"uses {key} = {used:g}, as the rule picks" in text) == (used == picked)
  assert (f"the committed sweep picks {picked:g}: update the row" in text) == (used != picked)
