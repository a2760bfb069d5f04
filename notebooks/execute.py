"""Execute the notebooks and commit them with their outputs: ``make notebooks``.

Each ``notebooks/NN_*.py`` (jupytext percent format) is the source; this script
builds its ``.ipynb`` from it, runs every cell in a fresh kernel from the
repository root (one CPU device, as on Colab) and writes the notebook with its
printed tables and plots. A notebook is therefore always the output of exactly
its paired ``.py`` (``tests/test_notebooks.py`` checks the cells match and that
every code cell ran, in order, in one kernel).

    python notebooks/execute.py                    # all notebooks, their default scale
    python notebooks/execute.py notebooks/01_quickstart.py
    JAXCOMP_NOTEBOOK_STEPS=12 JAXCOMP_NOTEBOOK_TINY=1 python notebooks/execute.py --out /tmp/nb

The scale is each notebook's own default (stated in its first cell);
``JAXCOMP_NOTEBOOK_STEPS`` and ``JAXCOMP_NOTEBOOK_TINY`` override it (the test
suite runs them tiny). Progress (cell by cell, with times) goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import jupytext
import nbformat
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parent
ROOT = NOTEBOOKS.parent


def sources() -> list[pathlib.Path]:
  """The notebooks' paired ``.py`` sources, in order."""
  return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def kernel_env() -> dict[str, str]:
  """The kernel's environment: one CPU device (the test session asks for 8), inline plots."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = ""
  env.pop("MPLBACKEND", None)  # the inline backend of ipykernel puts the figures in the notebook
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  return env


class _ProgressClient(NotebookClient):
  """A NotebookClient that says which cell it runs and how long each took."""

  def __init__(self, *args, name: str, **kwargs):
    super().__init__(*args, **kwargs)
    self._name = name
    self._code_cells = sum(c.cell_type == "code" for c in self.nb.cells)
    self._done = 0

  async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
    if cell.cell_type != "code":
      return await super().async_execute_cell(cell, cell_index, *args, **kwargs)
    start = time.time()
    out = await super().async_execute_cell(cell, cell_index, *args, **kwargs)
    self._done += 1
    print(f"  {self._name}: cell {self._done}/{self._code_cells} done in {time.time() - start:.0f}s",
          file=sys.stderr, flush=True)
    return out


def execute(py: pathlib.Path, out_dir: pathlib.Path | None = None, timeout: int = 3600) -> pathlib.Path:
  """Builds ``py``'s notebook, runs it from the repository root and writes it; returns its path.

  Raises:
    nbclient.exceptions.CellExecutionError: a cell raised (the notebook is not written).
  """
  nb = jupytext.read(py)
  nb.metadata.setdefault("jupytext", {})["formats"] = "ipynb,py:percent"
  nb.metadata.get("jupytext", {}).pop("text_representation", None)
  nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
  client = _ProgressClient(nb, name=py.stem, timeout=timeout, kernel_name="python3",
                           record_timing=False, resources={"metadata": {"path": str(ROOT)}})
  start = time.time()
  client.execute(env=kernel_env())
  nb.metadata.pop("widgets", None)
  target = (out_dir or py.parent) / py.with_suffix(".ipynb").name
  target.parent.mkdir(parents=True, exist_ok=True)
  nbformat.write(nb, target)
  print(f"{py.name} -> {target} ({time.time() - start:.0f}s)", file=sys.stderr, flush=True)
  return target


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("notebooks", nargs="*", type=pathlib.Path,
                      help="paired .py files (default: every notebooks/NN_*.py)")
  parser.add_argument("--out", type=pathlib.Path, default=None,
                      help="write the executed notebooks here instead of beside their .py")
  args = parser.parse_args(argv)
  for py in args.notebooks or sources():
    py = py.with_suffix(".py").resolve()
    if not py.exists():
      parser.error(f"{py} does not exist (give the notebook's paired .py)")
    execute(py, args.out)


if __name__ == "__main__":
  main()
