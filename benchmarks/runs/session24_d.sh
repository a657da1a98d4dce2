#!/bin/bash
# Session 24, call d: 1. the writer's G=32 values quantized in the kernel (`write._kivi_groups`) and the key
# flush reading the new lengths (`flush_keys` ends), natively against the XLA scatters (T=1 values, key flushes);
# 2. the step at B=8 32k with bf16 tokens (a bf16 model's k / v), the glue in the kernel and the Triton
# merge (`mosaic_decode.GLUE_IN_KERNEL`, `pallas_merge_default`): KIVI-4, KIVI-2 G=32, torch SDPA in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
JAX_PLATFORMS=cuda,cpu timeout 100 python3 benchmarks/runs/session24_words4_diag.py \
  kivi2_g32_values,kivi4_g32_flush,kivi2_g128_flush > $OUT/diag.txt 2>&1
echo "diag rc=$?"; cut -c1-300 $OUT/diag.txt
timeout 220 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi4,kivi2 \
  --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s24d.json > $OUT/log.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error|skipped" | cut -c1-200
