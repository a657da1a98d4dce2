#!/bin/bash
# Session 35, calls 13-15 on a warm H100 (typed inline then; the same commands here): Llama-3-8B heads B=8 32k
# through ops against torch SDPA (Triton's FP8, the Mosaic FP8 kernel with its softmax over 8 columns and over 16,
# KIVI-2 G=128 and G=32); Gemma-2 heads B=24 32k FP8 / INT8 (the Mosaic kernel, the default there) narrow against
# wide; issue 7's Llama 32k rows (bf16, KIVI-2 G=32 and G=128) and Gemma 32k rows (bf16, FP8, INT8, KIVI-2).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
S='[{"mosaic_fp8": true, "value_tile": 128}, {"mosaic_fp8": {"narrow_softmax": false}, "value_tile": 128}]'
timeout 200 python3 benchmarks/decode_kernels.py --sweep fp8_e4m3 --sweep-points 8:32768 --sweep-options "$S" \
  --batches 8 --contexts 32768 --formats fp8_e4m3,kivi2_g128,kivi2 --peers torch_sdpa --step-batches 0 --reps 5 \
  --stream-gb 1 --out $OUT/decode_b8_32k_s35c.json > $OUT/c_log.txt 2>&1
for f in fp8_e4m3 int8; do
  S='[{"mosaic_fp8": {"narrow_softmax": false}}]'
  timeout 60 python3 benchmarks/decode_kernels.py --shape gemma2_2b --sweep $f --sweep-points 24:32768 \
    --sweep-options "$S" --batches 24 --contexts 32768 --formats $f --peers "" --step-batches 0 --reps 5 \
    --stream-gb 1 --out $OUT/decode_gemma_${f}_s35d.json > $OUT/d_${f}_log.txt 2>&1
done
timeout 330 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --skip-b1 --row-timeout 150 \
  --formats bf16,kivi2,kivi2_g128 --out $OUT/tp_llama_32k_s35d.json > $OUT/tp_llama_log.txt 2>&1
timeout 290 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --skip-b1 --row-timeout 120 \
  --formats bf16,fp8_e4m3,int8,kivi2 --out $OUT/tp_gemma_32k_s35e.json > $OUT/tp_gemma_log.txt 2>&1
rm -f $OUT/*.png
