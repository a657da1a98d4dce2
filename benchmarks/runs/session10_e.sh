#!/bin/bash
# Session 10, call 5: the in-kernel query at Gemma-2-2B's head shape (2 query rows per KV head, head_dim
# 256, soft-cap 50: q_scale without log2 e) on the GPU, and Gemma-2-2B 32k throughput with it.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 95 python3 benchmarks/decode_kernels.py --shape gemma2_2b --check --check-quick \
  --check-formats fp8_e4m3,int8,bf16,kivi2_g128 --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s10_gemma_check.json > $OUT/gemma_check_log.txt 2>&1; echo "check rc=$?"
timeout 150 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3 \
  --skip-b1 --row-timeout 70 --out $OUT/tp_gemma_32k_s10.json > $OUT/tp_gemma_log.txt 2>&1; echo "gemma 32k rc=$?"
rm -f $OUT/*.png
grep -E "check" $OUT/gemma_check_log.txt | cut -c1-90
tail -n 5 $OUT/tp_gemma_log.txt
