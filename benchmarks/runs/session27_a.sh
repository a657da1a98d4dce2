#!/bin/bash
# Prepared in session 26: issue 7's Llama 32k rows with session 26's split rule (`mosaic_decode.default_splits`:
# up to 8 splits of >= 32 tiles above 256 (b, k) pairs; H200, kernel alone at B=69 G=128: 809.0 us against
# 1089.6 at 1 split). bf16 first (the ratio's base, same call), then KIVI-2 G=128 and G=32. KIVI-4 (B=31: 248
# pairs, rule unchanged) is in session27_b.sh.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 540 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 \
  --formats bf16,kivi2_g128,kivi2 --skip-b1 --row-timeout 200 --out $OUT/tp_llama_32k_s27a.json \
  > $OUT/tp_log.txt 2>&1
echo "tp32k rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 7 | cut -c1-250
