#!/bin/bash
# Session 25 (prepared in 24, trimmed to one 10-minute call): KIVI through ops with session 24-25's defaults (the
# glue in the kernel at any row count, the Triton merge, the writer quantizing G=32 values, bf16 tokens in the
# steps): KIVI-2 G=32 / G=128 and KIVI-4 at B=1 / 8, 1k to 128k, torch SDPA in the same run; then the B=8 32k
# steps of KIVI-2 G=32 and G=128 (the append's share: issue 3's < 5%; KIVI-4's was session 24's call d).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096,32768,131072 \
  --formats kivi2,kivi2_g128,kivi4 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s25a.json > $OUT/log.txt 2>&1; echo "rc=$?"
timeout 200 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi2,kivi2_g128 \
  --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s25a_steps.json \
  > $OUT/log_steps.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt $OUT/log_steps.txt | grep -E " us |failed|Error|error|skipped" | cut -c1-200
