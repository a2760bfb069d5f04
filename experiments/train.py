r"""Data-parallel training with compressed gradient exchange.

Usage::

  python -m experiments.train list                                # the configs
  python -m experiments.train list configs/terngrad_lenet.py      # a config's fields and defaults
  python -m experiments.train --config configs/terngrad_lenet.py --workdir /tmp/run
  python -m experiments.train --config configs/terngrad_lenet.py:runlocal --workdir /tmp/run \
      --config.workers=8 --config.num_train_steps=200 --config.compressor=none

``train_and_evaluate(config, workdir)`` is importable (the Flax examples' layout);
its steps live in modules named for what they do:

* :mod:`experiments.distributed`: multi-process set-up (``jax.distributed``);
* :mod:`experiments.validation`: configuration checks;
* :mod:`experiments.optimizers`: the optax chain (schedule, optimizer, compression);
* :mod:`experiments.step`: the training and evaluation steps (how a step runs);
* :mod:`experiments.state`: the train state, the mesh, shardings, checkpoints;
* :mod:`experiments.build`: building a run and restoring it;
* :mod:`experiments.loop`: the training loop with its logging and checkpoints;
* :mod:`experiments.writers`: ``config.json``, ``metrics.csv``, TensorBoard;
* :mod:`experiments.summary`: ``summary.json``.

Outputs in ``workdir``:

* ``metrics.csv``: one row per logged training interval (``split=train``:
  means over the interval) and per evaluation (``split=test``); the columns
  are documented in :data:`experiments.writers.CSV_DOC`.
* ``events.out.tfevents.*``: the rows of ``metrics.csv`` as TensorBoard scalars
  (``train/loss``, ``test/accuracy``, ...) and the progress reports (``steps_per_sec``, ``uptime``);
  ``plugins/profile/``: the profiler trace of ``config.trace_step``, if set.
* ``summary.json``: config, final test accuracy, bytes on the wire, timing.
* ``config.json``: the resolved config.
* ``checkpoints/``: orbax checkpoints (with ``config.checkpoint_every > 0``);
  ``checkpoints.damaged/``: those that failed to read, moved aside;
  ``metrics_interval.npz``: a preempted run's open train interval.

Exit codes: 0 done; 2 a usage error (a misspelt field or name, a dataset that
is not on this machine: one line on stderr, nothing written); 75
(:data:`experiments.preemption.PREEMPTED_EXIT_CODE`) preempted by SIGTERM after
saving a checkpoint: run the same command again to resume; 1 an error.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from experiments import cli

if __name__ == "__main__":
  # --help, list and misspelt fields, before absl parses the flags and before the imports below
  # (TensorFlow's, through the data pipeline) print their start-up lines: one line, exit code 2.
  cli.main_or_exit(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from experiments import build
from experiments import distributed
from experiments import loop
from experiments import preemption
from experiments import summary
from experiments import validation
from experiments import writers
from jaxcomp import data as data_lib


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: Optional[int] = None) -> dict[str, Any]:
  """Trains ``config.model`` on ``config.dataset`` and evaluates it; returns the summary.

  The run is a sequence of named steps:
  :func:`experiments.distributed.initialize_distributed`,
  :func:`experiments.validation.validate_config`, :func:`experiments.build.build`,
  :func:`experiments.build.restore`, :func:`experiments.loop.loop` (which calls
  :func:`experiments.step.evaluate`), optionally
  :func:`experiments.loop.profile_step`, and :func:`experiments.summary.write`.

  With ``config.checkpoint_every > 0`` the run saves checkpoints in
  ``workdir/checkpoints`` (orbax) and resumes from the latest one when
  started again with the same workdir: parameters, optimizer state with every
  error-feedback residual and PRNG key, EMA, and the step, from which the data
  stream and all randomness continue exactly (a resumed run ends bit-identical
  to an uninterrupted one; ``tests/test_resume.py``). A checkpoint that fails
  to read is moved to ``workdir/checkpoints.damaged`` and the next older one
  is tried; with none left the run stops (raises
  :class:`experiments.state.CheckpointError`) unless
  ``config.start_afresh_if_unreadable``.

  On SIGTERM (preemption) every process finishes its step, all stop after the
  same one, save a checkpoint of it and the metrics up to it, and
  :class:`experiments.preemption.Preempted` is raised: a ``SystemExit`` with
  code :data:`experiments.preemption.PREEMPTED_EXIT_CODE` (75), "preempted;
  run again to resume" (``tests/test_resume.py``).

  Args:
    config: the experiment config (see ``configs/common.py``).
    workdir: output directory (shared by all processes of a multi-process run).
    stop_after_steps: stop after this many steps of this invocation, as if the
      process had been killed (for preemption tests); no final evaluation.
  """
  config = ml_collections.ConfigDict(config)  # a private, unlocked copy
  distributed.initialize_distributed(config)
  validation.validate_config(config)
  with preemption.Watcher() as watcher, writers.logs_above_the_bar():
    run = build.build(config, workdir)
    start = build.restore(run)
    end = loop.loop(run, start, stop_after_steps, watcher)
  if end.preempted:
    checkpoint = run.checkpointer.step_path(end.step) if run.checkpointer is not None else None
    stop = preemption.Preempted(end.step, checkpoint)
    logging.warning("%s: run the same command again to resume", stop)
    raise stop
  if end.step < config.num_train_steps:  # stopped early (preemption test)
    return {"steps": end.step, "stopped_early": True}
  timing = loop.profile_step(run, end.state) if config.profile_steps else {}
  return summary.write(run, start, end, timing)


FLAGS = flags.FLAGS


def main(argv):
  """The command line: ``--config`` (with ``--config.KEY=VALUE`` overrides) and ``--workdir``."""
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  with cli.usage_errors():
    try:
      train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except data_lib.DatasetNotAvailableError as e:  # one line with the flags that fix it, exit code 2
      raise cli.UsageError(cli.missing_dataset(FLAGS.config, e)) from None


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and the summary.")
  config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
