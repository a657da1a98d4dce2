#!/bin/bash
# Session 8, device call 3: the GPU tests call 1's 150 s did not reach (tiled appends, tiled kernel
# variants, the fused step), and a diagnosis of its one failure (test_append_inplace_matches_append[kivi2]).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 90 python3 benchmarks/runs/session8_c_diag.py > $OUT/diag_log.txt 2>&1; echo "diag rc=$?"
JAX_PLATFORMS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "tile or decode_step or append_inplace" > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
cat $OUT/diag_log.txt | grep -v Warning | tail -n 20
grep -E "passed|failed|^FAILED|^E " $OUT/pytest_log.txt | head -n 20 | cut -c1-250
