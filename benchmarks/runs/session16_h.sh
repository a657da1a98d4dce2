#!/bin/bash
# Session 16, call 8. `Options.opaque_magic` (preset dequant_mask_s16_bal_om, now mosaic_decode's default):
# 0x6400 read at run time, so the masked planes are one LOP3 each with no mask MOVs (the tile loop's SASS
# 1114 -> 988 instructions, compiled for an H200 on the CPU). 1. the Mosaic tests natively (the default
# variant, window included); 2. kernel alone, old and new, with and without the window (B=8 32k);
# 3. the B=8 kivi2_g128 rows at the new default against torch, same run (the session's device time
# left is ~400 s).
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_decode.py -k window \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed" $OUT/pytest.txt | tail -n 2
B='base:dequant_mask_s16_bal;om:dequant_mask_s16_bal_om;omw:dequant_mask_s16_bal_om:window'
timeout 110 python3 benchmarks/mosaic_sass.py --builds "$B" --out $OUT/mosaic_sass_s16h.json > $OUT/sass_log.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log.txt
timeout 80 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s16h_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error|failed" | cut -c1-200
