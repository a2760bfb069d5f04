"""A benchmark's results as a run directory that ``experiments.report`` reads.

``<out>/<dataset>/<name>/`` holds ``results.json`` (the measurements),
``config.json`` (``{"experiment": ..., arguments}``: what makes the report's
loader list it beside the experiment's training runs) and ``command.txt``
(the command that wrote it).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any, Optional, Sequence


def write_run_dir(out: str, experiment: str, name: str, res: dict[str, Any], args: dict[str, Any],
                  module: str, argv: Optional[Sequence[str]] = None) -> str:
  """Writes ``res`` under ``<out>/<res["dataset"]>/<name>/``; returns that directory."""
  d = os.path.join(out, res["dataset"], name)
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "results.json"), "w") as f:
    json.dump(res, f, indent=1)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"experiment": experiment, **args, "dataset": res["dataset"]}, f, indent=2)
  with open(os.path.join(d, "command.txt"), "w") as f:
    f.write(shlex.join(["python", "-m", module] + list(sys.argv[1:] if argv is None else argv)) + "\n")
  return d
