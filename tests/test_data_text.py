"""The GCIDE text corpus (Debian dict-gcide): the split, the registry's figures, the unigram
baseline, the byte-window pipelines, and the error when the package is missing."""

import numpy as np
import pytest

from jaxcomp import data
from jaxcomp.data import text

needs_gcide = pytest.mark.skipif(not text.gcide_available(),
                                 reason="Debian package dict-gcide not installed (make setup as root)")


def test_missing_corpus_says_how_to_install(monkeypatch, tmp_path):
  monkeypatch.setenv(text.GCIDE_PATH_ENV, str(tmp_path / "absent.dict.dz"))
  with pytest.raises(data.DatasetNotAvailableError, match="apt-get install dict-gcide"):
    data.load_text("gcide", "train")
  with pytest.raises(ValueError, match="load_text"):
    data.load_arrays("gcide", "train")
  with pytest.raises(ValueError, match="unknown text dataset"):
    data.load_text("wikitext", "train")


def test_normalise_and_split_on_a_small_text():
  raw = b"Abate \\A*bate\"\\, v. t.\n   To beat down. --Shak.\n   [1913 Webster]\n   [Obs.]\n"
  assert text.normalise(raw) == b"Abate \\A*bate\"\\, v. t.\nTo beat down. --Shak.\n[Obs.]\n"
  blocks = np.arange(45 * text.BLOCK_BYTES // 1000 * 1000, dtype=np.int64) % 251
  d = blocks.astype(np.uint8)
  train, test = text.split_text(d, "train"), text.split_text(d, "test")
  assert len(train) + len(test) == len(d) and len(test) == 2 * text.BLOCK_BYTES
  np.testing.assert_array_equal(test[:text.BLOCK_BYTES], d[19 * text.BLOCK_BYTES:20 * text.BLOCK_BYTES])


def test_unigram_bits_per_byte():
  assert text.unigram_bits_per_byte(np.frombuffer(b"abab", np.uint8)) == pytest.approx(1.0)
  # Held-out bytes unseen in train cost log2(total + ...) bits, finitely.
  assert np.isfinite(text.unigram_bits_per_byte(np.frombuffer(b"aab", np.uint8),
                                                np.frombuffer(b"c", np.uint8)))


def test_pipelines_are_deterministic_shifted_and_sliced():
  d = (np.arange(5000) % 256).astype(np.uint8)
  kw = dict(seq_len=16, global_batch_size=4, train=True, seed=3)
  a = text.TextPipeline(d, **kw)
  batches = [next(a) for _ in range(3)]
  resumed = next(text.TextPipeline(d, start_step=2, **kw))
  for k in ("inputs", "targets"):
    np.testing.assert_array_equal(resumed[k], batches[2][k])
  b = batches[0]
  assert b["inputs"].shape == (4, 16) and b["inputs"].dtype == np.int32
  np.testing.assert_array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
  np.testing.assert_array_equal((b["targets"] - b["inputs"]) % 256, 1)
  half = next(text.TextPipeline(d, process_index=1, process_count=2, **kw))
  np.testing.assert_array_equal(half["inputs"], b["inputs"][2:])
  ev = text.TextPipeline(d, seq_len=16, global_batch_size=4, train=False, eval_windows=10)
  first = list(ev.reset())
  assert len(first) == 3 and [float(m["mask"].sum()) for m in first] == [4.0, 4.0, 2.0]
  assert ev.eval_bytes == 160 and len(list(ev.reset())) == 3
  # Ten windows spread evenly over the 312 that fit, each window the bytes at its start.
  np.testing.assert_array_equal(ev.eval_starts, np.arange(10) * 31 * 16)
  firsts = [int(r[0]) for batch in first for r, m in zip(batch["inputs"], batch["mask"]) if m]
  assert firsts == [int(d[s]) for s in ev.eval_starts]


@needs_gcide
def test_gcide_registry_figures_and_unigram_entropy():
  spec = data.get_spec("gcide")
  train, test = data.load_text("gcide", "train"), data.load_text("gcide", "test")
  assert (len(train), len(test)) == (spec.num_train, spec.num_test) == (30_255_859, 1_572_864)
  assert spec.modality == "text" and spec.num_classes == 256 and "GPL" in spec.license
  assert text.unigram_bits_per_byte(train) == pytest.approx(4.874, abs=5e-4)
  assert text.unigram_bits_per_byte(train, test) == pytest.approx(4.876, abs=5e-4)
  sample = bytes(test[:4000]).decode("ascii", errors="replace")
  assert sample.count(" ") > 400 and "[1913 Webster]" not in sample  # English prose, tags dropped
