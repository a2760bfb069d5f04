"""Real English text, offline: the GCIDE dictionary as byte-level tokens.

The corpus. Debian's ``dict-gcide`` package (GPL-2+; ``/usr/share/doc/dict-gcide/copyright``)
installs ``/usr/share/dictd/gcide.dict.dz`` (13 MB, a dictzip/gzip file): the GNU Collaborative
International Dictionary of English, v0.48 (Webster's Revised Unabridged Dictionary of 1913,
with WordNet 1.5 and later additions), 39,952,321 bytes of plain English text: headwords,
etymologies, definitions and the quotations from English literature that illustrate them. Why
this one: it is the largest real English prose on the Debian registry that installs as plain
text (the King James Bible of ``bible-kjv-text`` is 4 MB in a binary format; the Python and
kernel documentation is HTML or reStructuredText markup; ``fortunes`` is a few MB of jokes).

What we read (:func:`corpus_bytes`), decided once here:

* the decompressed file, as bytes (it is ASCII but for 3 bytes); a byte is a token (vocabulary
  256), no tokenizer;
* the leading spaces of every line are removed (dictd indents continuation lines and quotations
  by 3 to 50 spaces, which says nothing a reader needs);
* lines that hold nothing but a source tag (``[1913 Webster]``, ``[WordNet 1.5]``, ``[PJC]``,
  ``[Webster 1913 Suppl.]``, ...: 221,000 lines saying which edition an entry came from) are
  dropped; bracketed usage labels such as ``[Obs.]`` stay.

That leaves 31,828,723 bytes (20% less). The split (:func:`split_text`): the text is cut into
blocks of 64 KiB; every 20th block (blocks 19, 39, ...) is held out (``"test"``: 24 blocks,
1,572,864 bytes, 5%), the rest, joined in order, is ``"train"`` (30,255,859 bytes). Blocks
rather than a tail, so the held-out text spans the alphabet (the dictionary is sorted A to Z).

Unigram entropy (:func:`unigram_bits_per_byte`, ``tests/test_data_text.py``): the byte
frequencies of the train split have an entropy of 4.874 bits per byte, and coding the held-out
split with them costs 4.876 bits per byte: a language model that does not beat that has learnt
nothing beyond letter frequencies.

The file is checked against its size and sha256 (``checksums/gcide.tsv``: Debian's
``dict-gcide 0.48.5+nmu2``, Debian 12); a missing package raises
:class:`~jaxcomp.data.offline.DatasetNotAvailableError` with the command that installs it.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
import pathlib
import re
from typing import Iterator

import numpy as np

from jaxcomp.data import offline

GCIDE_PATH = "/usr/share/dictd/gcide.dict.dz"
"""Where the Debian package ``dict-gcide`` installs the dictionary text."""

GCIDE_PATH_ENV = "JAXCOMP_GCIDE_PATH"
"""Environment variable that overrides :data:`GCIDE_PATH`."""

GCIDE_CHECKSUMS = offline.CHECKSUMS_DIR / "gcide.tsv"

BLOCK_BYTES = 1 << 16
"""The split's block size: 64 KiB."""

TEST_EVERY = 20
"""Every 20th block is held out (``"test"``)."""

VOCAB_SIZE = 256
"""Byte-level tokens."""

UNIGRAM_BITS_PER_BYTE = {"gcide": (4.874, 4.876)}
"""Per corpus: the entropy of the train split's byte frequencies, and the bits per byte of the
held-out split coded with them (:func:`unigram_bits_per_byte`; checked in the tests)."""

_SOURCE_TAG_LINE = re.compile(rb"^\[[^\]\n]*(?:Webster|WordNet|PJC)[^\]\n]*\][ \t]*\n", re.MULTILINE)
_INDENT = re.compile(rb"^[ \t]+", re.MULTILINE)


def gcide_path() -> pathlib.Path:
  """Path of ``gcide.dict.dz`` (``$JAXCOMP_GCIDE_PATH`` overrides the Debian location)."""
  return pathlib.Path(os.environ.get(GCIDE_PATH_ENV) or GCIDE_PATH)


def gcide_available() -> bool:
  """Whether the dictionary file is present (not verified)."""
  return gcide_path().is_file()


def _require_gcide() -> pathlib.Path:
  path = gcide_path()
  if not path.is_file():
    raise offline.DatasetNotAvailableError(
        f"The GCIDE dictionary text {path} is not on this machine. Install the Debian package "
        "with `sudo apt-get update && sudo apt-get install dict-gcide` (`make setup` does so as "
        f"root), or point ${GCIDE_PATH_ENV} at a copy of gcide.dict.dz.")
  return path


def normalise(raw: bytes) -> bytes:
  """The corpus from the file's text: leading spaces removed, source-tag lines dropped."""
  return _SOURCE_TAG_LINE.sub(b"", _INDENT.sub(b"", raw))


@functools.lru_cache(maxsize=None)
def _corpus(path: str, verify: bool) -> np.ndarray:
  if verify:
    sums = offline.read_checksums(GCIDE_CHECKSUMS)
    offline.verify_file(path, *sums[pathlib.Path(path).name], GCIDE_CHECKSUMS)
  with gzip.open(path, "rb") as f:
    data = np.frombuffer(normalise(f.read()), np.uint8)
  data.flags.writeable = False
  return data


def corpus_bytes(*, verify: bool = True) -> np.ndarray:
  """The whole corpus (module docstring) as read-only ``uint8`` bytes; cached per process."""
  return _corpus(str(_require_gcide()), verify)


def split_text(data: np.ndarray, split: str) -> np.ndarray:
  """``"train"``: all blocks but every :data:`TEST_EVERY`-th, joined; ``"test"``: those blocks."""
  offline.check_split(split)
  starts = np.arange(0, len(data), BLOCK_BYTES)
  held = (np.arange(len(starts)) % TEST_EVERY) == TEST_EVERY - 1
  chosen = starts[held] if split == "test" else starts[~held]
  return np.concatenate([data[s:s + BLOCK_BYTES] for s in chosen])


def load_text(name: str, split: str, *, verify: bool = True) -> np.ndarray:
  """A text dataset's split as ``uint8`` bytes (a fresh, writable copy)."""
  if name != "gcide":
    raise ValueError(f"unknown text dataset {name!r}; known: ['gcide']")
  return split_text(corpus_bytes(verify=verify), split)


def unigram_bits_per_byte(train: np.ndarray, test: np.ndarray | None = None) -> float:
  """The entropy of ``train``'s byte frequencies, or with ``test`` the cost of coding ``test`` with them.

  Bits per byte; bytes absent from ``train`` get the count 1/2 (add-half smoothing), so the
  cross-entropy is finite.
  """
  counts = np.bincount(np.asarray(train, np.uint8), minlength=VOCAB_SIZE).astype(np.float64)
  if test is None:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())
  counts = np.where(counts > 0, counts, 0.5)
  logp = np.log2(counts / counts.sum())
  return float(-(np.bincount(np.asarray(test, np.uint8), minlength=VOCAB_SIZE) * logp).sum() / len(test))


class TextPipeline(Iterator[dict[str, np.ndarray]]):
  """Windows of a byte string as next-byte prediction batches: ``{"inputs", "targets", "mask"}``.

  ``inputs`` and ``targets`` are int32 ``[B, seq_len]``, ``targets`` the inputs shifted by one
  byte; ``mask`` is float32 ``[B]`` (0 for the padding rows of the last eval batch).

  Training (``train=True``): the batch of step ``s`` (1-based) draws its ``global_batch_size``
  window starts uniformly from a generator seeded with ``(seed, s)``, so a run resumed at
  ``start_step`` gets the same batches as an uninterrupted one. Evaluation: ``eval_windows``
  windows spaced evenly over the split (all non-overlapping windows if it is 0 or more than fit),
  each predicting ``seq_len`` bytes, in fixed batches; :meth:`reset` starts over. Each process
  gets its own contiguous slice of every global batch.
  """

  def __init__(self, data: np.ndarray, *, seq_len: int, global_batch_size: int, train: bool,
               seed: int = 0, start_step: int = 0, eval_windows: int = 0, process_index: int = 0,
               process_count: int = 1):
    if seq_len < 1 or len(data) < seq_len + 2:
      raise ValueError(f"seq_len={seq_len} needs a text longer than {seq_len + 1} bytes; got {len(data)}")
    if global_batch_size < 1 or global_batch_size % process_count:
      raise ValueError(f"global_batch_size={global_batch_size} must be a positive multiple of "
                       f"process_count={process_count}")
    self.data, self.seq_len, self.train, self.seed = data, seq_len, train, seed
    self.global_batch_size, self.step = global_batch_size, start_step
    local = global_batch_size // process_count
    self.rows = slice(process_index * local, (process_index + 1) * local)
    fit = (len(data) - 1) // seq_len
    n = fit if eval_windows <= 0 else min(eval_windows, fit)
    self.eval_starts = (np.arange(n) * ((fit // n) * seq_len)).astype(np.int64)
    self._eval_at = 0

  @property
  def eval_bytes(self) -> int:
    """Bytes predicted in one pass of the evaluation."""
    return len(self.eval_starts) * self.seq_len

  def _windows(self, starts: np.ndarray) -> dict[str, np.ndarray]:
    w = self.data[starts[self.rows, None] + np.arange(self.seq_len + 1)].astype(np.int32)
    return {"inputs": w[:, :-1], "targets": w[:, 1:]}

  def __iter__(self) -> "TextPipeline":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self.train:
      self.step += 1
      rng = np.random.default_rng((self.seed, self.step))
      starts = rng.integers(0, len(self.data) - self.seq_len, self.global_batch_size)
      return dict(self._windows(starts), mask=np.ones(self.rows.stop - self.rows.start, np.float32))
    if self._eval_at >= len(self.eval_starts):
      raise StopIteration
    chunk = self.eval_starts[self._eval_at:self._eval_at + self.global_batch_size]
    self._eval_at += len(chunk)
    mask = np.zeros(self.global_batch_size, np.float32)
    mask[:len(chunk)] = 1.0
    padded = np.concatenate([chunk, np.zeros(self.global_batch_size - len(chunk), np.int64)])
    return dict(self._windows(padded), mask=mask[self.rows])

  def reset(self) -> "TextPipeline":
    """Back to the first eval batch (evaluation pipelines)."""
    self._eval_at = 0
    return self

  def __repr__(self) -> str:
    return (f"TextPipeline({len(self.data):,} bytes, seq_len={self.seq_len}, "
            f"global_batch_size={self.global_batch_size}, train={self.train})")


def bits_per_byte(nats_per_byte: float) -> float:
  """A loss in nats per byte in bits per byte."""
  return nats_per_byte / math.log(2.0)
