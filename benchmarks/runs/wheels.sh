#!/bin/bash
# Make `.whl` (git-ignored), the wheels the device machine lacks and `device_setup.sh` installs there (it has
# no package registry): flax and treescope at the versions this checkout's venv holds. Run from the
# repository root after `make setup`; then pass `carry: [".whl"]` to the device's run.
set -eu
mkdir -p .whl
for p in flax treescope; do
  v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))")
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .whl "$p==$v"
done
ls .whl
