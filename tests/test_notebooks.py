"""The notebooks: committed with their outputs, made by their paired .py, and they still run.

`make notebooks` (notebooks/execute.py) builds every notebook from its paired
jupytext .py, runs it in one fresh kernel and commits it with its outputs. These
tests check that what is committed is that: the cells are the .py's, every code
cell ran once, in order, in one kernel (so no output is left from older code),
and the plots are there. The suite also runs every notebook at tiny scale with
the same runner.
"""

import pathlib
import re
import sys

import jupytext
import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
ROOT = NOTEBOOKS.parent
sys.path.insert(0, str(NOTEBOOKS))
import execute  # noqa: E402  (notebooks/execute.py: the runner behind `make notebooks`)

PAIRED = execute.sources()


def _cells(nb):
  return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_every_notebook_has_its_paired_py_and_the_readme_links_the_first():
  ipynb = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
  assert ipynb == [p.stem for p in PAIRED] and len(ipynb) >= 3
  readme = (ROOT / "README.md").read_text()
  assert f"notebooks/{PAIRED[0].stem}.ipynb" in readme


@pytest.mark.parametrize("py", PAIRED, ids=lambda p: p.stem)
def test_committed_notebook_cells_match_the_paired_py(py):
  """Edit the .py, then `make notebooks` (or `jupytext --sync` for text-only edits)."""
  assert _cells(jupytext.read(py.with_suffix(".ipynb"))) == _cells(jupytext.read(py))


@pytest.mark.parametrize("py", PAIRED, ids=lambda p: p.stem)
def test_committed_notebook_ran_in_one_kernel_and_shows_its_plots(py):
  nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  # Every code cell ran once, in order, in one kernel: a cell edited after the run would have
  # lost its outputs and count (jupytext --sync) or be out of sequence.
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
  outputs = [o for c in code for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  plots = [o for o in outputs if "image/png" in o.get("data", {})]
  assert plots, "the notebook's figures are missing"
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert not re.search(r"steps: 12\b|tiny mode: True", text), "committed at the test suite's tiny scale"
  # The Colab cell installs what the notebook needs (the experiments extra) from the repository.
  assert '"./jaxcomp[experiments]"' in code[0].source and "git\", \"clone\"" in code[0].source


@pytest.mark.parametrize("py", PAIRED, ids=lambda p: p.stem)
def test_notebook_executes_at_tiny_scale(py, monkeypatch, tmp_path):
  monkeypatch.setenv("JAXCOMP_NOTEBOOK_STEPS", "12")
  monkeypatch.setenv("JAXCOMP_NOTEBOOK_TINY", "1")
  out = execute.execute(py, out_dir=tmp_path, timeout=600)
  nb = nbformat.read(out, as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
  assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)
