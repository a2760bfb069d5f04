"""README's Flax NNX and wrapper sections run, after the Use example they build on, and say what they print.

As tests/test_readme.py: the blocks run as one program in a fresh interpreter
(8 host devices), here only the first Use block and these sections' blocks.
"""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _python_blocks(text):
  return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_nnx_and_wrapper_sections_run(tmp_path):
  use = README.split("## Use\n", 1)[1]
  sections = re.search(r"^### Flax NNX\n(.*?)(?=^## )", README, flags=re.S | re.M).group(1)
  blocks = _python_blocks(use)[:1] + _python_blocks(sections)
  assert len(blocks) == 4, "the Use example, NNX under vmap and shard_map, multi_steps"
  program = tmp_path / "readme_sections.py"
  program.write_text("\n".join(blocks))
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.strip().splitlines()[1:]  # after the Use example's line
  # NNX under vmap learns the toy task (chance is log 10) ...
  m = re.fullmatch(r"nnx vmap: loss ([\d.]+)", lines[0])
  assert m and float(m[1]) < 0.5 * np.log(10), out.stdout
  # ... and shard_map over 8 devices gives the same parameters: within 1e-7 for the first 60 steps;
  # later a rounding difference can flip one of TernGrad's random draws (a change of about 1e-3).
  # Gradients summed over devices instead of per worker would be off by about 1.
  m = re.search(r"nnx shard_map: largest difference from vmap ([\d.e+-]+)", lines[1])
  assert m and float(m[1]) < 1e-2, out.stdout
  # multi_steps(tx, 4): bytes on the 4th and 8th steps only, the same both times.
  m = re.fullmatch(r"multi_steps: bytes on the wire per step \[([\d, ]+)\]", lines[2])
  wire = [int(v) for v in m[1].split(",")] if m else None
  assert wire and wire[3] == wire[7] > 0 and wire[:3] == wire[4:7] == [0, 0, 0], out.stdout
