#!/bin/bash
# Session 34: where the Mosaic kernel starts to win at Gemma-2-2B heads (head_dim 256, soft-cap 50) for FP8 and INT8,
# to place `ops.MOSAIC_{FP8,INT8}_MIN_CAPACITY` (16k, from 4k and 32k points only): Triton's kernel against the
# Mosaic 64-token build at 8k and 16k, issue 7's batches there (40 GiB of 8-bit caches: B=96 at 8k, 48 at 16k) and B=1.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
SWEEP='[{"mosaic_fp8": true, "value_tile": 64}]'
for f in int8 fp8_e4m3; do
  timeout 110 python3 benchmarks/decode_kernels.py --shape gemma2_2b --sweep $f \
    --sweep-points 96:8192,48:16384,1:8192,1:16384 --sweep-options "$SWEEP" --batches "" --reps 3 --stream-gb 1 \
    --out $OUT/decode_gemma_${f}_8k16k.json > $OUT/sweep_${f}_log.txt 2>&1
  echo "$f rc=$?"; grep -v Warning $OUT/sweep_${f}_log.txt | grep -E " us |failed|Error|stream" | cut -c1-200
done
