"""The files a run writes as it goes: ``config.json``, ``metrics.csv``, TensorBoard events.

Process 0 writes them (:func:`experiments.distributed.is_writer`); the columns
of ``metrics.csv`` are documented in :data:`CSV_DOC`. Every row of
``metrics.csv`` also goes to TensorBoard (:func:`metric_writer`), its numbers
as the scalars ``train/loss``, ``test/accuracy``, ``train/bytes_on_wire``, ...
``summary.json``, written at the end, is :mod:`experiments.summary`'s. This
module imports none of the run's set-up (:mod:`experiments.build`,
:mod:`experiments.loop`): they import it.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import logging as pylogging
import os
import socket
import sys
import time
from typing import Any, Iterator, Mapping

from absl import logging
import jax
import ml_collections
import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from experiments.distributed import is_writer


CSV_DOC = {
    "step": "training step after which the row was written (1-based)",
    "split": "train (means over the steps since the previous train row; rows close every "
             "log_every steps, at every checkpoint and at the end) or test",
    "loss": "cross-entropy (train: mean over workers and steps; test: over the test set)",
    "accuracy": "top-1 accuracy in [0, 1] (language models: of the next byte)",
    "bits_per_byte": "language models, test rows: the held-out loss in bits per byte (loss / ln 2)",
    "learning_rate": "learning rate of the last step",
    "bytes_on_wire": "bytes one worker handed to collectives per step (jaxcomp.metrics)",
    "peak_bytes_on_wire": "train rows: the largest bytes_on_wire of one step in the interval",
    "float32_bytes": "the same gradients as float32",
    "compression_ratio": "float32_bytes / bytes_on_wire",
    "encoded_bytes": "as bytes_on_wire, with exact variable-length encoding sizes",
    "bn_stats_bytes": "bytes of batch-norm statistics exchanged per step",
    "steps_per_sec": "training steps per second over the interval (wall clock)",
    "wall_time": "seconds since training started",
    "train_time": "seconds spent in training steps since training started: evaluations, "
                  "checkpoints and the first step of each invocation (it compiles) excluded",
}


_EVENT_FILES = itertools.count()  # this process's events files, for unique names


class ScalarWriter:
  """Scalars to the log and, unless ``just_logging``, to a TensorBoard events file in ``logdir``.

  Each call of :meth:`write_scalars` logs one line (``[step] name=value, ...``)
  and appends one event holding the values as ``tf.summary.scalar`` writes
  them (a float32 tensor tagged for TensorBoard's scalars plugin). The file is
  written with TensorBoard's own record writer and protocol buffers, so a run
  never imports TensorFlow for its logs (a few seconds of every start).
  """

  def __init__(self, logdir: str, just_logging: bool = False):
    self._records = None
    if not just_logging:
      os.makedirs(logdir, exist_ok=True)
      name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
              f"{os.getpid()}.{next(_EVENT_FILES)}.v2")
      self._records = RecordWriter(open(os.path.join(logdir, name), "wb"))
      self._append(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    logging.info("[%d] %s", step, ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in sorted(scalars.items())))
    if self._records is None:
      return
    event = event_pb2.Event(wall_time=time.time(), step=int(step))
    for tag, value in scalars.items():
      event.summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value)),
                              metadata=scalar_metadata.create_summary_metadata(None, None))
    self._append(event)

  def _append(self, event: event_pb2.Event) -> None:
    self._records.write(event.SerializeToString())
    self._records.flush()

  def close(self) -> None:
    if self._records is not None:
      self._records.close()
      self._records = None


def metric_writer(workdir: str) -> ScalarWriter:
  """TensorBoard events in ``workdir`` from process 0; the other processes only log the scalars."""
  return ScalarWriter(workdir, just_logging=jax.process_index() > 0)


def scalars(row: dict[str, Any]) -> dict[str, float]:
  """A ``metrics.csv`` row's numbers as TensorBoard scalars, named ``split/column``."""
  return {f"{row['split']}/{k}": v for k, v in row.items() if k not in ("step", "split")}


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Creates ``workdir``; process 0 writes the resolved config to ``config.json`` in it."""
  os.makedirs(workdir, exist_ok=True)
  if is_writer():
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json(indent=2))


def resume_metrics(path: str, start_step: int) -> list[dict[str, float]]:
  """The train rows up to ``start_step``; process 0 drops the rows written after it."""
  rows, fieldnames = [], None
  if os.path.exists(path):
    with open(path, newline="") as f:
      reader = csv.DictReader(f)
      fieldnames = reader.fieldnames
      rows = [r for r in reader if int(r["step"]) <= start_step]
  if jax.process_count() > 1:  # every process has read the file before process 0 rewrites it
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices("experiments.train: metrics.csv read")
  if fieldnames is not None and is_writer():
    with open(path, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=fieldnames)
      w.writeheader()
      w.writerows(rows)
  return [{k: float(v) for k, v in r.items() if k != "split" and v not in ("", None)}
          for r in rows if r["split"] == "train"]


INTERVAL_FILE = "metrics_interval.npz"


def save_interval(workdir: str, step: int, metrics: list[dict[str, Any]]) -> None:
  """Process 0 keeps the metrics of the steps after the last train row, up to ``step``.

  A run preempted in the middle of a logging interval saves them beside its
  checkpoint, so that the resumed run closes the interval with the same row
  (dtypes kept: the means are then the same bits).
  """
  if not is_writer():
    return
  fetched = jax.device_get(metrics)
  arrays = {k: np.stack([np.asarray(f[k]) for f in fetched]) for k in (fetched[0] if fetched else {})}
  path = os.path.join(workdir, INTERVAL_FILE)
  with open(path + ".tmp", "wb") as f:
    np.savez(f, step=np.int64(step), **arrays)
  os.replace(path + ".tmp", path)


def resume_interval(workdir: str, start_step: int) -> tuple[dict[str, Any], ...]:
  """The metrics :func:`save_interval` kept, if they were kept at ``start_step``; else none."""
  path = os.path.join(workdir, INTERVAL_FILE)
  if not start_step or not os.path.exists(path):
    return ()
  with np.load(path) as saved:
    if int(saved["step"]) != start_step:
      return ()
    arrays = {k: saved[k] for k in saved.files if k != "step"}
  count = len(next(iter(arrays.values()))) if arrays else 0
  return tuple({k: v[i] for k, v in arrays.items()} for i in range(count))


class CsvWriter:
  """Rows appended to a CSV file (its header first when the file is new), flushed as written."""

  def __init__(self, path: str, columns: list[str]):
    self.columns = columns
    new = not os.path.exists(path)
    self._f = open(path, "a", newline="")
    self._w = csv.DictWriter(self._f, fieldnames=columns, extrasaction="ignore")
    if new:
      self._w.writeheader()

  def write(self, row: dict[str, Any]) -> None:
    self._w.writerow({k: _fmt(v) for k, v in row.items()})
    self._f.flush()

  def close(self):
    self._f.close()


def _fmt(v):
  if isinstance(v, float):
    return f"{v:.6g}" if not v.is_integer() or abs(v) >= 1e15 else str(int(v))
  return v


def progress_bar(total: int, enabled: bool, desc: str):
  """A tqdm bar on stderr, or None when disabled or tqdm is missing."""
  if not enabled:
    return None
  try:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover
    return None
  return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, file=sys.stderr, leave=True)


class _AboveTheBar(pylogging.Handler):
  """A log handler's stand-in that drops orbax's INFO records and writes the rest above any progress bar.

  tqdm lifts its bars off their line while the record is written (``external_write_mode``)
  and redraws them under it, so a log line never lands in the middle of a bar. orbax logs
  some forty INFO lines per checkpoint (its handlers, threads and timings); its warnings
  and errors still pass.
  """

  def __init__(self, handler: pylogging.Handler):
    super().__init__()
    self.handler = handler

  def handle(self, record: pylogging.LogRecord) -> bool:
    if record.levelno < self.handler.level:  # the level the logger would have checked
      return False
    if record.levelno < pylogging.WARNING and f"{os.sep}orbax{os.sep}" in record.pathname:
      return False
    try:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    except ImportError:  # pragma: no cover  (no bar either: progress_bar)
      return self.handler.handle(record)
    with tqdm.external_write_mode(file=sys.stderr):
      return self.handler.handle(record)

  def emit(self, record: pylogging.LogRecord) -> None:  # only reached through handle
    self.handler.emit(record)


@contextlib.contextmanager
def logs_above_the_bar() -> Iterator[None]:
  """For a run: every log line is written above the progress bar, none of orbax's INFO lines.

  The root logger's handlers (absl's, under ``python -m experiments.train``) are replaced
  by :class:`_AboveTheBar` stand-ins for the run and restored after it.
  """
  root = pylogging.getLogger()
  handlers = list(root.handlers)
  for handler in handlers:
    root.removeHandler(handler)
    root.addHandler(_AboveTheBar(handler))
  try:
    yield
  finally:
    for stand_in in [h for h in root.handlers if isinstance(h, _AboveTheBar)]:
      root.removeHandler(stand_in)
      if stand_in.handler in handlers:
        root.addHandler(stand_in.handler)

