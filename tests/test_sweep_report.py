"""The sweep runner runs a grid resumably; the report is built from the runs alone."""

import json
import os
import re
import subprocess
import sys

import pytest

from _processes import compilation_cache_env, worker_xla_flags
from _report_tables import number, numbers_after, row, section, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep(root, *extra):
  cmd = [sys.executable, "-m", "experiments.sweep", "--config", "configs/terngrad_lenet.py:dataset=mnist5k",
         "--root", str(root), "--only", "workers=2", "--only", "optimizer=sgd",
         "--set", "num_train_steps=6", "--set", "eval_every=3", "--set", "log_every=3",
         "--set", "eval_batch_size=500", "--checkpoint_every", "3", *extra]
  # The grid's runs compile the same evaluation and initialization: the later run loads them.
  env = dict(os.environ, XLA_FLAGS=worker_xla_flags(1), **compilation_cache_env(root.parent / "xla_cache"))
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_sweep_then_report(tmp_path):
  root = tmp_path / "runs"
  out = _sweep(root)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "2 runs: 0 done, 0 partial, 2 to do" in out.stdout
  base = root / "TG-F3" / "mnist5k" / "sgd" / "N02"
  for comp in ("none", "terngrad"):
    s = json.load(open(base / comp / "summary.json"))
    assert s["steps"] == 6 and s["workers"] == 2 and s["compressor"] == comp
    assert (base / comp / "command.txt").read_text().startswith("python -m experiments.train")
  # Finished runs are not run again.
  again = _sweep(root)
  assert "2 runs: 2 done, 0 partial, 0 to do" in again.stdout
  assert "[1/2]" not in again.stdout

  from experiments import report
  text = report.build(str(root), str(tmp_path / "docs" / "results.md"))
  a = json.load(open(base / "none" / "summary.json"))["test_accuracy"]
  b = json.load(open(base / "terngrad" / "summary.json"))["test_accuracy"]
  f3 = section(text, "TG-F3")
  cells = table(f3, "N", "per-worker batch", "sgd: floating")
  two = row(cells, N="2")
  assert number(two["per-worker batch"]) == 32
  assert [number(two[c]) for c in ("sgd: floating", "sgd: TernGrad", "sgd: Δ (pp)")] == [
      round(100 * a, 2), round(100 * b, 2), round(100 * (b - a), 2)]
  assert all(number(two[c]) is None for c in ("momentum: floating", "momentum: TernGrad"))  # not run
  assert all(number(r["sgd: floating"]) is None for r in cells if r["N"] != "2")
  assert numbers_after(f3, "Cells finished:") == [1, 14]
  # A cell outside +-0.5 pp points to the variance diagnostic; one inside does not.
  assert bool(re.search(r"miss\w* the ±0\.5\W* target", f3)) == (abs(100 * (b - a)) > 0.5)
  assert (tmp_path / "docs" / "results" / "tg_f3_mnist5k_accuracy_vs_workers.png").exists()


def test_convergence_plot_against_epochs(tmp_path, monkeypatch):
  """Runs with different batch sizes share an epoch axis (TG-T1's N = 2 and 16)."""
  from experiments import plots  # pylint: disable=g-import-not-at-top

  dirs = []
  for name, steps in (("small", 16), ("large", 2)):
    d = tmp_path / name
    d.mkdir()
    rows = ["step,split,loss,accuracy"] + [f"{s},train,{1.0 / s},0.5" for s in range(1, steps + 1)]
    rows.append(f"{steps},test,0.5,0.8")
    (d / "metrics.csv").write_text("\n".join(rows) + "\n")
    dirs.append((name, str(d)))
  figs = []
  monkeypatch.setattr(plots.plt, "close", figs.append)
  png = tmp_path / "curves.png"
  plots.convergence_plot(dirs, str(png), epochs_per_step=[0.25, 2.0])
  assert png.exists()
  ax_acc, ax_loss = figs[0].axes
  assert ax_acc.get_xlabel() == ax_loss.get_xlabel() == "epoch"
  assert [list(line.get_xdata()) for line in ax_acc.lines] == [[4.0], [4.0]]  # both end at epoch 4
  assert list(ax_loss.lines[1].get_xdata()) == [2.0, 4.0]
  plots.convergence_plot(dirs, str(png))
  assert figs[1].axes[0].get_xlabel() == "step"
  for bad in ([1.0], [1.0, 0.0], [1.0, -2.0]):
    with pytest.raises(ValueError, match="one positive value per run"):
      plots.convergence_plot(dirs, str(png), epochs_per_step=bad)


def test_a_sigterm_to_the_sweep_reaches_its_run_and_75_passes_through(tmp_path):
  """A preempted sweep's SIGTERM goes to the running training command, whose exit status (75) it returns."""
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  from experiments import sweep  # pylint: disable=g-import-not-at-top

  # A stand-in for a training run: saves (here: nothing) and exits 75 on SIGTERM.
  run = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
         "print('ready', flush=True)\ntime.sleep(120)\n")
  log_path = tmp_path / "log.txt"

  def signal_the_sweep_once_the_run_is_up():
    deadline = time.monotonic() + 60
    while "ready" not in log_path.read_text() and time.monotonic() < deadline:
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  previous = signal.getsignal(signal.SIGTERM)
  with open(log_path, "w") as log:
    threading.Thread(target=signal_the_sweep_once_the_run_is_up, daemon=True).start()
    start = time.monotonic()
    assert sweep._run_forwarding_sigterm([sys.executable, "-c", run], log) == 75  # pylint: disable=protected-access
  assert time.monotonic() - start < 60
  assert signal.getsignal(signal.SIGTERM) is previous  # the sweep's own handling is back
