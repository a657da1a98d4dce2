#!/bin/bash
# Session 16, call 7: the 128k cells of kivi2_g128 with the window inside the Mosaic kernel (session 14's
# were window_merge's), B = 8 and 1, against torch SDPA in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 200 python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 131072 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s16g_128k.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error" | cut -c1-200
