"""DR-T1 / DR-F2: the config, its sweep, a 2-step run, and the report renderers.

The run directories built here are FIXTURES (made-up numbers in the layout the
trainer and the benchmark write), used only to test the renderers.
"""

import csv
import json
import os
import re

import jax
import jax.numpy as jnp
import pytest

from benchmarks import dryden_step_time
from configs import dryden_mlp
from experiments import optimizers
from experiments import report
from experiments import train
from experiments import validation
from experiments.reports import dryden
from _report_tables import number, numbers, numbers_after, row, section, table


def test_config_builds_and_matches_the_paper():
  c = dryden_mlp.get_config("dataset=mnist5k,fraction=1")
  validation.validate_config(c)
  assert (c.experiment, c.model, c.workers, c.batch_size) == ("DR-T1", "mlp", 4, 40)
  assert tuple(c.model_kwargs.hidden) == (4096, 4096, 4096)
  assert (c.optimizer, c.learning_rate, c.adagrad_init, c.adagrad_eps) == ("adagrad", 0.005, 0.0, 1e-8)
  assert c.num_train_steps == 20 * 4000 // 40  # the full 20 epochs of MNIST-5k's 4,000 images
  assert dryden_mlp.get_config("dataset=fashion_mnist_debian,fraction=0.05").num_train_steps == 1500
  assert set(dryden_mlp.PAPER["accuracy"]) == set(dryden_mlp.METHODS)
  with pytest.raises(ValueError):
    dryden_mlp.get_config("epochs=3")


def test_sweep_names_unique_and_transforms_build():
  sweep = dryden_mlp.get_sweep()
  names = [n for n, _ in sweep]
  assert len(names) == len(set(names)) == 4
  c = dryden_mlp.get_config("runlocal,dataset=mnist5k")
  params = {"k": jnp.zeros((64, 8)), "b": jnp.zeros((8,))}
  for name, overrides in sweep:
    cc = c.copy_and_resolve_references()
    cc.compressor = overrides["compressor"]
    cc.compressor_kwargs = overrides["compressor_kwargs"]  # replaced whole, as --config.compressor_kwargs={...}
    tx = optimizers.make_tx(cc, None)
    upd, _ = jax.eval_shape(tx.update, params, tx.init(params), params)  # traces, compiles nothing
    assert jax.tree.structure(upd) == jax.tree.structure(params), name


@pytest.mark.timeout(600)  # 76 s beside a suite run; over 300 s beside two and a CPU hog
def test_runlocal_two_steps_end_to_end(tmp_path):
  c = dryden_mlp.get_config("runlocal,dataset=mnist5k")  # hidden 256 (smoke test), adaptive
  c.num_train_steps = 2
  c.log_every = 1
  c.progress = False
  s = train.train_and_evaluate(c, str(tmp_path))
  assert s["steps"] == 2 and s["compressor"] == "adaptive" and 0.0 <= s["test_accuracy"] <= 1.0
  assert s["bytes_on_wire"] < s["float32_bytes"]


# -- report renderers, on fixture run directories -------------------------------------------------


def _fixture_run(root, method, acc, steps=100):
  d = os.path.join(root, "DR-T1", "mnist5k", method)
  os.makedirs(d)
  overrides = dryden_mlp.METHODS[method][1]
  comp, kwargs = overrides["compressor"], overrides["compressor_kwargs"]
  c = dryden_mlp.get_config("dataset=mnist5k,fraction=1")
  c.compressor = comp
  with open(os.path.join(d, "config.json"), "w") as f:
    f.write(c.to_json())
  summary = {"experiment": "DR-T1", "dataset": "mnist5k", "compressor": comp, "compressor_kwargs": kwargs,
             "steps": steps, "batch_size": 40, "seed": 0, "test_accuracy": acc, "wall_time_sec": 600.0,
             "steps_per_sec": 2.0, "test_examples": 1000, "bytes_on_wire": 4.7e6 if comp != "none" else 1.47e8,
             "compression_ratio": 31.3 if comp != "none" else 1.0, "mean_encoded_bytes": 3.0e6,
             "float32_bytes": 1.47e8}
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump(summary, f)
  with open(os.path.join(d, "metrics.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["step", "split", "loss", "accuracy", "encoded_bytes", "overflow"])
    w.writerow([50, "train", 0.5, 0.8, 3.0e6, 10])
    w.writerow([100, "train", 0.3, 0.9, 3.1e6, 12])
    w.writerow([100, "test", 0.35, acc, "", ""])


def _fixture_allreduce(root):
  d = os.path.join(root, "DR-F2", "uniform_synthetic", "host_cpu_8dev")
  os.makedirs(d)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"experiment": "DR-F2"}, f)
  results = []
  for size in (64, 128):
    for i, m in enumerate(("normal", "onebit", "threshold", "adaptive")):
      results.append({"method": m, "size": size, "workers": 8, "median_s": 1e-3 * (i + 1) * size / 64,
                      "mean_s": 1e-3, "bytes_on_wire": 4.0 * size * size / (1 if i == 0 else 32),
                      "compression_ratio": 1.0 if i == 0 else 32.0, "encoded_bytes": 100.0,
                      "overflow": None if i < 2 else 3.0, "received_bytes_model": 1000.0,
                      "rms_error_vs_exact_mean": 0.0 if i == 0 else 0.5})
  doc = {"experiment": "DR-F2", "command": "python -m benchmarks.allreduce --sizes 64,128",
         "data": "fixture", "collectives": "fixture", "trials": 3, "warmup": 1, "jax_version": "x",
         "machine": {"cpus": 2, "loadavg_at_end": [1.0, 1.0, 1.0]},
         "paper": {"source": "Fig. 2", "statistic": "mean", "claims": ["normal wins small"]},
         "results": results}
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump(doc, f)


def test_renderers_on_fixture_runs(tmp_path):
  root = str(tmp_path / "runs")
  _fixture_run(root, "normal", 0.95)
  _fixture_run(root, "onebit", 0.94)
  _fixture_run(root, "adaptive", 0.96)  # threshold missing: shown as not run
  _fixture_allreduce(root)
  times = {"normal": 0.4, "onebit": 0.8, "threshold": 1.1, "adaptive": 1.8}
  with open(os.path.join(root, "DR-T1", "mnist5k", "step_times.json"), "w") as f:
    json.dump({"dataset": "mnist5k", "step_time_sec": times, "warmup_steps": 10, "timed_steps": 5,
               "budget_sec": 7200.0, "margin_sec": 600.0, "overhead_sec": 180.0, "full_steps": 2000,
               "fraction": dryden_step_time.fraction_for(times, 2000),
               "command": "python -m benchmarks.dryden_step_time --dataset mnist5k"}, f)
  out = str(tmp_path / "docs" / "results.md")
  text = report.build(root, out)
  t1, f2 = section(text, "DR-T1"), section(text, "DR-F2")
  # The length rule: the four step times, then (7200 - 600 - 4 x 180) / 4.1 / 2000 = 0.7171 -> 0.71.
  rule = numbers_after(t1, "Length")
  assert {0.4, 0.8, 1.1, 1.8, 4.1, 7200, 600, 180, 2000} <= set(rule)  # the rule's inputs
  assert rule[-2:] == [0.7171, 0.71]
  assert "`python -m benchmarks.dryden_step_time --dataset mnist5k`" in t1
  # The paper's accuracy and delta beside ours, per method; threshold not run: no numbers of ours.
  acc = table(t1, "design", "paper: test acc. (%)", "ours: test acc. (%)")
  one = row(acc, design="one-bit")
  assert [number(one[c]) for c in ("paper: test acc. (%)", "paper: Δ vs float (pp)", "ours: test acc. (%)",
                                   "ours: Δ vs float (pp)", "difference of Δs (pp)", "s/step")] == [
                                       98.49, -0.02, 94.00, -1.00, -0.98, 0.50]
  assert numbers(one["epochs (of 20)"]) == [1.00, 5.0]  # 100 steps of 100 per epoch, 5% of 20 epochs
  assert number(one["ratio"]) == 31.3 and number(one["overflow / step"]) == 11  # (10 + 12) / 2
  thr = row(acc, design="threshold")
  assert number(thr["paper: test acc. (%)"]) == 98.12 and number(thr["paper: Δ vs float (pp)"]) == -0.39
  assert number(thr["ours: test acc. (%)"]) is None and number(thr["steps"]) is None
  # Of the grid's four methods three finished (not: of the runs on disk).
  assert numbers_after(t1, "Runs finished:")[:2] == [3, 4]
  scale = re.search(r"Scale: \W*(\w+)\W*(.*)", t1)
  assert scale[1] == "REDUCED" and "mnist5k" in scale[2] and numbers(scale[2]) == [2000, 30000]
  assert re.search(r"MNIST.{0,40}not available offline", t1)
  # DR-F2: median times per size and the speedups t_normal / t_method.
  times = row(table(f2, "size", "normal median ms"), size="128²")
  assert [number(times[f"{m} median ms"]) for m in ("normal", "onebit", "threshold", "adaptive")] == [
      2.0, 4.0, 6.0, 8.0]
  assert [number(times[f"{m}: speedup"]) for m in ("onebit", "threshold", "adaptive")] == [0.5, 0.33, 0.25]
  assert re.search(r"network\W* is memory", f2)  # says why the paper's crossover is not expected
  for png in ("dr_t1_mnist5k_curves.png", "dr_t1_mnist5k_volume.png", "dr_f2_uniform_synthetic_host_cpu_8dev.png"):
    assert os.path.exists(tmp_path / "docs" / "results" / png), png
  assert set(dryden.RENDERERS) == {"DR-T1", "DR-F2"}


def test_fraction_rule_rounds_down_and_rejects_bad_times():
  # configs/dryden_mlp.py: (7200 - 600 - 4 x 180) / (sum of step times) / full steps, floored to 0.01.
  times = {"normal": 0.406, "onebit": 0.824, "threshold": 1.096, "adaptive": 1.805}
  assert dryden_step_time.fraction_for(times, 30000) == 0.04  # 5880 / 4.131 / 30000 = 0.0474
  assert dryden_step_time.fraction_for({"a": 0.98}, 6000) == 1.09  # 6420 / 0.98 / 6000 = 1.0918
  assert dryden_step_time.fraction_for({"a": 1.0}, 6420) == 1.0  # exactly 1: not floored to 0.99
  for bad in ({}, {"a": 0.0}, {"a": float("nan")}):
    with pytest.raises(ValueError, match="positive"):
      dryden_step_time.fraction_for(bad, 30000)
