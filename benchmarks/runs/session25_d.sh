#!/bin/bash
# Session 25, last device call: `mosaic_epilogue.load_query_t` zero-fills again up to 4 query rows (the mask that
# lets 8 and 16 rows build cost 5 registers: 3 programs per SM, G=128 and KIVI-4 28-43% slower in call a). 1. The
# FP8 Mosaic kernel's native glue test (it shares `load_query_t`); 2. G=128 and KIVI-4 through ops at B=1 / 8,
# 1k to 128k, torch SDPA beside, and G=128's B=8 32k step; 3. issue 7's Llama 32k rows for KIVI-4 (its first on
# the Mosaic kernel) and KIVI-2 G=128 (bf16: session 22's row).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
JAX_PLATFORMS=cuda,cpu timeout 60 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_fp8.py \
  -k "glue_in_the_kernel_natively" > $OUT/pytest_fp8.txt 2>&1; echo "pytest fp8 rc=$?"
grep -E "PASSED|FAILED|passed|failed" $OUT/pytest_fp8.txt | cut -c1-150 | tail -n 12
timeout 150 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096,32768,131072 \
  --formats kivi2_g128,kivi4 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s25d.json > $OUT/log.txt 2>&1; echo "rc=$?"
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
timeout 290 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats kivi4,kivi2_g128 \
  --skip-b1 --row-timeout 140 --out $OUT/tp_llama_32k_s25d.json > $OUT/tp_log.txt 2>&1
echo "tp32k rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
