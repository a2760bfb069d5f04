"""`pip install .` gives the library and what it needs, nothing more.

* ``import jaxcomp`` and one compressed step run where the experiment stack
  (TensorFlow, tensorflow-datasets, orbax, clu, matplotlib, mlxtend,
  ml-collections, tqdm) cannot be imported;
* the wheel holds the ``jaxcomp`` package (and its data files) only, no generic
  top-level names such as ``experiments`` or ``configs``, and its required
  dependencies are the library's, the experiment stack an extra;
* ``requirements.lock`` pins every declared dependency at a version the
  declaration allows.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXPERIMENT_STACK = ("tensorflow", "tensorflow_datasets", "orbax", "clu", "matplotlib", "mlxtend",
                    "ml_collections", "tqdm")

PROGRAM = textwrap.dedent("""
    import importlib.abc, sys

    BLOCKED = %r

    class Block(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
          raise ImportError(f"{name} is not installed (blocked by the test)")

    sys.meta_path.insert(0, Block())

    import jax, jax.numpy as jnp, optax
    import jaxcomp
    import jaxcomp.codecs, jaxcomp.data, jaxcomp.models, jaxcomp.perfmodel  # noqa: F401

    tx = optax.chain(jaxcomp.terngrad(axis_name="workers"), optax.sgd(0.1))
    params = {"w": jnp.linspace(-1.0, 1.0, 1024)}
    state = jaxcomp.parallel.replicate_workers(tx.init(params), 4)
    axes = jaxcomp.parallel.worker_axes(state)
    def worker(p, s, g):
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s
    grads = {"w": jax.random.normal(jax.random.PRNGKey(0), (4, 1024))}
    params, state = jax.jit(jax.vmap(worker, in_axes=(None, axes, 0), out_axes=(None, axes),
                                     axis_name="workers"))(params, state, grads)
    m = jaxcomp.metrics(state)
    loaded = sorted({n.split(".")[0] for n in sys.modules} & set(BLOCKED))
    print(int(m["bytes_on_wire"]), int(m["float32_bytes"]), loaded)
""") % (EXPERIMENT_STACK,)


def test_import_and_a_compressed_step_without_the_experiment_stack(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS="", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", PROGRAM], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  wire, f32, loaded = out.stdout.split(maxsplit=2)
  # 1024 ternary values at 2 bits + the scale + the agreed scale + one non-finite flag byte.
  assert (int(wire), int(f32)) == (256 + 4 + 4 + 1, 4096)
  assert loaded.strip() == "[]"


def _requirements(group=None):
  project = PYPROJECT["project"]
  specs = project["dependencies"] if group is None else project["optional-dependencies"][group]
  return [Requirement(s) for s in specs]


def _canonical(name):
  return re.sub(r"[-_.]+", "-", name).lower()


def test_the_library_requires_only_what_it_imports():
  required = {_canonical(r.name) for r in _requirements()}
  assert required == {"jax", "jaxlib", "flax", "optax", "chex", "numpy"}
  extra = {_canonical(r.name) for r in _requirements("experiments")}
  assert {"tensorflow-cpu", "tensorflow-datasets", "orbax-checkpoint", "clu", "matplotlib",
          "mlxtend", "ml-collections"} <= extra


def test_the_lock_pins_every_declared_dependency_within_its_range():
  pins = {}
  for line in (ROOT / "requirements.lock").read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
      name, version = line.split("==")
      pins[_canonical(name)] = version
  groups = [None, *PYPROJECT["project"]["optional-dependencies"]]
  for req in (r for g in groups for r in _requirements(g)):
    version = pins.get(_canonical(req.name))
    assert version is not None, f"{req.name} is declared but not pinned in requirements.lock"
    assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version} not in {req}"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the tracked files")
def test_the_wheel_holds_the_jaxcomp_package_only(tmp_path):
  files = subprocess.run(["git", "ls-files", "pyproject.toml", "README.md", "jaxcomp"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
  src = tmp_path / "src"
  for name in files:
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / name, src / name)
  out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", ".", "-w", str(tmp_path / "dist")], cwd=src, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  (wheel,) = (tmp_path / "dist").glob("jaxcomp-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert {n.split("/")[0] for n in names} == {"jaxcomp", wheel.name.split("-py3")[0] + ".dist-info"}
  # Every tracked file of the package is in it, the checksum tables included.
  assert {n for n in files if n.startswith("jaxcomp/")} <= set(names)
