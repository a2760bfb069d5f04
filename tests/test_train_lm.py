"""The language-model task end to end: configs/gpt_text.py on the GCIDE text through
experiments.train, with the float exchange and with DiLoCo, at a tiny size."""

import csv
import math
import shutil

import jax
import numpy as np
import pytest

from configs import gpt_text
from experiments import train
from experiments import validation
from jaxcomp.data import text

pytestmark = pytest.mark.skipif(not text.gcide_available(),
                                reason="Debian package dict-gcide not installed (make setup as root)")


def _tiny(arg):
  c = gpt_text.get_config(arg)
  c.model_kwargs = {"context": 16, "width": 32, "depth": 1, "heads": 2}
  c.seq_len, c.workers, c.batch_size, c.num_train_steps = 16, 4, 8, 4
  c.lr_warmup_steps, c.eval_windows, c.eval_batch_size = 1, 8, 8
  c.log_every, c.eval_every, c.progress = 2, 0, False
  return c


def test_gpt_text_trains_with_diloco_and_reports_bits_per_byte(tmp_path):
  """One run (one compile) covers the task, the report's labels and DiLoCo's local parameters."""
  c = _tiny("runlocal,diloco")
  c.compressor_kwargs.inner_steps = 2
  s = train.train_and_evaluate(c, str(tmp_path))
  assert s["steps"] == 4 and s["model"] == "gpt" and s["dataset"] == "gcide"
  assert s["test_bits_per_byte"] == pytest.approx(s["test_loss"] / math.log(2))
  assert s["test_examples"] == 8 * 16  # bytes predicted
  assert s["corpus_license"] == "GPL-2.0-or-later" and s["unigram_entropy_bits_per_byte"] == 4.874
  assert s["train_bytes"] == 30_255_859
  rows = (tmp_path / "metrics.csv").read_text().splitlines()
  assert "bits_per_byte" in rows[0] and rows[-1].split(",")[1] == "test"
  # The float32 pseudo-gradient crosses the wire on every 2nd step only.
  assert s["float32_bytes"] == 4 * s["parameters"]
  assert s["mean_bytes_on_wire"] == pytest.approx(s["float32_bytes"] / 2)
  # The largest step is the outer step's whole pseudo-gradient, from each row's per-step counts.
  assert s["peak_bytes_on_wire"] == s["float32_bytes"]
  train_rows = [r for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r["split"] == "train"]
  assert [float(r["peak_bytes_on_wire"]) for r in train_rows] == [s["float32_bytes"]] * 2


def test_bad_language_model_configs():
  c = _tiny("runlocal")
  c.seq_len = 32  # longer than the model's context
  with pytest.raises(ValueError, match="seq_len"):
    validation.validate_config(c)
  c = _tiny("runlocal")
  c.model = "lenet"
  with pytest.raises(ValueError, match="is text"):
    validation.validate_config(c)


def _checkpoint(workdir, step):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  mngr = ocp.CheckpointManager(str(workdir / "checkpoints"))
  restored = mngr.restore(step, args=ocp.args.StandardRestore())
  mngr.close()
  return restored


def _rows(workdir):
  drop = {"wall_time", "steps_per_sec", "train_time"}
  return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(open(workdir / "metrics.csv"))]


@pytest.mark.slow
def test_lm_run_resumes_bit_identically(tmp_path):
  """Killed after step 6 (last checkpoint: 4), resumed, finished: the same bits as an uninterrupted
  run: the text pipeline continues at its step, and the optimizer state (DiLoCo's worker offsets and
  inner AdamW, the 8-bit exchange's error-feedback residuals, the outer momentum) comes back whole."""
  c = _tiny("runlocal,diloco")
  c.compressor_kwargs.inner_steps = 3
  c.compressor_kwargs.exchange = "int8"
  c.num_train_steps, c.checkpoint_every, c.log_every = 8, 4, 1
  a, b = tmp_path / "a", tmp_path / "b"
  summary_a = train.train_and_evaluate(c, str(a))
  assert train.train_and_evaluate(c, str(b), stop_after_steps=6) == {"steps": 6, "stopped_early": True}
  summary_b = train.train_and_evaluate(c, str(b))
  assert summary_b["resumed_from_step"] == 4 and summary_a["test_bits_per_byte"] == summary_b["test_bits_per_byte"]
  assert _rows(a) == _rows(b) and len(_rows(a)) == 9  # every step's row and the evaluation
  leaves_a, tree_a = jax.tree.flatten(_checkpoint(a, 8))
  leaves_b, tree_b = jax.tree.flatten(_checkpoint(b, 8))
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # What the checkpoint of step 4 (mid-period: one inner step since the outer step of step 3) must
  # carry for that: the workers' offsets and the exchange's residuals, none trivially zero.
  paths = jax.tree_util.tree_flatten_with_path(_checkpoint(b, 4))[0]
  for part in ("offset", "exchange"):
    residuals = [np.asarray(x) for p, x in paths if "residual" in str(p) and part in str(p)]
    assert residuals and any(np.abs(r).max() > 0 for r in residuals), part


def _zero(**overrides):
  """The tiny GPT, 64 wide so that its embedding and MLP are cut (tensors of 4 x 2,560 values or more), with
  TernGrad's reduce-scatter and an EMA that is evaluated, sharded as ``overrides`` say."""
  c = _tiny("runlocal")
  c.model_kwargs = {"context": 16, "width": 64, "depth": 1, "heads": 2}
  c.compressor, c.compressor_kwargs = "terngrad", {"clip_sigma": 2.5}
  c.num_train_steps, c.log_every, c.ema_decay, c.eval_with_ema = 6, 1, 0.5, True
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory):
  """ZeRO-3 (float parameter gather), checkpointed at steps 3 and 6: ``(workdir, summary)``."""
  workdir = tmp_path_factory.mktemp("zero3")
  return workdir, train.train_and_evaluate(_zero(shard_params=True, checkpoint_every=3), str(workdir))


@pytest.mark.timeout(600)  # with its module's fixture: 206 s on two cores beside a sweep (load 10)
def test_sharded_parameters_train_as_the_sharded_state(tmp_path, zero3_run):
  """shard_params: the parameters and their EMA kept as each worker's chunks, gathered in float32 for
  the step, evaluated whole; the run equals the one with the optimizer state sharded only to float32
  rounding, counts the whole model, and moves as many bytes (an all-gather and a reduce-scatter both)."""
  workdir, zero3 = zero3_run
  zero2 = train.train_and_evaluate(_zero(shard_optimizer=True), str(tmp_path))
  assert zero3["parameters"] == zero2["parameters"] == 67_520  # the whole model, not its padded chunks
  assert zero3["float32_bytes"] == 4 * zero3["parameters"]
  assert zero3["bytes_on_wire"] == zero2["bytes_on_wire"]
  np.testing.assert_allclose(zero3["test_bits_per_byte"], zero2["test_bits_per_byte"], rtol=1e-5)
  train3, train2 = ([float(r["loss"]) for r in csv.DictReader(open(w / "metrics.csv")) if r["split"] == "train"]
                    for w in (workdir, tmp_path))
  assert len(train3) == 6 and train3 != train3[:1] * 6
  np.testing.assert_allclose(train3, train2, rtol=1e-5)


@pytest.mark.slow
def test_sharded_parameters_resume_bit_identically(tmp_path, zero3_run):
  """The run's workdir without its last checkpoint (as if killed after step 5, last checkpoint: 3),
  resumed: every worker's chunks of the parameters and of their EMA, the sharded AdamW moments and
  TernGrad's residuals come back, and the run ends with the same bits as the uninterrupted one.
  (A run stopped by stop_after_steps, then resumed: tests/test_resume.py.)"""
  workdir, zero3 = zero3_run
  b = tmp_path / "b"
  shutil.copytree(workdir, b)
  shutil.rmtree(b / "checkpoints" / "6")
  resumed = train.train_and_evaluate(_zero(shard_params=True, checkpoint_every=3), str(b))
  assert resumed["resumed_from_step"] == 3 and resumed["test_bits_per_byte"] == zero3["test_bits_per_byte"]
  assert _rows(b) == _rows(workdir)  # the copy's rows of steps 4 to 6 and its evaluation, cut and written again
  leaves_a, tree_a = jax.tree.flatten(_checkpoint(workdir, 6))
  leaves_b, tree_b = jax.tree.flatten(_checkpoint(b, 6))
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  state = _checkpoint(b, 3)
  for part in ("params", "ema_params"):  # 16,384 values: 4,096 a worker, rounded up to 2,560's multiple
    assert state[part]["local"]["residual"]["logits"]["embedding"].shape == (4, 5120), part
