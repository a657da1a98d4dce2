#!/bin/bash
# Session 32, the committed defaults: (1) tests/test_mosaic_fp8{,_wide}.py natively (head_dim 256, soft-cap, window,
# INT8, the switches); (2) issue 7's Gemma-2-2B 32k bf16 / FP8 rows with no flag (`ops.MOSAIC_FP8_MIN_CAPACITY` sends the
# 32k head_dim-256 FP8 caches to the Mosaic kernel), batch-1 latency included.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q tests/test_mosaic_fp8.py tests/test_mosaic_fp8_wide.py > $OUT/pytest_fp8_all.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_fp8_all.txt | cut -c1-300
timeout 250 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3 \
  --row-timeout 120 --out $OUT/tp_gemma_32k_s32g.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 7 | cut -c1-250
