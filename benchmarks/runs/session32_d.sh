#!/bin/bash
# Session 32: issue 7's Gemma-2-2B 32k bf16 and FP8 rows with FP8 through the Mosaic kernel (`--mosaic-fp8`:
# head_dim 256, soft-cap and window, `mosaic_fp8.default_options`), batch-1 latency included.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3 --mosaic-fp8 \
  --row-timeout 140 --out $OUT/tp_gemma_32k_s32d.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 7 | cut -c1-250
