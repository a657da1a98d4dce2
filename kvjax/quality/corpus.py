"""A corpus of real third-party Python source, split into train and held-out files.

The reference LM trains on code nobody here wrote: the Python standard library
and installed packages of the machine it trains on. Files are collected in a
deterministic order, deduplicated by content, and split by a hash of their
content (so the split does not depend on where a package is installed). The
manifest records what was used: roots, file counts, byte counts and a hash of
the sorted file list, so a result can name its corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import sysconfig
from typing import Iterable, Sequence

__all__ = ["SourceFile", "default_roots", "collect", "split", "manifest"]

MAX_FILE_BYTES = 512 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class SourceFile:
  path: str  # relative to its root, with the root's label in front
  text: str

  @property
  def digest(self) -> str:
    return hashlib.sha1(self.text.encode("utf-8")).hexdigest()


def default_roots() -> list[str]:
  """The standard library and site-packages of the running interpreter."""
  paths = sysconfig.get_paths()
  roots = [paths["stdlib"], paths["purelib"]]
  if paths.get("platlib") and paths["platlib"] != paths["purelib"]:
    roots.append(paths["platlib"])
  return [r for r in dict.fromkeys(roots) if os.path.isdir(r)]


def _walk(root: str) -> Iterable[str]:
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    for name in sorted(filenames):
      if name.endswith(".py"):
        yield os.path.join(dirpath, name)


def collect(roots: Sequence[str], exclude: Sequence[str] = ("kvjax", "pallas_kernels"),
            max_bytes: int = MAX_FILE_BYTES) -> list[SourceFile]:
  """Reads every UTF-8 ``.py`` file under `roots`, deduplicated by content, sorted by path.

  Files whose path contains a component in `exclude` (this project's own code),
  empty files and files over `max_bytes` are skipped.
  """
  if not roots:
    raise ValueError("roots must name at least one directory, got none")
  seen, files = set(), []
  for i, root in enumerate(roots):
    if not os.path.isdir(root):
      raise ValueError(f"root {root!r} is not a directory")
    nested = [r for r in roots if r != root and os.path.commonpath([r, root]) == root]
    for path in _walk(root):
      if any(os.path.commonpath([n, path]) == n for n in nested):
        continue  # belongs to a more specific root
      rel = os.path.relpath(path, root)
      if set(rel.split(os.sep)) & set(exclude):
        continue
      try:
        if os.path.getsize(path) > max_bytes:
          continue
        with open(path, "rb") as f:
          text = f.read().decode("utf-8")
      except (OSError, UnicodeDecodeError):
        continue
      if not text.strip():
        continue
      digest = hashlib.sha1(text.encode("utf-8")).hexdigest()
      if digest in seen:
        continue
      seen.add(digest)
      files.append(SourceFile(path=f"root{i}/{rel}", text=text))
  files.sort(key=lambda f: f.path)
  return files


def split(files: Sequence[SourceFile], heldout_percent: float = 2.0) -> tuple[list, list]:
  """(train, heldout) by a hash of each file's content."""
  if not 0 < heldout_percent < 100:
    raise ValueError(f"heldout_percent must be in (0, 100), got {heldout_percent}")
  train, held = [], []
  for f in files:
    bucket = int(f.digest[:8], 16) % 10000
    (held if bucket < heldout_percent * 100 else train).append(f)
  return train, held


def manifest(roots: Sequence[str], train: Sequence[SourceFile], held: Sequence[SourceFile]) -> dict:
  """What the corpus is: enough to name it in a results file."""
  def side(fs):
    listing = "\n".join(f"{f.path} {f.digest}" for f in fs)
    return {"files": len(fs), "bytes": sum(len(f.text.encode("utf-8")) for f in fs),
            "list_sha1": hashlib.sha1(listing.encode()).hexdigest()}
  return {"roots": list(roots), "python": sys.version.split()[0], "train": side(train),
          "heldout": side(held)}


def write_manifest(path: str, info: dict) -> None:
  with open(path, "w") as f:
    json.dump(info, f, indent=1)
