#!/bin/bash
# Session 27: issue 7's Llama 32k table in one call with session 26's split rule (on an H100, session27_a.sh:
# KIVI-2 G=128 4.35x, G=32 3.59x bf16). On an H200 (the card the issue names): every format, bf16 first (the
# ratio's base). On an H100 (already measured there): Gemma-2-2B at 32k, every format, for the H100 table.
set -u
source "$(dirname "$0")/device_setup.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
if [[ "$card" == *H200* ]]; then
  args=(--models llama3_8b --formats bf16,fp8_e4m3,int8,kivi4,kivi2,kivi2_g128 --out $OUT/tp_llama_32k_s27d.json)
else
  args=(--models gemma2_2b --formats bf16,fp8_e4m3,int8,kivi4,kivi2 --out $OUT/tp_gemma_32k_s27d.json)
fi
timeout 560 python3 benchmarks/throughput.py --contexts 32768 --skip-b1 --row-timeout 150 "${args[@]}" \
  > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 12 | cut -c1-250
