#!/bin/bash
# Session 16, call 3. The window program as the other branch of one lax.cond (the tile loop's code no longer
# flows into it; call 2: 142 registers with two pl.when's) and its ring keys from shared memory:
# 1. registers and kernel time with / without the window (mosaic_sass.py, dumps kept); 2. the window
# tests natively; 3. the kivi2_g128 table against torch SDPA with mosaic_window "kernel" and "pallas"
# swept at 8 points, same run.
set -u
source "$(dirname "$0")/device_setup.sh"
B='base:dequant_mask_s16_bal;window:dequant_mask_s16_bal:window'
timeout 200 python3 benchmarks/mosaic_sass.py --builds "$B" --out $OUT/mosaic_sass_s16c.json \
  --dumps $OUT/mosaic_dumps_s16c.tar.gz > $OUT/sass_log.txt 2>&1; echo "sass rc=$?"
grep -o '"build": "[a-z]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log.txt
JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_decode.py -k window \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed" $OUT/pytest.txt | tail -n 2
timeout 330 python3 benchmarks/decode_kernels.py --batches 8,1,64 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --sweep kivi2_g128 --sweep-options '[{"mosaic_window": "kernel"}, {"mosaic_window": "pallas"}]' \
  --sweep-points 8:32768,1:32768,8:4096,1:4096,8:1024,1:1024,64:4096,64:1024 \
  --out $OUT/decode_s16c_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error|failed" | cut -c1-200
