#!/bin/bash
# Session 33, issue 7's Gemma-2-2B 32k rows in one call: bf16 (the base); FP8 with the committed default (no flag:
# `ops.MOSAIC_FP8_MIN_CAPACITY` sends 32k head_dim-256 FP8 caches to the Mosaic kernel); INT8 through the same
# kernel (`--mosaic-int8`; session 27's INT8 row on Triton's kernel: 1908.6 tokens/s). Batch-1 latency included.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3 \
  --row-timeout 120 --out $OUT/tp_gemma_32k_s33b.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
timeout 200 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats int8 --mosaic-int8 \
  --row-timeout 150 --out $OUT/tp_gemma_32k_int8_s33b.json > $OUT/tp8_log.txt 2>&1
echo "tp int8 rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp8_log.txt | tail -n 5 | cut -c1-250
