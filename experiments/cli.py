r"""The command line of ``experiments.train``: list the configs and their fields, reject unknown ones.

What ``git``, ``pip`` and ``argparse`` users expect, before anything is built::

  python -m experiments.train --help                                   # usage, every config
  python -m experiments.train list                                     # the configs
  python -m experiments.train list configs/terngrad_lenet.py:runlocal  # its fields, with defaults
  python -m experiments.train --config configs/terngrad_lenet.py --config.num_trian_steps=20 ...
  # error: --config.num_trian_steps: configs/terngrad_lenet.py has no field 'num_trian_steps';
  #   the closest is 'num_train_steps' (python -m experiments.train list configs/terngrad_lenet.py)
  python -m experiments.train --config configs/terngrad_lenet.py --config.compressor=terngard ...
  # error: --config.compressor=terngard: unknown compressor 'terngard'; the closest is 'terngrad'; known: ...

An override naming no field, or a value naming no compressor (dataset, model,
optimizer, schedule), is one line on stderr and exit code 2 (a usage error,
as argparse exits), not ml_collections' chained traceback whose hint sits
escaped inside a repr, nor the run's traceback. The config is loaded the way
``ml_collections.config_flags`` loads it (``path[:arg]``, ``get_config(arg)``).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.util
import pathlib
import re
import sys
from typing import Any, Optional, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
USAGE_ERROR = 2  # argparse's and the shells' exit code for a usage error

USAGE = """\
usage: python -m experiments.train --config CONFIG[:ARG] --workdir DIR [--config.FIELD=VALUE ...]
       python -m experiments.train list [CONFIG[:ARG]]

Trains a config (one file per paper experiment under configs/) and writes metrics.csv,
summary.json and checkpoints into DIR. `list` shows the configs; `list CONFIG` its fields
with their defaults, each of which --config.FIELD=VALUE overrides.
"""


class UsageError(Exception):
  """A command line that names something that does not exist: one line, exit code 2."""


def configs() -> dict[str, str]:
  """Every config file under ``configs/`` (those with a ``get_config``) -> its docstring's first line."""
  found = {}
  for path in sorted(CONFIGS.glob("*.py")):
    tree = ast.parse(path.read_text())
    if any(isinstance(n, ast.FunctionDef) and n.name == "get_config" for n in tree.body):
      doc = ast.get_docstring(tree) or ""
      found[f"configs/{path.name}"] = doc.strip().splitlines()[0] if doc.strip() else ""
  return found


def closest(name: str, known: Sequence[str]) -> str:
  """``"; the closest is 'x'"`` for the known name nearest a misspelt ``name``, or ``""``."""
  close = difflib.get_close_matches(str(name), list(known), n=1)
  return f"; the closest is {close[0]!r}" if close else ""


def load_config(spec: str) -> Any:
  """The ConfigDict of ``spec`` (``path`` or ``path:arg``), as ``config_flags.DEFINE_config_file`` loads it."""
  path, _, arg = spec.partition(":")
  file = pathlib.Path(path)
  if not file.is_file():
    raise UsageError(f"--config {spec}: no file {path!r}{closest(path, configs())} "
                     "(python -m experiments.train list)")
  module_spec = importlib.util.spec_from_file_location(f"_config_{file.stem}", file)
  module = importlib.util.module_from_spec(module_spec)
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # configs import configs.common
  module_spec.loader.exec_module(module)
  try:
    return module.get_config(arg) if arg else module.get_config()
  except ValueError as e:  # an unknown config argument (configs.common.parse_arg)
    raise UsageError(f"--config {spec}: {e}") from None


def fields(config: Any, prefix: str = "") -> dict[str, Any]:
  """Every field of ``config`` by its dotted name (nested ConfigDicts flattened), with its value."""
  out = {}
  for key, value in config.items():
    if hasattr(value, "items") and value.items():
      out.update(fields(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def comments() -> dict[str, str]:
  """What ``configs/common.py`` says of each field of the base config (its end-of-line comment)."""
  text = (CONFIGS / "common.py").read_text()
  return dict(re.findall(r"^\s+c\.(\w+) = [^#\n]*#\s*(.+)$", text, flags=re.M))


def overrides(argv: Sequence[str]) -> list[tuple[str, Optional[str]]]:
  """Every ``--config.FIELD=VALUE`` (or ``--config.FIELD VALUE``) of ``argv``: (FIELD, VALUE)."""
  out = []
  for i, arg in enumerate(argv):
    m = re.match(r"--config\.([\w.]+)(=(.*))?$", arg, flags=re.S)
    if m:
      value = m[3] if m[2] else (argv[i + 1] if i + 1 < len(argv) else None)
      out.append((m[1], value))
  return out


def check_overrides(config: Any, spec: str, argv: Sequence[str]) -> None:
  """Raises UsageError naming the first ``--config.FIELD=VALUE`` whose FIELD ``config`` does not have,
  or whose VALUE names no entry of the field's registry (a compressor, a dataset, a model ...)."""
  known = fields(config)
  parents = {name.rsplit(".", 1)[0] for name in known if "." in name}
  for field, value in overrides(argv):
    if field not in known and field not in parents:
      raise UsageError(f"--config.{field}: {spec.partition(':')[0]} has no field {field!r}"
                       f"{closest(field, known)} (python -m experiments.train list {spec})")
    problem = _unknown_name(field, value)
    if problem:
      raise UsageError(f"--config.{field}={value}: {problem}")


def _unknown_name(field: str, value: Optional[str]) -> str:
  """:func:`experiments.validation.unknown_name` for a field that names a registry entry, else ``""``."""
  from experiments import validation  # pylint: disable=g-import-not-at-top  (JAX: only for a run)

  if field not in validation.registries() or value is None:
    return ""
  return validation.unknown_name(field, value)


def describe(spec: Optional[str]) -> str:
  """``list``: the configs, or the fields of ``spec`` with their defaults."""
  if spec is None:
    rows = configs()
    width = max(map(len, rows))
    return "configs (python -m experiments.train list CONFIG shows one's fields):\n" + "\n".join(
        f"  {name:<{width}}  {doc}" for name, doc in rows.items())
  config, notes = load_config(spec), comments()
  rows = {name: repr(value) for name, value in fields(config).items()}
  width = max(map(len, rows))
  lines = [f"{spec}: fields and their values (override with --config.FIELD=VALUE)"]
  for name, value in rows.items():
    note = notes.get(name)
    lines.append(f"  {name:<{width}} = {value}" + (f"   # {note}" if note else ""))
  return "\n".join(lines)


def _config_spec(argv: Sequence[str]) -> Optional[str]:
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def preflight(argv: Sequence[str]) -> Optional[str]:
  """What to print and exit 0 with (``--help``, ``list``), or None to run; raises UsageError.

  Runs before absl parses the flags, so that a misspelt field is caught here
  with its closest match instead of deep inside ``config_flags``.
  """
  args = list(argv[1:])
  if args and args[0] == "list":
    if len(args) > 2:
      raise UsageError(f"list takes at most one config; got {args[1:]}")
    return describe(args[1] if len(args) == 2 else None)
  spec = _config_spec(args)
  if any(a in ("-h", "--help", "-help", "--helpfull") for a in args):
    return USAGE + "\n" + describe(spec)
  if spec is not None:
    check_overrides(load_config(spec), spec, args)
  return None


def missing_dataset(config: Any, error: Exception) -> str:
  """A dataset that is not on this machine (``error``: its DatasetNotAvailableError), in one line:
  where it was looked for, and the flags that fix it."""
  from jaxcomp.data import registry  # pylint: disable=g-import-not-at-top

  spec = registry.get_spec(config.dataset)
  fixes = []
  if getattr(error, "data_dir", None) is not None:  # a tfds dataset, not prepared there
    why = f"tfds {spec.tfds_name!r} is not prepared in {error.data_dir}"
    fixes.append(f"--config.data_dir=DIR of a copy prepared with `tfds build {spec.tfds_name} --data_dir DIR`")
  else:
    why = str(error)
  here = [name for name in registry.offline_here(spec.modality) if name != config.dataset]
  if here:
    fixes.append(f"--config.dataset= one that is here: {', '.join(here)}")
  return (f"--config.dataset={config.dataset} is not on this machine: {why}"
          + (f"; pass {' or '.join(fixes)}" if fixes else ""))


@contextlib.contextmanager
def usage_errors():
  """A :class:`UsageError` raised inside is printed as one line on stderr and exits with code 2."""
  try:
    yield
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(USAGE_ERROR) from None


def main_or_exit(argv: Sequence[str]) -> None:
  """Prints and exits for ``--help``, ``list`` and usage errors; returns when training should run."""
  with usage_errors():
    text = preflight(argv)
  if text is not None:
    print(text)
    raise SystemExit(0)
