#!/bin/bash
# Prepared in session 29: issue 7's Llama-3-8B 4k rows (bf16 in the same run; KIVI-2 G=32 and KIVI-4 timed out at
# 150 s a row in session 27), with the writer traced once per program (session 29).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 570 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats bf16,kivi2,kivi4 --skip-b1 \
  --row-timeout 260 --out $OUT/tp_llama_4k_s30b.json > $OUT/tp_llama_4k_s30b_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_llama_4k_s30b_log.txt | tail -n 6 | cut -c1-250
