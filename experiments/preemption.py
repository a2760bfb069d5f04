"""Preemption: on SIGTERM a run finishes its step, saves, and exits with :data:`PREEMPTED_EXIT_CODE`.

Clusters end jobs with SIGTERM and a grace period before SIGKILL: SLURM at a
time limit or ``scancel`` (``KillWait``, 30 s by default), Kubernetes
(``terminationGracePeriodSeconds``, 30 s), spot and preemptible machines.
``experiments.train`` turns that SIGTERM into a clean stop:

* every process finishes the step it is in, and all of them agree on one
  step: with one process, the step during which SIGTERM arrived; with
  several, JAX's preemption sync point
  (``jax.experimental.multihost_utils.reached_preemption_sync_point``: JAX's
  preemption notifier catches SIGTERM in each process, tells the others
  through the coordination service, and the first step no process has
  passed yet is the one they stop after);
* the step's scheduled work is done (an evaluation due at it), a checkpoint
  of it and the metrics up to it are written (``metrics.csv``; the train
  interval still open is kept beside it in ``metrics_interval.npz``, so a
  resumed run writes the same rows as one never stopped);
* the processes exit with :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``
  of ``sysexits.h``: a temporary failure, run the same command again to
  resume). ``experiments.launch`` passes it through. 143 (128 + SIGTERM)
  keeps its meaning: killed by SIGTERM before anything could be saved.

Run again with the same workdir, the run resumes from that checkpoint and
ends bit-identical to an uninterrupted one (``tests/test_resume.py``,
``tests/test_multiprocess_train.py``).
Without checkpoints (``checkpoint_every=0``) nothing can be saved: the run
still stops at the agreed step and exits with the code, and a rerun starts
afresh.

A SIGTERM that arrives while the run is set up (compiling, restoring) is
acted on after the first step. One process installs a Python handler for
SIGTERM for the duration of :func:`experiments.train.train_and_evaluate`
(and puts the previous one back); several rely on JAX's notifier, which
``jax.distributed.initialize`` installs.
"""

from __future__ import annotations

import signal
import threading
from typing import Optional

from absl import logging

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: preempted, a checkpoint was saved; run again to resume


class Preempted(SystemExit):
  """Raised by ``train_and_evaluate`` after a preempted run saved its step.

  A ``SystemExit``: uncaught, the interpreter exits with
  :data:`PREEMPTED_EXIT_CODE` and prints no traceback; ``except Exception``
  does not swallow it.
  """

  def __init__(self, step: int, checkpoint: Optional[str]):
    super().__init__(PREEMPTED_EXIT_CODE)
    self.step = step
    self.checkpoint = checkpoint  # the checkpoint's directory (None: checkpoints are off)

  def __str__(self) -> str:
    saved = f"saved {self.checkpoint}" if self.checkpoint else "checkpoints are off: nothing saved"
    return f"preempted after step {self.step} ({saved}); exit code {PREEMPTED_EXIT_CODE}"


class Watcher:
  """Whether the run was told to stop (SIGTERM), asked by every process after every step.

  A context manager: with one process it installs the SIGTERM handler on
  entry and puts the previous one back on exit.
  """

  def __init__(self):
    import jax  # pylint: disable=g-import-not-at-top

    self.multi_process = jax.process_count() > 1
    self.signum: Optional[int] = None  # the signal received (one process)
    self._previous = None
    self._sync_point_works = True

  def __enter__(self) -> "Watcher":
    if not self.multi_process:
      if threading.current_thread() is threading.main_thread():
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
      else:
        logging.warning("not in the main thread: SIGTERM will end this run without saving")
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _on_signal(self, signum, frame) -> None:  # pylint: disable=unused-argument
    if self.signum is None:
      self.signum = signum

  def reached(self, step: int) -> bool:
    """Whether to stop after ``step``; every process calls it after every step, the same steps."""
    if self.multi_process:
      return self._sync_point(step)
    if self.signum is not None:
      logging.warning("received %s: stopping after step %d to save it",
                      signal.Signals(self.signum).name, step)
      return True
    return False

  def _sync_point(self, step: int) -> bool:
    if not self._sync_point_works:
      return False
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    try:
      reached = multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError as e:  # jax_enable_preemption_service is off
      logging.warning("JAX's preemption service is off (%s): SIGTERM will end this run "
                      "without saving", e)
      self._sync_point_works = False
      return False
    if reached:
      logging.warning("preemption: every process stops after step %d to save it", step)
    return reached
