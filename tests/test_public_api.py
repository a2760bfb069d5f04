"""The public API: jaxcomp.__all__ is documented, one name per thing, and the layers stay apart."""

import ast
import inspect
import pathlib
import re
import types

import jaxcomp

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def _own_doc(obj) -> str:
  if isinstance(obj, type):
    doc = vars(obj).get("__doc__") or ""
    return "" if doc.startswith(obj.__name__ + "(") else doc  # NamedTuple's generated docstring
  return inspect.getdoc(obj) or ""


def test_every_public_name_is_documented():
  missing = []
  for name in jaxcomp.__all__:
    obj = getattr(jaxcomp, name)
    if isinstance(obj, (type, types.FunctionType, types.ModuleType)):
      documented = bool(_own_doc(obj).strip())
    else:  # data (the registry): described in the docs
      documented = re.search(rf"\bjaxcomp\.{name}\b", DOCS) is not None
    if not documented:
      missing.append(name)
  assert not missing, f"undocumented public names: {missing}"


def test_one_public_name_per_thing():
  """A name in jaxcomp.__all__ means the same thing in every public module, and no thing has two names."""
  public = {name: getattr(jaxcomp, name) for name in jaxcomp.__all__}
  objects = [id(obj) for obj in public.values()]
  assert len(objects) == len(set(objects)), "two names in jaxcomp.__all__ for one object"
  for module in (obj for obj in public.values() if isinstance(obj, types.ModuleType)):
    for name in dir(module):
      if name in public and not isinstance(public[name], types.ModuleType):
        assert getattr(module, name) is public[name], f"{module.__name__}.{name} is not jaxcomp.{name}"


def _imports(path: pathlib.Path) -> set[str]:
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      out |= {f"{node.module}.{a.name}" for a in node.names} | {node.module or ""}
  return out


def test_core_is_the_layer_under_the_exchange():
  imported = _imports(ROOT / "jaxcomp" / "core.py")
  assert not {m for m in imported if re.match(r"jaxcomp\.(parallel|transforms|metrics|compressors)", m)}, imported


def test_every_compressor_hook_and_attribute_is_used():
  """Every public member of jaxcomp.core.Compressor is read outside its own definition."""
  sources = "".join(p.read_text() for p in (ROOT / "jaxcomp").rglob("*.py") if p.name != "core.py")
  sources += "".join(p.read_text() for p in (ROOT / "benchmarks").glob("*.py"))
  members = [m for m in vars(jaxcomp.core.Compressor) if not m.startswith("_")]
  assert members
  unused = [m for m in members if not re.search(rf"\.{m}\b", sources)]
  assert not unused, unused
