#!/bin/bash
# Session 16, call 6. The kivi2_g128 table at the new default (mosaic_decode window "auto" = the kernel's
# window) against torch SDPA bf16, same run: B = 8, 1, 64 x 32k, 4k, 1k.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 280 python3 benchmarks/decode_kernels.py --batches 8,1,64 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s16f_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error|failed" | cut -c1-200
