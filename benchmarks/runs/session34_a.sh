#!/bin/bash
# Session 34, after session33_a.sh timed INT8 on the Mosaic FP8 kernel (Gemma B=24 32k 572.1 us against Triton's
# 703.3): INT8 caches of head_dim 256 from 16k tokens now take it by default. (1) Gemma's 32k bf16 and INT8
# throughput rows with that default (Triton's INT8 row: 1908.6 tokens/s); (2) the INT8 tests of the Mosaic FP8
# kernel natively (session33_a's full run reached its 200 s limit without a failure).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,int8 \
  --skip-b1 --row-timeout 150 --out $OUT/tp_gemma_32k_s34a.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 5 | cut -c1-250
timeout 150 python3 -m pytest -q tests/test_mosaic_fp8.py tests/test_mosaic_fp8_wide.py -k "int8" -x \
  > $OUT/pytest_int8.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_int8.txt | cut -c1-300
