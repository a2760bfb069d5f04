"""One process of a multi-process training run, set up from the environment.

Usage (from the repository root)::

  JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT JAXCOMP_NUM_PROCESSES=2 JAXCOMP_PROCESS_ID=I \
  XLA_FLAGS=--xla_force_host_platform_device_count=4 \
      python tests/multiprocess/train_worker.py OUT_DIR COMPRESSOR[@LABEL][,...] \
          [--steps=S] [--checkpoint_every=C] [--heartbeat=SECONDS] [--die_after_checkpoint=K] \
          [--sigterm_parent_at=K] [--stop_after_steps=K]

Runs ``experiments.train.train_and_evaluate`` of ``train_config.config(name)``
for every name into ``OUT_DIR/name`` (``OUT_DIR/name@label`` with a label)
and prints each summary as a JSON line; ``experiments.train`` initializes
``jax.distributed`` itself from the environment. ``--stop_after_steps=K``:
each run stops after K steps of this invocation (0: it only restores).
``--die_after_checkpoint=K``: process 1 SIGKILLs itself once the
checkpoint of step K is complete (a failure, for the resume test).
``--sigterm_parent_at=K``: process 1 sends SIGTERM to its parent (the
launcher) after step K, then waits for JAX's preemption notice to reach every
process (a preemption, for the preemption test).
"""

import json
import os
import signal
import sys
import time

# This directory (train_config) is on sys.path already; add the repository root.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments import preemption  # noqa: E402
from experiments import state as state_lib  # noqa: E402
from experiments import train  # noqa: E402
import train_config  # noqa: E402


def die_after_checkpoint(step_to_die: int) -> None:
  """Makes this process SIGKILL itself right after the checkpoint of ``step_to_die`` is complete."""
  save = state_lib.Checkpointer.save

  def save_then_die(self, step, state):
    save(self, step, state)
    if step == step_to_die:
      self._mngr.wait_until_finished()  # pylint: disable=protected-access
      print(f"worker: SIGKILL after the checkpoint of step {step}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)

  state_lib.Checkpointer.save = save_then_die


def sigterm_parent_at(step_to_signal: int) -> None:
  """Makes this process SIGTERM its parent after ``step_to_signal``, as a scheduler would the launcher.

  JAX's notifier looks for SIGTERM once a second; this process waits 3 s
  before going on, so that every process has the notice while the others are
  at most a step or two ahead (they wait for this one's collectives), and
  the sync point falls within a short run.
  """
  reached = preemption.Watcher.reached

  def signal_then_reached(self, step):
    if step == step_to_signal:
      print(f"worker: SIGTERM to the launcher after step {step}", flush=True)
      os.kill(os.getppid(), signal.SIGTERM)
      time.sleep(3)
    return reached(self, step)

  preemption.Watcher.reached = signal_then_reached


def main(argv):
  out_dir, names = argv[1], argv[2].split(",")
  opts = dict(a[2:].split("=", 1) for a in argv[3:])
  kwargs = {k: int(opts[k]) for k in ("steps", "checkpoint_every", "heartbeat") if k in opts}
  stop = int(opts["stop_after_steps"]) if "stop_after_steps" in opts else None
  rank1 = os.environ["JAXCOMP_PROCESS_ID"] == "1"
  if "die_after_checkpoint" in opts and rank1:
    die_after_checkpoint(int(opts["die_after_checkpoint"]))
  if "sigterm_parent_at" in opts and rank1:
    sigterm_parent_at(int(opts["sigterm_parent_at"]))
  for name in names:
    summary = train.train_and_evaluate(train_config.config(name.split("@")[0], **kwargs),
                                       os.path.join(out_dir, name), stop_after_steps=stop)
    print(json.dumps({"compressor": name, "summary": summary}), flush=True)


if __name__ == "__main__":
  main(sys.argv)
