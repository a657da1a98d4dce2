#!/bin/bash
# Session 30: issue 7's Llama-3-8B 32k rows again, now with the batch-1 step latency and prefill (H100 rows so far
# ran with --skip-b1) and the writer traced once per program (session 29).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 560 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,fp8_e4m3,kivi2,kivi2_g128 \
  --row-timeout 200 --out $OUT/tp_llama_32k_s30e.json > $OUT/tp_llama_32k_s30e_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_llama_32k_s30e_log.txt | tail -n 9 | cut -c1-250
