"""The training loop, with its logging and checkpoints, and the timing of extra steps after it."""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, NamedTuple, Optional

from absl import logging
import jax
import numpy as np

from experiments import optimizers
from experiments import preemption
from experiments import step as step_lib
from experiments import writers
from experiments.build import Run, Start
from experiments.distributed import is_writer
from experiments.state import TrainState
import jaxcomp


class End(NamedTuple):
  """Where a run's loop ended."""

  state: TrainState
  step: int  # the last step done
  history: list[dict[str, float]]  # every train row
  last_eval: dict[str, float]  # the last evaluation ({} if none)
  wall_time: float  # seconds since the run (not this invocation) started
  train_time: float  # seconds of it spent in training steps (CSV_DOC["train_time"])
  preempted: bool = False  # stopped after ``step`` by SIGTERM (experiments.preemption)


def loop(run: Run, start: Start, stop_after_steps: Optional[int] = None,
         watcher: Optional[preemption.Watcher] = None) -> End:
  """Trains from ``start.step`` to the end, or for ``stop_after_steps`` steps, or until preempted.

  Logs train rows, evaluates every ``eval_every`` steps and at the end, and
  saves checkpoints every ``checkpoint_every`` steps and at the end; after
  every step, reports progress and takes the profiler trace (:class:`_Log`).
  After every step it asks ``watcher`` whether to stop (SIGTERM); if so, it
  does the step's scheduled work, saves a checkpoint of the step and the
  metrics of its open train interval, and returns with ``preempted``.
  """
  c = run.config
  train_iter = run.train_pipeline(start.step)
  state, step, last_eval, preempted = start.state, start.step, {}, False
  last_step = c.num_train_steps
  if stop_after_steps is not None:
    last_step = min(last_step, start.step + stop_after_steps)
  log = _Log(run, start, last_step)
  for step in range(start.step + 1, last_step + 1):
    images, labels = run.shard_batch(next(train_iter))
    key = np.asarray(jax.random.fold_in(run.step_root, step))  # host value: the same in every process
    state, metrics = run.train_step(state, images, labels, key)
    if step == start.step + 1:
      log.exclude(state)  # the first step compiles: not training time
    log.step_done(step, state)
    final = step == c.num_train_steps
    preempted = watcher is not None and watcher.reached(step) and not final
    scheduled = run.checkpointer is not None and (step % c.checkpoint_every == 0 or final)
    checkpoint_now = scheduled or (preempted and run.checkpointer is not None)
    # A train row closes at every scheduled checkpoint too, so a resumed run writes the same
    # rows; a preempted step keeps its open interval for the resumed run instead.
    log.train(step, metrics, close=step % c.log_every == 0 or final or scheduled)
    evaluate_now = (c.eval_every and step % c.eval_every == 0) or final
    if evaluate_now or checkpoint_now:
      log.pause(state)
    if evaluate_now:
      last_eval = log.test(step, run.evaluate(state))
    if preempted:
      writers.save_interval(run.workdir, step, log.pending)
    if checkpoint_now:
      run.checkpointer.save(step, state)
    if preempted:
      break
    if evaluate_now or checkpoint_now:
      log.resume()
  log.pause(state)
  log.close()
  if run.checkpointer is not None:
    run.checkpointer.close()
  return End(state, step, log.history, last_eval, log.elapsed(), log.train_time(), preempted)


class TrainClock:
  """Seconds spent training: a stopwatch that evaluations and checkpoints pause.

  Args:
    total: seconds already counted (a resumed run's).
    now: the time source.
  """

  def __init__(self, total: float = 0.0, now: Callable[[], float] = time.time):
    self.now, self.counted, self.mark = now, float(total), now()

  def total(self) -> float:
    return self.counted + (self.now() - self.mark if self.mark is not None else 0.0)

  def pause(self) -> None:
    self.counted, self.mark = self.total(), None

  def resume(self) -> None:
    """Counts from now on; time since the last pause or resume is dropped (it was not training)."""
    self.mark = self.now()


class _Log:
  """The rows of ``metrics.csv`` and TensorBoard (from process 0), progress, and the history.

  Args:
    run: the run.
    start: where this invocation starts.
    last_step: the step it ends at.
  """

  def __init__(self, run: Run, start: Start, last_step: int):
    self.run = run
    self.history = list(start.history)
    columns = list(writers.CSV_DOC)
    extra = [k for k in jax.eval_shape(jaxcomp.metrics, run.state.opt_state) if k not in columns]
    if run.config.get("log_norms", False):
      extra += list(step_lib.NORMS)
    self.writer = (writers.CsvWriter(os.path.join(run.workdir, "metrics.csv"), columns + extra)
                   if is_writer() else None)
    c = run.config
    self.bar = writers.progress_bar(c.num_train_steps, c.progress and is_writer(),
                                    f"{c.model}/{c.compressor}/N={c.workers}")
    self.summary = writers.metric_writer(run.workdir)
    self.hooks, self.trace_bounds = _periodic_actions(run, start.step, last_step, self.summary)
    if self.bar is not None and start.step:
      self.bar.update(start.step)
    self.t_start = time.time() - (self.history[-1]["wall_time"] if self.history else 0.0)
    self.t_interval = time.time()
    # A resumed run continues the count of its last train row.
    self.clock = TrainClock(self.history[-1].get("train_time", 0.0) if self.history else 0.0)
    # Each step's metrics since the last train row (a preempted run's, when resuming).
    self.pending: list[dict[str, jax.Array]] = list(start.interval)

  def elapsed(self) -> float:
    return time.time() - self.t_start

  def train_time(self) -> float:
    return self.clock.total()

  def pause(self, state) -> None:
    """Stops the training clock once the steps dispatched so far have run."""
    jax.block_until_ready(state)
    self.clock.pause()

  def resume(self) -> None:
    self.clock.resume()

  def exclude(self, state) -> None:
    """Drops the time until ``state`` is ready from the training clock (a compiling step)."""
    jax.block_until_ready(state)
    self.clock.resume()

  def step_done(self, step: int, state) -> None:
    """Runs the periodic actions after ``step``: the progress report and the profiler trace."""
    if step in self.trace_bounds:  # the trace holds the whole of trace_step and nothing else
      jax.block_until_ready(state)
    for hook in self.hooks:
      hook(step)

  def train(self, step: int, metrics: dict[str, jax.Array], close: bool) -> None:
    """Adds a step's metrics; ``close``: writes the interval's means as a train row."""
    self.pending.append(metrics)
    if close:
      fetched = jax.device_get(self.pending)
      now = time.time()
      row = {k: float(np.mean([f[k] for f in fetched])) for k in fetched[0]}
      if "bytes_on_wire" in row:  # a step's exchange, not a mean: Streaming DiLoCo's claim is about the peak
        row["peak_bytes_on_wire"] = float(max(np.max(f["bytes_on_wire"]) for f in fetched))
      lr_step = int((step - 1) * optimizers.updates_per_step(self.run.config))
      row.update(step=step, split="train", learning_rate=float(self.run.schedule(lr_step)),
                 steps_per_sec=len(fetched) / max(now - self.t_interval, 1e-9),
                 wall_time=now - self.t_start, train_time=self.train_time())
      if not math.isfinite(row["loss"]):
        logging.warning("step %d: the training loss is %s", step, row["loss"])
      self._write(row)
      self.history.append(row)
      self.pending, self.t_interval = [], now
      if self.bar is not None:
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", acc=f"{row['accuracy']:.3f}",
                             wire=f"{row['bytes_on_wire'] / 1e3:.1f}kB")
    if self.bar is not None:
      self.bar.update(1)

  def test(self, step: int, res: dict[str, float]) -> dict[str, float]:
    """Writes an evaluation's row; returns it with its step."""
    row = {"step": step, "split": "test", "loss": res["loss"], "accuracy": res["accuracy"],
           "wall_time": self.elapsed(), "train_time": self.train_time()}
    if "bits_per_byte" in res:
      row["bits_per_byte"] = res["bits_per_byte"]
    self._write(row)
    logging.info("step %d: test accuracy %.4f, test loss %.4f%s", step, res["accuracy"], res["loss"],
                 f", {res['bits_per_byte']:.4f} bits/byte" if "bits_per_byte" in res else "")
    return dict(res, step=step)

  def _write(self, row: dict[str, Any]) -> None:
    if self.writer is not None:
      self.writer.write(row)
    self.summary.write_scalars(int(row["step"]), writers.scalars(row))

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
    if self.writer is not None:
      self.writer.close()
    self.summary.close()


class _ProgressReport:
  """Every minute and after the last step: steps/s, the share done and the ETA in the log,
  ``steps_per_sec`` and ``uptime`` to TensorBoard.

  Args:
    num_train_steps: the run's last step.
    writer: where the two scalars go (:func:`experiments.writers.metric_writer`).
  """

  EVERY_SECS = 60.0

  def __init__(self, num_train_steps: int, writer: writers.ScalarWriter):
    self.num_train_steps, self.writer = num_train_steps, writer
    self.t0 = time.monotonic()
    self.last: Optional[tuple[int, float]] = None  # (step, time) of the last report or first call

  def __call__(self, step: int) -> None:
    t = time.monotonic()
    if self.last is None:
      self.last = (step, t)
      return
    last_step, last_t = self.last
    if step == last_step or (t - last_t <= self.EVERY_SECS and step != self.num_train_steps):
      return
    steps_per_sec = (step - last_step) / max(t - last_t, 1e-9)
    eta_min = int((self.num_train_steps - step) / steps_per_sec / 60)
    logging.info("%.1f steps/s, %.1f%% (%d/%d), ETA: %dm", steps_per_sec,
                 100 * step / self.num_train_steps, step, self.num_train_steps, eta_min)
    self.writer.write_scalars(step, {"steps_per_sec": steps_per_sec})
    self.writer.write_scalars(step, {"uptime": t - self.t0})
    self.last = (step, t)


class _Trace:
  """A profiler trace (``jax.profiler``, into ``logdir``) from after step ``bounds[0]`` to after ``bounds[1]``."""

  def __init__(self, logdir: str, bounds: tuple[int, int]):
    self.logdir, self.bounds, self.running = logdir, bounds, False

  def __call__(self, step: int) -> None:
    if step == self.bounds[0]:
      try:
        jax.profiler.start_trace(self.logdir)
        self.running = True
      except RuntimeError as e:  # another trace is running in this process: the run goes on without
        logging.exception("could not start the profiler trace: %s", e)
    elif step == self.bounds[1] and self.running:
      jax.profiler.stop_trace()
      self.running = False


def _periodic_actions(run: Run, first_step: int, last_step: int,
                      writer: writers.ScalarWriter) -> tuple[list[Any], tuple[int, ...]]:
  """The progress report and, from process 0, the trace of ``config.trace_step``.

  The trace starts after the step before ``trace_step`` and stops after
  ``trace_step``: it is taken when this invocation runs both.

  Returns:
    The actions to call after every step, and the steps that bound the trace
    (empty without one).
  """
  c = run.config
  actions: list[Any] = [_ProgressReport(c.num_train_steps, writer)]
  bounds = (c.trace_step - 1, c.trace_step)
  if not (is_writer() and first_step < bounds[0] and bounds[1] <= last_step):
    return actions, ()
  actions.append(_Trace(run.workdir, bounds))
  return actions, bounds


def profile_step(run: Run, state: TrainState) -> dict[str, float]:
  """Median time of a whole step and of its gradient computation alone.

  ``exchange_time_sec`` = step − compute: compression, the collectives,
  decompression and the optimizer update. With simulated workers there is no
  network, so this is the compute cost of the exchange on this machine.
  Measured after training on ``config.profile_steps`` extra steps whose
  results are discarded (``state`` is donated to them).
  """
  config = run.config
  loss_fn = step_lib.make_loss_fn(config, run.model, run.spec.num_classes, run.has_bn)
  grads = jax.vmap(lambda p, bs, x, y, k: step_lib.loss_and_grad(config, loss_fn, p, bs, x, y, k)[0],
                   in_axes=(None, None, 0, 0, None))
  grads_fn = jax.jit(lambda p, *rest: grads(run.whole_params(p), *rest))  # whole: ZeRO-3's are sharded
  train_iter = run.train_pipeline(config.num_train_steps)
  batches = [run.shard_batch(next(train_iter)) for _ in range(3)]
  t_step, t_grad = [], []
  s = state
  for i in range(config.profile_steps + 2):  # two warm-up rounds
    images, labels = batches[i % 3]
    key = np.asarray(jax.random.fold_in(run.step_root, 2**30 + i))
    t0 = time.perf_counter()
    s, m = run.train_step(s, images, labels, key)
    jax.block_until_ready(m)
    t1 = time.perf_counter()
    jax.block_until_ready(grads_fn(s.params, s.batch_stats, images, labels, key))
    t2 = time.perf_counter()
    if i >= 2:
      t_step.append(t1 - t0)
      t_grad.append(t2 - t1)
  step_t, grad_t = float(np.median(t_step)), float(np.median(t_grad))
  return {"step_time_sec": step_t, "compute_time_sec": grad_t,
          "exchange_time_sec": max(step_t - grad_t, 0.0)}
