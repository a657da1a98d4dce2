#!/bin/bash
# Session 14, call 5: call 4's GPU check timed out at 110 s compiling (T=20 unrolled in the append
# kernel); the same tests with room, and the T=1 / T=3 flush test over a "words" cache.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 320 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "planes or kivi2_g128+words" --durations=3 > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
grep -v Warning $OUT/pytest_log.txt | grep -E "passed|failed|s call|Error" | cut -c1-200
