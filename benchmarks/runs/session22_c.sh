#!/bin/bash
# Session 22, call 2. Call 1 (session22_a.sh, H200): the G=32 native tests pass; every KIVI in-kernel merge
# test failed natively (count and cluster, G=128 and G=32) and the next test segfaulted, so no messages.
# 1. one merge case with its traceback; 2. the FP8 counted merge's native tests (stop at the first failure);
# 3. KIVI-2 G=32 through ops at the points call 1 did not time (1k, 128k), Mosaic ("words") against
# Triton (planar) and torch SDPA, same run.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 60 python3 -m pytest -o addopts="" -x -v --tb=short -p no:cacheprovider \
  "tests/test_mosaic_decode.py::test_merge_in_the_kernel[count-kivi2_g128-lengths2-0-4-1]" > $OUT/pytest_kivi.txt 2>&1
echo "kivi merge rc=$?"; grep -E "^E |Error|PASSED|FAILED" $OUT/pytest_kivi.txt | cut -c1-300 | head -n 12
JAX_PLATFORMS=cuda,cpu timeout 150 python3 -m pytest -o addopts="" -x -v --tb=short -p no:cacheprovider tests/test_mosaic_fp8.py \
  -k "(glue_in_the_kernel_natively and not tile) or ops_glue" > $OUT/pytest_fp8.txt 2>&1
echo "fp8 rc=$?"; grep -E "PASSED|FAILED|passed|failed|^E " $OUT/pytest_fp8.txt | cut -c1-200 | tail -n 14
timeout 200 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,131072 --formats kivi2 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --sweep kivi2 \
  --sweep-points 1:1024,8:1024,1:131072,8:131072 --sweep-options '[{"kivi_layout": "words"}]' \
  --out $OUT/decode_s22c_kivi2.json > $OUT/log.txt 2>&1; echo "rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
