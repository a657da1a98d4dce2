# Sourced by the run scripts here, on the device machine: from the repository root, install the
# carried wheels (`.whl`: flax, treescope, made by `benchmarks/runs/wheels.sh`; the machine has no package
# registry) and set the env.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
