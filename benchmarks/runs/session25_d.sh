#!/bin/bash
# Session 25, last device call (~5 min of budget left): `mosaic_epilogue.load_query_t` zero-fills again up to 4
# query rows (the mask that lets 8 and 16 rows build cost 5 registers: 3 programs per SM, G=128 and KIVI-4 28-43%
# slower in call a). 1. The FP8 Mosaic kernel's native glue test (it shares `load_query_t`); 2. G=128 and KIVI-4
# through ops at B=1 / 8, 1k to 128k, torch SDPA beside; 3. G=128's B=8 32k step (the append's share).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
JAX_PLATFORMS=cuda,cpu timeout 50 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_fp8.py \
  -k "glue_in_the_kernel_natively" > $OUT/pytest_fp8.txt 2>&1; echo "pytest fp8 rc=$?"
grep -E "PASSED|FAILED|passed|failed" $OUT/pytest_fp8.txt | cut -c1-150 | tail -n 12
timeout 120 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096,32768,131072 \
  --formats kivi2_g128,kivi4 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s25d.json > $OUT/log.txt 2>&1; echo "rc=$?"
timeout 75 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi2_g128 \
  --peers "" --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s25d_steps.json > $OUT/log_steps.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt $OUT/log_steps.txt | grep -E " us |failed|Error|error" | cut -c1-200
