"""Builds the Colab notebooks in this folder from the cell sources below, then executes them.

  python colab/build_notebooks.py            # write and execute all (outputs kept)
  python colab/build_notebooks.py --no-run   # write only
  python colab/build_notebooks.py quickstart # one notebook

Notebooks follow gemma's shape: title, Open-in-Colab badge, one-line purpose,
one install cell, an imports cell, short sections with one idea per cell,
"Next steps" at the end. Execution uses nbclient with the kernel of the
running interpreter, from the repository root (so `benchmarks/results`
resolves) and on the CPU.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import nbformat
from nbformat.v4 import new_notebook

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from nb_common import HERE, ROOT  # noqa: E402
from nb_drop_into_gemma import drop_into_gemma  # noqa: E402
from nb_fp8_vs_kivi import fp8_vs_kivi  # noqa: E402
from nb_quickstart import quickstart  # noqa: E402

NOTEBOOKS = {"quickstart": quickstart, "fp8_vs_kivi": fp8_vs_kivi, "drop_into_gemma": drop_into_gemma}


def build(name: str) -> nbformat.NotebookNode:
  nb = new_notebook(cells=NOTEBOOKS[name]())
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  nb.metadata["language_info"] = {"name": "python"}
  nb.metadata["colab"] = {"provenance": [], "name": f"{name}.ipynb"}
  for i, c in enumerate(nb.cells):  # stable ids: rebuilding gives minimal diffs
    c["id"] = f"{name[:8]}-{i:02d}"
  return nb


def execute(nb: nbformat.NotebookNode, cwd: pathlib.Path = ROOT, timeout: int = 300) -> float:
  """Runs `nb` in place with nbclient (raises on the first failing cell); returns seconds."""
  from nbclient import NotebookClient
  env_backup = os.environ.get("JAX_PLATFORMS")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  t0 = time.perf_counter()
  try:
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
  finally:
    if env_backup is None:
      os.environ.pop("JAX_PLATFORMS", None)
  return time.perf_counter() - t0


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("names", nargs="*", default=list(NOTEBOOKS))
  p.add_argument("--no-run", action="store_true", help="write the notebooks without outputs")
  args = p.parse_args(argv)
  for name in args.names:
    nb = build(name)
    if not args.no_run:
      print(f"{name}: executed in {execute(nb):.1f} s", file=sys.stderr)
    nbformat.validate(nb)
    nbformat.write(nb, str(HERE / f"{name}.ipynb"))


if __name__ == "__main__":
  main()
