"""One process of a multi-process training run, set up from the environment.

Usage (from the repository root)::

  JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT JAXCOMP_NUM_PROCESSES=2 JAXCOMP_PROCESS_ID=I \
  XLA_FLAGS=--xla_force_host_platform_device_count=4 \
      python tests/multiprocess/train_worker.py OUT_DIR COMPRESSOR[,COMPRESSOR...] \
          [--steps=S] [--checkpoint_every=C] [--heartbeat=SECONDS] [--die_after_checkpoint=K]

Runs ``experiments.train.train_and_evaluate`` of ``train_config.config(name)``
for every name into ``OUT_DIR/name`` and prints each summary as a JSON line;
``experiments.train`` initializes ``jax.distributed`` itself from the
environment. ``--die_after_checkpoint=K``: process 1 SIGKILLs itself once the
checkpoint of step K is complete (a failure, for the resume test).
"""

import json
import os
import signal
import sys

# This directory (train_config) is on sys.path already; add the repository root.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

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


def main(argv):
  out_dir, names = argv[1], argv[2].split(",")
  opts = dict(a[2:].split("=", 1) for a in argv[3:])
  kwargs = {k: int(opts[k]) for k in ("steps", "checkpoint_every", "heartbeat") if k in opts}
  if "die_after_checkpoint" in opts and os.environ["JAXCOMP_PROCESS_ID"] == "1":
    die_after_checkpoint(int(opts["die_after_checkpoint"]))
  for name in names:
    summary = train.train_and_evaluate(train_config.config(name, **kwargs), os.path.join(out_dir, name))
    print(json.dumps({"compressor": name, "summary": summary}), flush=True)


if __name__ == "__main__":
  main(sys.argv)
