#!/bin/bash
# Prepared in session 24 for the next device run (name the card: session 24's four calls were all H100s).
# KIVI through ops with session 24's defaults (the glue in the kernel, the Triton merge, the writer quantizing
# G=32 values, bf16 tokens in the steps): KIVI-2 G=32 / G=128 and KIVI-4 at B=1 / 8, 1k to 128k, the steps at
# B=8 (the append's share: issue 3's < 5%), torch SDPA in the same run; then B=64 at 4k / 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096,32768,131072 \
  --formats kivi2,kivi4,kivi2_g128 --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 \
  --out $OUT/decode_s25a.json > $OUT/log.txt 2>&1; echo "rc=$?"
timeout 120 python3 benchmarks/decode_kernels.py --batches 64 --contexts 4096,32768 --formats kivi2,kivi4,kivi2_g128 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --out $OUT/decode_s25a_b64.json > $OUT/log64.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt $OUT/log64.txt | grep -E " us |failed|Error|error|skipped" | cut -c1-200
