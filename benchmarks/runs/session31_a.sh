#!/bin/bash
# Prepared in session 30 (NOTES_gpu.md item -22): issue 7's Gemma-2-2B 32k rows with the batch-1 step latency and
# 512-token prefill (the H100 rows so far ran --skip-b1; session 30's sixth call found no device time). The max-batch
# rows take XLA's appends at G=32 (batch > 8), the batch-1 rows the one-kernel writer.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 570 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3,kivi2,kivi2_g128 \
  --row-timeout 200 --out $OUT/tp_gemma_32k_s31a.json > $OUT/tp_gemma_32k_s31a_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_gemma_32k_s31a_log.txt | tail -n 7 | cut -c1-250
