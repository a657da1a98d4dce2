#!/bin/bash
# Session 21 (prepared; the session's device time ran out before it ran): session 20's KIVI-2 script (never
# run) for the merge without a cluster. The KIVI-2 G=128 kernel's NS + 1 states (the residual window's last) merged inside the
# kernel (`mosaic_decode.KERNEL_MERGE`, off until this runs; `ops.decode_attention(pallas_merge=True)` asks
# for it) as `mosaic_decode.MERGE_BY` says: "count" (the last program of a (b, k) to count itself merges;
# the FP8 kernel alone on an H100 in session 21: no slower than without the merge) or "cluster" (a cluster
# of 4 made the FP8 kernel 33-36% slower). Session 17's profiles: 3.0-6.0 us of XLA glue at B=1 / 8, 1k / 4k
# against kernels of 6-31 us; torch SDPA ahead at B=1 1k-4k and B=8 1k. 1. native tests of both merges
# (natively only: no global semaphores in the interpreter, and a cluster whose programs make different
# scoped allocations deadlocks it); 2. the kernels alone (mosaic_sass: registers, time); 3. through ops
# against the XLA merge and torch SDPA in the same run, at the short points and B=64 (2 states); 3 and 7
# splits (the balanced splits need not divide the tiles) so that B=1 4k's states are at most 8.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  -k "merge_in_the_kernel or window_in_the_kernel" > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|Error|assert" $OUT/pytest.txt | tail -n 12; grep -E "PASSED|FAILED|Timeout|File .*kernels" $OUT/pytest.txt | cut -c1-150 | tail -n 20
timeout 120 python3 benchmarks/mosaic_sass.py --point 1:1024 --splits 2 --out $OUT/mosaic_sass_kivi_s21a.json \
  --builds "window:dequant_denorm_s32_mb:window;merged:dequant_denorm_s32_mb:merged;cluster:dequant_denorm_s32_mb:merged_cluster" > $OUT/sass_log.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log.txt | cut -c1-160
SWEEP='[{"pallas_merge": true}, {"pallas_merge": true, "num_splits": 3}, {"pallas_merge": true, "num_splits": 7}]'
timeout 300 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096 --formats kivi2_g128 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --sweep kivi2_g128 \
  --sweep-points 1:1024,1:4096,8:1024,8:4096,64:4096 --sweep-options "$SWEEP" \
  --out $OUT/decode_s21a_kivi.json > $OUT/log.txt 2>&1; echo "rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
