#!/bin/bash
# Session 14, call 6: the 128k cells of kivi2_g128 on the Mosaic kernel (the table's were still the Triton
# kernel's, session 9), B = 8 and 1, against torch SDPA and cuDNN in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 190 python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 131072 \
  --formats kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s14f_128k.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error" | cut -c1-200
