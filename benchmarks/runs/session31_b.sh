#!/bin/bash
# Prepared in session 30 (item -22). (1) Where the head_dim-256 G=32 writer stops paying: session 30 measured its
# decode step 4% faster than XLA's scatters at B=8 and 2% slower at B=64 (write.NATIVE_WIDE_WORDS_GROUPS[32] = 8);
# here B=16 and 32. (2) Why Gemma's FP8 / INT8 rows reach 1.61x, not ~2x, at 32k: the attention alone at issue 7's
# batches (bf16 B=12, FP8 / INT8 B=24; Triton's kernel at head_dim 256, Mosaic's FP8 kernel takes 128 only) beside
# torch SDPA, with the step (append included) at B=24.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python3 benchmarks/decode_kernels.py --shape gemma2_2b --batches 16,32 --contexts 32768 --formats kivi2 \
  --peers torch_sdpa --step-batches 16,32 --reps 3 --stream-gb 1 --out $OUT/decode_gemma_g32_writer.json > $OUT/writer_log.txt 2>&1
echo "writer rc=$?"; grep -v Warning $OUT/writer_log.txt | grep -E " us |failed|Error|skipped" | cut -c1-200
timeout 280 python3 benchmarks/decode_kernels.py --shape gemma2_2b --batches 12,24 --contexts 32768 \
  --formats bf16,fp8_e4m3,int8 --peers torch_sdpa --step-batches 24 --reps 3 --stream-gb 1 \
  --out $OUT/decode_gemma_fp8.json > $OUT/fp8_log.txt 2>&1
echo "fp8 rc=$?"; grep -v Warning $OUT/fp8_log.txt | grep -E " us |failed|Error|skipped" | cut -c1-200
