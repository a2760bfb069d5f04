"""The Colab notebooks run end to end (at tiny scale) and match their paired .py files."""

import pathlib

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
ROOT = NOTEBOOKS.parent


def _notebooks():
  return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_there_are_notebooks():
  assert [p.name for p in _notebooks()][:1] == ["01_quickstart.ipynb"]


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_paired_py_is_in_sync(path):
  """Edit either file and run `jupytext --sync notebooks/*.ipynb`."""
  nb = jupytext.read(path)
  py = jupytext.read(path.with_suffix(".py"))
  cells = lambda n: [(c.cell_type, c.source.strip()) for c in n.cells]
  assert cells(nb) == cells(py)


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch, tmp_path):
  monkeypatch.setenv("JAXCOMP_NOTEBOOK_STEPS", "12")
  monkeypatch.setenv("JAXCOMP_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  # One device in the kernel, as on Colab (the test session's XLA_FLAGS asks for 8).
  monkeypatch.setenv("XLA_FLAGS", "")
  nb = nbformat.read(path, as_version=4)
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(ROOT)}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors
