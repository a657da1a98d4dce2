#!/bin/bash
# Session 30: call c's Gemma-2-2B 32k KIVI rows with the head_dim-256 G=32 writer on were 3% (KIVI-2) and 1% (KIVI-4)
# below session 29's with XLA's appends, though call a timed the append alone 15% faster at B=8. Here the decode step
# and the append alone, by writer (XLA's scatters: "kvjax_step"; the one-kernel writer: "kvjax_step_pallas"), at B=8
# and at issue 7's KIVI-2 batch 64, 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 benchmarks/decode_kernels.py --shape gemma2_2b --batches 8,64 --contexts 32768 --formats kivi2 \
  --peers torch_sdpa --step-batches 8,64 --reps 3 --stream-gb 1 --out $OUT/decode_gemma_g32_step.json > $OUT/step_g32_log.txt 2>&1
echo "step rc=$?"; grep -v Warning $OUT/step_g32_log.txt | grep -E " us |failed|Error|skipped" | cut -c1-200
