#!/bin/bash
# Session 29: issue 7's Gemma-2-2B 4k rows with the G=32 presets on the Mosaic KIVI kernel (XLA's appends at
# head_dim 256 G=32), bf16 in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
grep -n "^NATIVE_WIDE_WORDS_GROUPS" pallas_kernels/gpu/write.py
timeout 300 python3 benchmarks/throughput.py --models gemma2_2b --contexts 4096 --formats bf16,kivi2,kivi4 --skip-b1 \
  --row-timeout 135 --out $OUT/tp_gemma_4k_s29d.json > $OUT/tp_gemma_4k_s29d_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_gemma_4k_s29d_log.txt | tail -n 6 | cut -c1-250
