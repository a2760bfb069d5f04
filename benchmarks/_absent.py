"""Makes the packages a GPU machine lacks unimportable, here too.

The GPU machines ``benchmarks.accelerator`` is written for carry their own JAX,
flax, optax, chex, orbax, pytest and hypothesis, but not the experiment stack
(TensorFlow, tfds, ml_collections, clu, mlxtend) nor the notebook tools. Importing
this module is harmless; :func:`install` (called by ``benchmarks.accelerator``'s
``main``, and by pytest when ``-p benchmarks._absent`` makes this a plugin)
makes them absent in that process, so that a CPU run fails where a GPU run
would: a test or benchmark that reaches one of them, directly or through
another module, raises ``ModuleNotFoundError`` (``pytest.importorskip``
skips). Only on request: a process that imports ``benchmarks.accelerator``
(the suite's own test of it) keeps its packages.
"""

from __future__ import annotations

import sys

ABSENT = ("tensorflow", "tensorflow_datasets", "ml_collections", "clu", "mlxtend", "jupytext", "nbclient")


def install() -> None:
  """Marks every package of :data:`ABSENT` not yet imported as absent (``None`` in ``sys.modules``).

  Then ``import tensorflow`` raises ``ModuleNotFoundError`` and
  ``importlib.util.find_spec("tensorflow")`` returns ``None``, as where it is
  not installed. (An import hook that raised instead also broke what only probes
  for them: reading JAX's persistent compilation cache.)
  """
  for name in ABSENT:
    sys.modules.setdefault(name, None)


def imported() -> list[str]:
  """The modules of :data:`ABSENT` this process imported (before :func:`install`)."""
  return sorted(m for m, module in sys.modules.items() if module is not None and m.partition(".")[0] in ABSENT)


def pytest_configure(config) -> None:
  """As a pytest plugin (``-p benchmarks._absent``): the packages are absent for the whole run."""
  del config
  install()
