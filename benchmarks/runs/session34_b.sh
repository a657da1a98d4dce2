#!/bin/bash
# Session 34, the committed defaults at Gemma-2-2B 32k (FP8 and, since session34_a.sh, INT8 caches of head_dim 256
# from 16k tokens on the Mosaic kernel): issue 7's bf16 / FP8 / INT8 rows with no flag, batch-1 latency included;
# then the Mosaic FP8 kernel's tests natively in what is left (session33_a's full run reached its 200 s limit).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3,int8 \
  --row-timeout 140 --out $OUT/tp_gemma_32k_s34b.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
LEFT=$(( ${CALL_LIMIT_S:-560} - SECONDS - 10 )); [ "$LEFT" -gt 30 ] || exit 0
timeout $LEFT python3 -m pytest -q tests/test_mosaic_fp8_wide.py tests/test_mosaic_fp8.py -k "not int8" \
  > $OUT/pytest_fp8_rest.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_fp8_rest.txt | cut -c1-300
