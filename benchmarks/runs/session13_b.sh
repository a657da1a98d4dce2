#!/bin/bash
# Session 13, call 2: kivi2_g128 (words cache: Mosaic kernel + `window_merge`) against torch SDPA and cuDNN
# bf16, same run, B=8 and B=1; the full step and the append at B=8; then a profiler breakdown per device
# kernel (q prep, the Mosaic kernel, window_merge; the append's kernels) at B=8 32k / 1k and B=1 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 260 python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa,cudnn --step-batches 8 --reps 3 --stream-gb 1 \
  --out $OUT/decode_s13_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
grep -v "Warning" $OUT/table_log.txt | grep -E "us |skip|Error|error" | cut -c1-200
timeout 230 python3 benchmarks/profile_step.py --formats kivi2_g128 --points 8:32768,1:32768,8:1024 \
  --what attend,step --out $OUT/profile_s13.json > $OUT/profile_log.txt 2>&1; echo "profile rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/profile_log.txt | tail -n 45 | cut -c1-200
