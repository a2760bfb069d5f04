"""The language-model task end to end: configs/gpt_text.py on the GCIDE text through
experiments.train, with the float exchange and with DiLoCo, at a tiny size."""

import math

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


def test_bad_language_model_configs():
  c = _tiny("runlocal")
  c.seq_len = 32  # longer than the model's context
  with pytest.raises(ValueError, match="seq_len"):
    validation.validate_config(c)
  c = _tiny("runlocal")
  c.model = "lenet"
  with pytest.raises(ValueError, match="is text"):
    validation.validate_config(c)
