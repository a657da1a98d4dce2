#!/bin/bash
# Session 18, call 2 (not run: no device in session 18). Through ops, in one run each: Triton's FP8 kernel
# (the sweep's {} entry), the Mosaic FP8 kernel (`mosaic_fp8=True`, 128-token steps; and 64-token steps,
# `{"tile": 64}`) at the default splits and at 8, and torch SDPA; long contexts, then short ones.
set -u
source "$(dirname "$0")/device_setup.sh"
SWEEP='[{"mosaic_fp8": true}, {"mosaic_fp8": true, "num_splits": 8}, {"mosaic_fp8": {"tile": 64}},
        {"mosaic_fp8": {"tile": 64}, "num_splits": 8}]'
timeout 280 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768,131072 --formats fp8_e4m3 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 2 --sweep fp8_e4m3 \
  --sweep-points 8:32768,8:131072,64:4096 --sweep-options "$SWEEP" \
  --out $OUT/decode_s18b_long.json > $OUT/long_log.txt 2>&1; echo "long rc=$?"
timeout 260 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024 --formats fp8_e4m3 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --sweep fp8_e4m3 \
  --sweep-points 1:1024,8:1024,1:4096,8:4096,1:32768 --sweep-options "$SWEEP" \
  --out $OUT/decode_s18b_short.json > $OUT/short_log.txt 2>&1; echo "short rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/long_log.txt $OUT/short_log.txt | grep -E " us |failed|Error|error" | cut -c1-200
