#!/bin/bash
# Session 23, call 4: KIVI-4 ("words", the Mosaic kernel, now the default) through ops at B=1 / 8 from 1k
# to 128k and B=64 at 4k / 32k against torch SDPA, with Triton's planar kernel in the same run at the points
# call 1 did not time (1k, 128k).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 270 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096,32768,131072 --formats kivi4 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --sweep kivi4 \
  --sweep-points 1:1024,8:1024,1:131072,8:131072 --sweep-options '[{"kivi_layout": ""}]' \
  --out $OUT/decode_s23c.json > $OUT/log.txt 2>&1; echo "rc=$?"
timeout 90 python3 benchmarks/decode_kernels.py --batches 64 --contexts 4096,32768 --formats kivi4 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --out $OUT/decode_s23c_b64.json > $OUT/log64.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt $OUT/log64.txt | grep -E " us |failed|Error|error" | cut -c1-200
