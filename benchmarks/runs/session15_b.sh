#!/bin/bash
# Session 15, call 2 (default variant dequant_mask_s16_bal). 1. GPU check of the residual window as one
# more program of the Mosaic kernel (window="kernel", `tests/test_mosaic_decode.py -k window` natively);
# 2. the kivi2_g128 table against torch SDPA (B = 8, 1, 64 x 32k, 4k, 1k), and in the same run the
# sweep of ops' mosaic_window="kernel" against the default (window_merge's Pallas kernel) at 8 points.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_mosaic_decode.py -k "window" \
  > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
tail -n 3 $OUT/pytest_log.txt | cut -c1-300
timeout 300 python3 benchmarks/decode_kernels.py --batches 8,1,64 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --sweep kivi2_g128 --sweep-options '[{"mosaic_window": "kernel"}]' \
  --sweep-points 8:32768,1:32768,8:4096,1:4096,8:1024,1:1024,64:4096,64:1024 \
  --out $OUT/decode_s15b_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error|failed" | cut -c1-200
