"""Shared pieces of the notebook builders: badge, install cell, results lookup, cell helpers."""

from __future__ import annotations

import pathlib

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook  # noqa: F401 (re-exported)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
REPO = "kvjax/kvjax"  # placeholder GitHub org/name: change once the repository is public
GIT_URL = f"https://github.com/{REPO}"


def badge(name: str) -> str:
  url = f"https://colab.research.google.com/github/{REPO}/blob/main/colab/{name}.ipynb"
  return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


INSTALL = f'''\
# Installs kvjax in Colab; a no-op where kvjax is already importable (a local checkout).
try:
  import kvjax
except ImportError:
  %pip install -q "kvjax @ git+{GIT_URL}"'''

FIND_RESULTS = f'''\
# The committed measurements (benchmarks/results/*.json) live in the repository, not in the
# package: use the checkout this notebook runs from, else clone it (Colab).
import pathlib, subprocess

def find_results() -> pathlib.Path:
  here = pathlib.Path.cwd().resolve()
  candidates = [p / "benchmarks" / "results" for p in (here, *here.parents)]
  candidates.append(pathlib.Path(kvjax.__file__).resolve().parents[1] / "benchmarks" / "results")
  for c in candidates:
    if (c / "decode_h200.json").exists():
      return c
  subprocess.run(["git", "clone", "-q", "--depth", "1", "{GIT_URL}", "/content/kvjax"], check=True)
  return pathlib.Path("/content/kvjax/benchmarks/results")

RESULTS = find_results()
print(RESULTS.relative_to(pathlib.Path.cwd()) if RESULTS.is_relative_to(pathlib.Path.cwd()) else RESULTS)'''


def md(s):
  return new_markdown_cell(s.strip("\n"))


def code(s):
  return new_code_cell(s.strip("\n"))


# ---------------------------------------------------------------------------------------------
# quickstart
# ---------------------------------------------------------------------------------------------
