#!/bin/bash
# Session 6, device call 3 (Llama-3-8B heads): the in-kernel KIVI key flush checked on the GPU and its append
# timed at B=8, 32k; the table's B=1 cells with this session's kernels (session 5 re-timed only B=8).
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 130 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "kivi_key_flush or pallas_append_equals or flush_helpers" > $OUT/flush_pytest_log.txt 2>&1; echo "pytest rc=$?"
timeout 100 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats fp8_e4m3,kivi2,kivi2_g128,kivi4 \
  --peers torch_sdpa --step-batches 8 --reps 3 --out $OUT/decode_s6_append.json > $OUT/append_log.txt 2>&1; echo "append rc=$?"
timeout 150 python3 benchmarks/decode_kernels.py --batches 1 --contexts 1024,4096,32768,131072 \
  --formats fp8_e4m3,int8,int4,kivi4,kivi2,kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 \
  --out $OUT/decode_s6_b1.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
tail -n 4 $OUT/flush_pytest_log.txt; grep -E "append|step" $OUT/append_log.txt | cut -c1-90
grep -A6 "best bf16 peer" $OUT/table_log.txt | tail -n 6
