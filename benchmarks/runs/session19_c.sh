#!/bin/bash
# Session 19, call 4. Call 3 (session19_a.sh): the swizzled Mosaic FP8 kernel 148.1 us through ops at B=8
# 32k against Triton's 138.7 (key_terms=3: 142.9), every build alone at 150-154 us, flat again. The value
# tiles (64 tokens: 64-byte TMA rows, 64-byte swizzle) against 128-token tiles (128-byte rows), for both
# kernels, through ops, against torch SDPA in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
SWEEP='[{"value_tile": 128}, {"mosaic_fp8": true, "value_tile": 128}, {"mosaic_fp8": {"key_terms": 3}, "value_tile": 128},
        {"mosaic_fp8": {"stages": 3}, "value_tile": 128}, {"mosaic_fp8": {"stages": 3}}]'
timeout 250 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats fp8_e4m3 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 2 --sweep fp8_e4m3 \
  --sweep-points 8:32768,8:131072,64:4096,1:4096 --sweep-options "$SWEEP" \
  --out $OUT/decode_s19c.json > $OUT/log.txt 2>&1; echo "rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
