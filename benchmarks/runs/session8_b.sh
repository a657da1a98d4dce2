#!/bin/bash
# Session 8, device call 2: Llama-3-8B throughput at 32k with the tiled FP8 / INT8 value layout
# (bf16 re-timed in the same run; batch-1 step latency and prefill included).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 400 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,fp8_e4m3,int8 \
  --row-timeout 125 --out $OUT/tp_llama_32k_s8.json > $OUT/tp_32k_log.txt 2>&1; echo "tp 32k rc=$?"
rm -f $OUT/*.png
tail -n 8 $OUT/tp_32k_log.txt
