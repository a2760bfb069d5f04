"""TernGrad's report sections (TG-T1, T2, T3, F2, F4, F5) on FIXTURE run directories.

Every run directory here is a test fixture written by this file (made-up
numbers, labelled ``"fixture": true`` in its summary); none is a result.
"""

import csv
import json
import os

from experiments import report

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
  assert "## TG-T1" in text and "**Scale: REDUCED**" in text
  assert "dataset fashion_mnist_debian (paper: cifar10, not available offline" in text
  assert "3 epochs (paper: 768)" in text
  # N = 2: paper 86.56 / 85.64 (-0.92) beside ours 90.00 / 89.00 (-1.00); steps and epochs.
  assert ("| 2 | 128 | 1,406 (300,000) | 3 (768) | 86.56 | 85.64 | -0.92 | 90.00 | 89.00 | -1.00 | "
          "95.00 / 94.00 | 0 | 10.0 min / 10.0 min |") in text
  assert "| 16 | 2,048 | 88 (18,750) | 3 (768) | 83.19 | 82.80 | -0.39 | 85.00 | 86.00 | +1.00 |" in text
  assert "N = 2: 75.0%, N = 16: 75.0%" in text
  for png in ("tg_t1_fashion_mnist_debian_curves.png", "tg_t1_fashion_mnist_debian_fc3_sparsity.png"):
    assert (tmp_path / "docs" / "results" / png).exists()


def test_imagenet_experiments_without_runs_say_why_and_how(tmp_path):
  root = str(tmp_path / "runs")
  os.makedirs(root)
  text = report.build(root, str(tmp_path / "results.md"))
  for section in ("## TG-T2", "## TG-T3", "## TG-F2", "## TG-F4", "## TG-F5"):
    assert section in text
  assert text.count("**Not run: needs ImageNet (not available offline).**") == 3  # T2, T3, F4
  assert "python -m experiments.sweep --config configs/terngrad_alexnet.py --root runs" in text
  assert "python -m experiments.sweep --config configs/terngrad_googlenet.py --root runs" in text
  assert "--only workers=4" in text
  assert "| 2 | TernGrad-noclip | 54.63 | -2.70 | — | — |" in text
  assert "| 8 | TernGrad | 86.47 | -2.53 | — | — |" in text  # Table 3, top-5
  assert "notebooks/02_terngrad_convergence.ipynb" in text
  assert "python -m experiments.perfmodel_estimates" in text
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
  assert "| 4 | TernGrad | 57.28 | -0.04 | 58.00 | +1.00 | imagenet2012 | 185,000 | 0 | 10.0 min |" in t2
  assert "| 4 | TernGrad | 80.23 | -0.50 | 81.00 | +1.00 |" in t2
  f4 = text.split("## TG-F4")[1].split("## TG-F5")[0]
  assert "fc6 zero codes, mean over training: ours 70.00% (paper 71.32%)" in f4
  assert (tmp_path / "docs" / "results" / "tg_f4_fc6_sparsity.png").exists()


def test_tg_f5_labels_estimates(tmp_path):
  root = tmp_path / "runs"
  d = root / "TG-F5" / "perfmodel" / "fig5"
  os.makedirs(d)
  from configs import terngrad_perfmodel
  (d / "config.json").write_text(terngrad_perfmodel.get_config().to_json())
  rows = [{"gpus": g, "i": min(g, 4), "j": max(g // 4, 1), "float_throughput": 100.0 * g,
           "terngrad_throughput": 150.0 * g, "speedup": 1.5} for g in (1, 8, 64, 512)]
  model = {"per_gpu_batch": 128, "param_count": 1000, "forward_flops": 2e9,
           "gradient_bytes_float32": 4000, "gradient_bytes_terngrad": 500}
  summary = {"fixture": True, "models": {"alexnet": model, "vgg_a": model},
             "clusters": {c: {"label": c, "models": {"alexnet": {"assumed_compute_sec": 0.1, "rows": rows},
                                                     "vgg_a": {"assumed_compute_sec": 0.1, "rows": rows}}}
                          for c in ("ethernet", "infiniband")},
             "alexnet_ethernet_8gpu": {"speedup": 1.5, "compute_sec_matching_paper": 0.01,
                                       "assumed_compute_sec": 0.1}}
  (d / "summary.json").write_text(json.dumps(summary))
  text = report.build(str(root), str(tmp_path / "docs" / "results.md"))
  f5 = text.split("## TG-F5")[1]
  assert "performance-model ESTIMATES, not measurements" in f5
  assert "Paper: 3.04× for AlexNet on 8 GPUs over 1 Gbps Ethernet; ours (estimate): 1.50×" in f5
  assert "| alexnet | 128 | 1,000 | 2.00 | 0.0 | 0.0 | 8.0× |" in f5
  assert "measurement" not in f5.replace("not measurements", "").replace("not measured", "")
  assert (tmp_path / "docs" / "results" / "tg_f5_throughput.png").exists()
