"""What ``experiments.launch --max-restarts`` says when it restarts: the step the run resumes from.

After a process died, the launcher starts every process again and each
resumes from the newest checkpoint that every process has completely
(:meth:`experiments.state.Checkpointer.restore` decides, the processes
agreeing). Before it starts them, the launcher names that step in its line
about the failure: the newest step of the run's checkpoint directory whose
every process's part is as sealed (:mod:`experiments.seals`), the check the
processes make first.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from experiments import seals


def checkpoint_dir(program: Sequence[str], given: Optional[str] = None) -> Optional[str]:
  """``given``, else ``WORKDIR/checkpoints`` of the program's ``--workdir`` (``experiments.train``'s flag)."""
  if given:
    return given
  for i, arg in enumerate(program):
    if arg == "--workdir" and i + 1 < len(program):
      return os.path.join(program[i + 1], "checkpoints")
    if arg.startswith("--workdir="):
      return os.path.join(arg.split("=", 1)[1], "checkpoints")
  return None


def resume_step(directory: str, processes: int) -> Optional[int]:
  """The newest step in ``directory`` whose every process's part is as sealed; None if none is."""
  steps = sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True) if os.path.isdir(
      directory) else []
  for step in steps:
    step_dir = os.path.join(directory, str(step))
    if all(seals.check(step_dir, p) is None for p in range(processes)):
      return step
  return None


def resume_point(directory: Optional[str], processes: int) -> str:
  """Where the restarted processes resume, in words."""
  if directory is None:
    return "resuming from the newest checkpoint the program finds (give --checkpoints to name it)"
  step = resume_step(directory, processes)
  if step is None:
    return f"starting from step 0 (no checkpoint in {directory} that every process has completely)"
  return f"resuming from step {step} (the newest checkpoint in {directory} that every process has completely)"
