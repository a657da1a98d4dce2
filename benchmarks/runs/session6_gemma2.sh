#!/bin/bash
# Session 6, device call 2: Gemma-2-2B head shape with the head_dim-scaled warps (ops.default_warps):
# kernels at B=24, 32k (global and 4k window) vs torch SDPA, then the Gemma-2-2B throughput rows at 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 170 python3 benchmarks/decode_kernels.py --shape gemma2_2b --check --check-quick --check-formats int4,kivi2 \
  --batches 24 --contexts 32768 --formats bf16,fp8_e4m3,int8,int4,kivi4,kivi2,kivi2_g128 --peers torch_sdpa \
  --step-batches "" --reps 3 --out $OUT/decode_gemma_s6b.json > $OUT/gemma_kernel_log_b.txt 2>&1; echo "kernel rc=$?"
timeout 50 python3 benchmarks/decode_kernels.py --shape gemma2_2b --window 4096 --batches 24 --contexts 32768 \
  --formats fp8_e4m3,kivi2 --peers "" --step-batches "" --reps 3 \
  --out $OUT/decode_gemma_window_s6b.json >> $OUT/gemma_kernel_log_b.txt 2>&1; echo "window rc=$?"
timeout 330 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3,int8,kivi4,kivi2 \
  --skip-b1 --row-timeout 110 --out $OUT/tp_gemma_32k_s6.json > $OUT/gemma_tp_log_b.txt 2>&1; echo "tp rc=$?"
rm -f $OUT/*.png
grep -E "check|x/|B=24" $OUT/gemma_kernel_log_b.txt | tail -n 24; tail -n 9 $OUT/gemma_tp_log_b.txt
