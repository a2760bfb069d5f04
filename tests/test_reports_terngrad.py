"""TernGrad's report sections (TG-T1, T2, T3, F2, F4, F5) on FIXTURE run directories.

Every run directory here is a test fixture written by this file (made-up
numbers, labelled ``"fixture": true`` in its summary); none is a result.
"""

import csv
import json
import os
import re

import pytest

from experiments import report
from _report_tables import number, numbers, numbers_after, row, section, table

COLUMNS = ["step", "split", "loss", "accuracy", "learning_rate", "bytes_on_wire", "float32_bytes",
           "compression_ratio", "encoded_bytes", "bn_stats_bytes", "steps_per_sec", "wall_time"]


def _run(root, experiment, dataset, name, *, config, summary, tensor=None, zero_frac=0.8, steps=10):
  """Writes a FIXTURE run: config.json, summary.json, metrics.csv (train rows every 5 steps, one test row)."""
  d = os.path.join(root, experiment, dataset, *name.split("/"))
  os.makedirs(d)
  json.dump(config, open(os.path.join(d, "config.json"), "w"))
  json.dump(dict(summary, fixture=True), open(os.path.join(d, "summary.json"), "w"))
  cols = COLUMNS + ([f"zeros:{tensor}", f"elements:{tensor}"] if tensor else [])
  with open(os.path.join(d, "metrics.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, cols)
    w.writeheader()
    for step in range(5, steps + 1, 5):
      row = {"step": step, "split": "train", "loss": 2.0 / step, "accuracy": 0.5, "learning_rate": 0.1,
             "bytes_on_wire": 100, "float32_bytes": 1600, "compression_ratio": 16, "encoded_bytes": 100,
             "bn_stats_bytes": 0, "steps_per_sec": 1.0, "wall_time": step}
      if tensor:
        row.update({f"zeros:{tensor}": zero_frac * 1000, f"elements:{tensor}": 1000})
      w.writerow(row)
    w.writerow({"step": steps, "split": "test", "loss": 0.5, "accuracy": summary["test_accuracy"],
                "wall_time": steps + 1})
  return d


def _summary(dataset, workers, batch, steps, comp, acc, top5=None):
  return {"dataset": dataset, "workers": workers, "batch_size": batch, "steps": steps, "seed": 0,
          "compressor": comp, "test_accuracy": acc, "test_top5_accuracy": top5, "test_examples": 10000,
          "wall_time_sec": 600.0, "steps_per_sec": 1.0}


def test_tg_t1_table_paper_beside_ours(tmp_path):
  root = str(tmp_path / "runs")
  acc = {(2, "none"): 0.90, (2, "terngrad"): 0.89, (16, "none"): 0.85, (16, "terngrad"): 0.86}
  for (n, comp), a in acc.items():
    batch, steps = {2: (128, 1406), 16: (2048, 88)}[n]
    _run(root, "TG-T1", "fashion_mnist_debian", f"N{n:02d}/{comp}", config={"dataset": "fashion_mnist_debian"},
         summary=_summary("fashion_mnist_debian", n, batch, steps, comp, a, a + 0.05),
         tensor="fc3/kernel" if comp == "terngrad" else None, zero_frac=0.75)
  text = report.build(root, str(tmp_path / "docs" / "results.md"))
  t1 = section(text, "TG-T1")
  scale = re.search(r"Scale: \W*(\w+)\W*(.*)", t1)
  assert scale[1] == "REDUCED"
  assert re.search(r"fashion_mnist_debian \(paper: cifar10, not available offline", scale[2])
  assert re.search(r"\b3 epochs \(paper: 768\)", scale[2])
  rows = table(t1, "N", "paper: floating (%)", "ours: floating (%)")
  cols = ("total batch", "paper: floating (%)", "paper: TernGrad (%)", "paper: Δ (pp)", "ours: floating (%)",
          "ours: TernGrad (%)", "ours: Δ (pp)", "seed")
  # N = 2: paper 86.56 / 85.64 (-0.92) beside ours 90.00 / 89.00 (-1.00); steps and epochs beside
  # the paper's; top-5 of both; wall times.
  two = row(rows, N="2")
  assert [number(two[c]) for c in cols] == [128, 86.56, 85.64, -0.92, 90.00, 89.00, -1.00, 0]
  assert numbers(two["steps (paper)"]) == [1406, 300000] and numbers(two["epochs (paper)"]) == [3, 768]
  assert numbers(two["ours: top-5 float / TernGrad (%)"]) == [95.0, 94.0]
  assert numbers(two["wall time float / TernGrad"]) == [10.0, 10.0]
  sixteen = row(rows, N="16")
  assert [number(sixteen[c]) for c in cols] == [2048, 83.19, 82.80, -0.39, 85.00, 86.00, +1.00, 0]
  assert numbers(sixteen["steps (paper)"]) == [88, 18750]
  # fc3's zero codes per N, beside the paper's fc6 figure.
  assert numbers_after(t1, "mean over training:") == [2, 75.0, 16, 75.0, 71.32]
  for png in ("tg_t1_fashion_mnist_debian_curves.png", "tg_t1_fashion_mnist_debian_fc3_sparsity.png"):
    assert (tmp_path / "docs" / "results" / png).exists()


def test_imagenet_experiments_without_runs_say_why_and_how(tmp_path):
  root = str(tmp_path / "runs")
  os.makedirs(root)
  text = report.build(root, str(tmp_path / "results.md"))
  t2, t3, f2, f4, f5 = (section(text, e) for e in ("TG-T2", "TG-T3", "TG-F2", "TG-F4", "TG-F5"))
  for s in (t2, t3, f4):  # each says it needs ImageNet and how to run it where it exists
    assert re.search(r"Not run\W+needs ImageNet", s)
  assert "python -m experiments.sweep --config configs/terngrad_alexnet.py --root runs" in t2
  assert "python -m experiments.sweep --config configs/terngrad_googlenet.py --root runs" in t3
  assert "--only workers=4" in f4
  # The paper's numbers stand, ours are empty.
  noclip = row(table(t2, "paper: top-1 (%)"), N="2", gradients="TernGrad-noclip")
  assert number(noclip["paper: top-1 (%)"]) == 54.63 and number(noclip["paper: Δ vs floating (pp)"]) == -2.70
  assert number(noclip["ours: top-1 (%)"]) is None
  tg8 = row(table(t3, "paper: top-5 (%)"), N="8", gradients="TernGrad")  # Table 3, top-5
  assert number(tg8["paper: top-5 (%)"]) == 86.47 and number(tg8["paper: Δ vs floating (pp)"]) == -2.53
  assert number(tg8["ours: top-5 (%)"]) is None
  assert "notebooks/02_terngrad_convergence.ipynb" in f2
  assert "python -m experiments.perfmodel_estimates" in f5
  assert "TG-T1" in text.split("## Not run yet")[-1]  # runs that can run here, listed as not run yet


def test_tg_t2_and_f4_from_imagenet_fixture_runs(tmp_path):
  root = str(tmp_path / "runs")
  for comp, a, t5 in (("none", 0.57, 0.80), ("terngrad", 0.58, 0.81)):
    _run(root, "TG-T2", "imagenet2012", f"N4/{comp}", config={"dataset": "imagenet2012"},
         summary=_summary("imagenet2012", 4, 512, 185000, comp, a, t5),
         tensor="fc6/kernel" if comp == "terngrad" else None, zero_frac=0.7)
  text = report.build(root, str(tmp_path / "docs" / "results.md"))
  t2 = text.split("## TG-T2")[1].split("## TG-T3")[0]
  assert "Not run" not in t2
  top1 = row(table(t2, "paper: top-1 (%)"), N="4", gradients="TernGrad")
  assert [number(top1[c]) for c in ("paper: top-1 (%)", "paper: Δ vs floating (pp)", "ours: top-1 (%)",
                                    "ours: Δ vs floating (pp)", "steps", "seed", "wall time")] == [
                                        57.28, -0.04, 58.00, 1.00, 185000, 0, 10.0]
  assert top1["dataset"] == "imagenet2012"
  top5 = row(table(t2, "paper: top-5 (%)"), N="4", gradients="TernGrad")
  assert [number(top5[c]) for c in ("paper: top-5 (%)", "paper: Δ vs floating (pp)", "ours: top-5 (%)",
                                    "ours: Δ vs floating (pp)")] == [80.23, -0.50, 81.00, 1.00]
  f4 = text.split("## TG-F4")[1].split("## TG-F5")[0]
  assert numbers_after(f4, "fc6 zero codes, mean over training:") == [70.0, 71.32]
  assert (tmp_path / "docs" / "results" / "tg_f4_fc6_sparsity.png").exists()


def test_tg_f5_labels_estimates(tmp_path):
  root = tmp_path / "runs"
  d = root / "TG-F5" / "perfmodel" / "fig5"
  os.makedirs(d)
  from configs import terngrad_perfmodel
  (d / "config.json").write_text(terngrad_perfmodel.get_config().to_json())
  rows = [{"gpus": g, "i": min(g, 4), "j": max(g // 4, 1), "float_throughput": 100.0 * g,
           "terngrad_throughput": 150.0 * g, "speedup": 1.5,
           "terngrad_all_gather_throughput": 50.0 * g, "speedup_all_gather": 0.5,
           "terngrad_two_phase_throughput": 140.0 * g, "speedup_two_phase": 1.4} for g in (1, 8, 64, 512)]
  two_phase = {"max_ratio": 0.067, "at_workers": 65536, "first_crossing": None,
               "workers_checked": [2, 4, 65536], "too_small_to_split": []}
  break_even = {"terngrad": {"label": "TernGrad", "compressor": "terngrad", "kwargs": {}, "models": {
      "alexnet": {"n": 1000, "all_gather_break_even_workers": 32, "all_gather_over_float_at_break_even": 1.0,
                  "all_gather_over_float_before": 0.9688, "payload_bytes": 254, "two_phase": two_phase}}}}
  model = {"per_gpu_batch": 128, "param_count": 1000, "forward_flops": 2e9,
           "gradient_bytes_float32": 4000, "gradient_bytes_terngrad": 500}
  summary = {"fixture": True, "models": {"alexnet": model, "vgg_a": model},
             "clusters": {c: {"label": c, "models": {"alexnet": {"assumed_compute_sec": 0.1, "rows": rows},
                                                     "vgg_a": {"assumed_compute_sec": 0.1, "rows": rows}}}
                          for c in ("ethernet", "infiniband")},
             "alexnet_ethernet_8gpu": {"speedup": 1.5, "compute_sec_matching_paper": 0.01,
                                       "assumed_compute_sec": 0.1},
             "break_even": break_even}
  (d / "summary.json").write_text(json.dumps(summary))
  text = report.build(str(root), str(tmp_path / "docs" / "results.md"))
  f5 = text.split("## TG-F5")[1]
  assert "performance-model ESTIMATES, not measurements" in f5
  assert numbers_after(f5, "Paper:") == [3.04, 8, 1, 1.50]  # 3.04x (AlexNet, 8 GPUs, 1 Gbps); ours 1.50x
  assert "ours (estimate)" in f5
  alexnet = row(table(f5, "model", "per-GPU batch"), model="alexnet")
  assert [number(alexnet[c]) for c in ("per-GPU batch", "parameters", "forward GFLOPs", "ratio")] == [
      128, 1000, 2.0, 8.0]
  speedups = table(f5, "cluster", "model", "TernGrad exchange")
  for exchange, x, tput in (("paper's charge", 1.5, 150.0), ("all-gather", 0.5, 50.0), ("two-phase", 1.4, 140.0)):
    r = row(speedups, cluster="ethernet", model="alexnet", TernGrad_exchange=exchange)
    assert [number(r[c]) for c in ("TernGrad speedup: 8 GPUs", "64 GPUs", "512 GPUs")] == [x, x, x]
    assert number(r["TernGrad images/s at 512 GPUs"]) == tput * 512
  b = row(table(f5, "compressor", "all-gather passes float at N"), compressor="TernGrad", model="alexnet")
  assert number(b["all-gather passes float at N"]) == 32
  assert numbers(b["all-gather/float at N; at N−1"]) == [1.0, 0.9688]
  assert number(b["payload P (bits/value)"]) == pytest.approx(8 * 254 / 1000, abs=1e-3)
  assert numbers(b["two-phase/float, largest (at N)"]) == [0.067, 65536]
  assert b["two-phase crosses float at"] == "never" and number(b["two-phase checked up to N"]) == 65536
  assert "measurement" not in f5.replace("not measurements", "").replace("not measured", "")
  assert (tmp_path / "docs" / "results" / "tg_f5_throughput.png").exists()


def test_tg_f3_seed_spread_ablation_and_mechanism(tmp_path):
  """TG-F3's extra rows and the mechanism paragraph, from FIXTURE runs and a FIXTURE results.json."""
  from configs import terngrad_lenet as cfg  # pylint: disable=g-import-not-at-top

  root = str(tmp_path / "runs")
  acc = {("none", 0): 0.91, ("terngrad", 0): 0.90, ("none", 1): 0.92, ("terngrad", 1): 0.905,
         ("none", 2): 0.915, ("terngrad", 2): 0.91}
  for (comp, seed), a in acc.items():
    _run(root, "TG-F3", "fm", cfg.run_name("momentum", 16, comp, seed=seed), config={"dataset": "fm"},
         summary=dict(_summary("fm", 16, 64, 10, comp, a), seed=seed))
  _run(root, "TG-F3", "fm", "momentum/N64/none", config={"dataset": "fm"},
       summary=_summary("fm", 64, 64, 10, "none", 0.90))
  for n, a in ((16, 0.907), (64, 0.896)):
    _run(root, "TG-F3", "fm", cfg.run_name("momentum", n, "terngrad", float_logits=True),
         config={"dataset": "fm"}, summary=_summary("fm", n, 64, 10, "terngrad", a))
  d = os.path.join(root, "TG-F3", "fm", "variance")
  os.makedirs(d)
  point = {"terngrad_added": {"1": 0.8, "64": 1.6}, "terngrad_added_float_logits": {"1": 0.6, "64": 1.44},
           "scalar_over_sigma_median": {"1": 2.5, "64": 400.0}, "minibatch_noise_b64": 6.5}
  json.dump({"dataset": "fm", "total_batch": 64, "batches": 2, "keys": 3, "train_steps": 100,
             "workers": [1, 64], "points": {"init": point, "after 100 steps": point}},
            open(os.path.join(d, "results.json"), "w"))
  json.dump({"experiment": "TG-F3"}, open(os.path.join(d, "config.json"), "w"))
  open(os.path.join(d, "command.txt"), "w").write("python -m benchmarks.terngrad_variance --keys 3\n")

  f3 = section(report.build(root, str(tmp_path / "docs" / "results.md")), "TG-F3")
  spread = table(f3, "seed", "floating", "TernGrad")
  assert [number(r["Δ (pp)"]) for r in spread] == [-1.0, -1.5, -0.5]
  assert numbers_after(f3, "Over 3 seeds Δ is")[:2] == [-1.0, 0.5]  # mean and sample std
  abl = table(f3, "N", "floating", "TernGrad, every tensor")
  assert [number(row(abl, N="16")[c]) for c in ("TernGrad, logits in float", "floating")] == [90.7, 91.0]
  assert number(row(abl, N="64")["TernGrad, every tensor"]) is None  # not run in the fixture
  assert number(row(abl, N="64")["Δ, every tensor (pp)"]) is None
  assert number(row(abl, N="64")["Δ, logits in float (pp)"]) == -0.4
  assert number(row(abl, N="16")["Δ, every tensor (pp)"]) == -1.0
  assert "closes 70% at N = 16 of the gap" in f3  # 1 − 0.3/1.0; N = 64 lacks its every-tensor run
  mech = table(f3, "N", "per-worker batch", "median s/σᵢ")
  assert [number(row(mech, N="64")[c]) for c in ("per-worker batch", "median s/σᵢ", "cut by logits in float")] == [
      1, 400.0, 10]
  assert number(row(mech, N="1")["cut by logits in float"]) == 25
  assert "`python -m benchmarks.terngrad_variance --keys 3`" in f3
  assert "cuts the added error by 10–25%" in f3
