#!/bin/bash
# Session 19, call 5. Call 4: the Mosaic FP8 kernel over 128-token value tiles 138.6 us through ops at B=8
# 32k (Triton's over 64-token tiles 140.5; torch SDPA 244.4: 1.85x needs 132.1). Where the call's time goes:
# the profiler's kernels per step (q prep, the kernel, the merge), both kernels, B=8 32k and B=1 4k.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 120 python3 benchmarks/profile_step.py --formats fp8_e4m3 --points 8:32768,1:4096 \
  --out $OUT/profile_s19d_triton.json > $OUT/log_triton.txt 2>&1; echo "triton rc=$?"
timeout 120 python3 benchmarks/profile_step.py --formats fp8_e4m3 --points 8:32768,1:4096 \
  --options '{"mosaic_fp8": true, "value_tile": 128}' \
  --out $OUT/profile_s19d_mosaic.json > $OUT/log_mosaic.txt 2>&1; echo "mosaic rc=$?"
grep -hv "Warning" $OUT/log_triton.txt $OUT/log_mosaic.txt | tail -n 30 | cut -c1-220
