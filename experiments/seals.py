"""A checkpoint's seal: every file of it, its size and SHA-256, and which process's part it is.

In a multi-process run every process writes its own part of a checkpoint into
the one shared step directory (orbax: process ``p``'s shards under
``ocdbt.process_p/`` and ``array_metadatas/process_p``; process 0 the
replicated arrays and the metadata). orbax commits a step once every process
has written, but nothing it reads afterwards tells a flipped byte from a
good one (a corrupted data file is read without an error, its values wrong),
and a part lost after the commit (a disk that lost it, a file cut short) is
found only by the read that fails, or not at all. So once every process has
written, process 0 seals the step (:func:`seal`: orbax's post-finalization
callback, which runs on the primary process after every process's writes
and before the commit; it reads every file once) and, before a restore,
each process checks its own part against the seal (:func:`check`): a file
missing, of another size or with other bytes means the part is not there
completely.

A step without a seal was written before seals existed: orbax's commit is all
there is to go by, and it counts as complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Optional

SEAL = "jaxcomp_seal.json"
# Written by orbax after the seal (its commit markers): not sealed.
_UNSEALED = {"commit_success.txt", "_CHECKPOINT_METADATA"}
_OWNER_RE = re.compile(r"^(?:ocdbt\.)?process_(\d+)$")


def owner(relpath: str) -> int:
  """The process that wrote ``relpath`` (a path inside a step directory): 0 unless a
  ``process_P`` or ``ocdbt.process_P`` directory or file in it names another."""
  for part in relpath.split(os.sep):
    m = _OWNER_RE.match(part)
    if m:
      return int(m.group(1))
  return 0


def files(step_dir: str) -> list[str]:
  """The files of ``step_dir`` that a seal covers, relative, sorted."""
  out = []
  for d, _, names in os.walk(step_dir):
    for f in names:
      if f not in _UNSEALED and f != SEAL and not f.endswith(SEAL + ".tmp"):
        out.append(os.path.relpath(os.path.join(d, f), step_dir))
  return sorted(out)


def _digest(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def seal(step_dir: str) -> None:
  """Writes the seal of ``step_dir``: every file, its size and SHA-256 (once every process wrote its part)."""
  sealed = {rel: [os.path.getsize(os.path.join(step_dir, rel)), _digest(os.path.join(step_dir, rel))]
            for rel in files(step_dir)}
  path = os.path.join(step_dir, SEAL)
  with open(path + ".tmp", "w") as f:
    json.dump({"files": sealed}, f, indent=1)
  os.replace(path + ".tmp", path)


def check(step_dir: str, process: int) -> Optional[str]:
  """Why ``process``'s part of ``step_dir`` is not as sealed, or None if it is (or nothing is sealed)."""
  path = os.path.join(step_dir, SEAL)
  if not os.path.exists(path):
    return None  # written before seals existed
  try:
    with open(path) as f:
      sealed = json.load(f)["files"]
  except (OSError, ValueError, KeyError) as e:
    return f"its seal {SEAL} cannot be read: {type(e).__name__}: {e}"
  for rel, (size, digest) in sorted(sealed.items()):
    if owner(rel) != process:
      continue
    full = os.path.join(step_dir, rel)
    if not os.path.exists(full):
      return f"{rel} is missing"
    if os.path.getsize(full) != size:
      return f"{rel} has {os.path.getsize(full)} bytes, {size} were written"
    if _digest(full) != digest:
      return f"{rel} is not what was written (its SHA-256 differs)"
  return None
