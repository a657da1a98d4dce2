#!/bin/bash
# Session 32: on an H200 (the card issue 7 names), issue 7's Llama-3-8B 32k rows with the large-batch split
# rule, the formats with targets first (bf16 the base, FP8, KIVI-2 G=128 and G=32); on an H100, session32_c.sh
# (the Mosaic FP8 kernel at Gemma's head_dim 256).
set -u
source "$(dirname "$0")/device_setup.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
if [[ "$card" != *H200* ]]; then
  exec bash "$(dirname "$0")/session32_c.sh"
fi
timeout 570 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --skip-b1 --row-timeout 170 \
  --formats ${TP_FORMATS:-bf16,fp8_e4m3,kivi2_g128,kivi2} --out $OUT/tp_llama_32k_s32b.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 12 | cut -c1-250
