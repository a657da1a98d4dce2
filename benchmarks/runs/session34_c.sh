#!/bin/bash
# Session 34: INT8 at Llama-3-8B heads B=8 32k (issue 3's point) on the Mosaic kernel over 128-token value tiles
# (session33_a timed 64-token ones only: 200.3 us against Triton's 193.6; FP8 gained ~9 us from 128-token tiles in
# session 19), with key_perm; FP8 the same beside them, and torch SDPA bf16, one call (H100 or H200).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
SWEEP='[{"mosaic_fp8": true, "value_tile": 128}, {"mosaic_fp8": {"key_perm": true}, "value_tile": 128}]'
for f in int8 fp8_e4m3; do
  timeout 100 python3 benchmarks/decode_kernels.py --sweep $f --sweep-points 8:32768,1:32768 --sweep-options "$SWEEP" \
    --batches 8 --contexts 32768 --formats bf16 --peers torch_sdpa --step-batches 0 --reps 5 --stream-gb 1 \
    --out $OUT/decode_llama_${f}_vt128.json > $OUT/sweep_${f}_log.txt 2>&1
  echo "$f rc=$?"; grep -v Warning $OUT/sweep_${f}_log.txt | grep -E " us |failed|Error|stream" | cut -c1-200
done
