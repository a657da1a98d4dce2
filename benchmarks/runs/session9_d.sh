#!/bin/bash
# Session 9, call 3: serving throughput with session 9's kernel changes (the one-wave split rule for
# tiled FP8 / INT8 caches, the one-kernel split merge, the append quantizing in its kernel):
# Llama-3-8B at 32k (bf16, FP8, INT8; FP8's target 1.9x, 1.79x in session 8) and Gemma-2-2B at 32k
# (not re-run since the tiled layout), bf16 in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 230 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,fp8_e4m3,int8 \
  --row-timeout 80 --out $OUT/tp_llama_32k_s9.json > $OUT/tp_llama_log.txt 2>&1; echo "llama 32k rc=$?"
timeout 240 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3,int8 \
  --skip-b1 --row-timeout 90 --out $OUT/tp_gemma_32k_s9.json > $OUT/tp_gemma_log.txt 2>&1; echo "gemma 32k rc=$?"
rm -f $OUT/*.png
tail -n 6 $OUT/tp_llama_log.txt; tail -n 6 $OUT/tp_gemma_log.txt
