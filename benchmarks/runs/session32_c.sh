#!/bin/bash
# Session 32: the Mosaic FP8 kernel at Gemma-2's head_dim 256 with its logit soft-cap and sliding window (new this
# session; the Triton kernel read 2.44 TB/s there on the H100 in session 31's profile). (1) its tests natively;
# (2) the attention alone at issue 7's FP8 batch (B=24, 32k): Triton's kernel (the default row) against the
# Mosaic builds (64- and 128-token steps, key_perm, 3 stages), beside torch SDPA bf16 at B=12 and 24; (3) the
# same with the 4096-token window (Gemma's local layers; no peer).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -q -x tests/test_mosaic_fp8.py -k "gemma or natively or sliding or bad_inputs" \
  > $OUT/pytest_fp8_gemma.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_fp8_gemma.txt | cut -c1-300
SWEEP='[{"mosaic_fp8": true}, {"mosaic_fp8": {"tile": 128}}, {"mosaic_fp8": {"tile": 64, "key_perm": true}}, {"mosaic_fp8": {"tile": 64, "stages": 3}}]'
timeout 200 python3 benchmarks/decode_kernels.py --shape gemma2_2b --sweep fp8_e4m3 --sweep-points 24:32768 \
  --sweep-options "$SWEEP" --batches 12,24 --contexts 32768 --formats bf16 --peers torch_sdpa --step-batches 0 \
  --reps 3 --stream-gb 1 --out $OUT/decode_gemma_fp8_mosaic.json > $OUT/sweep_log.txt 2>&1
echo "sweep rc=$?"; grep -v Warning $OUT/sweep_log.txt | grep -E " us |failed|Error|stream" | cut -c1-200
timeout 120 python3 benchmarks/decode_kernels.py --shape gemma2_2b --window 4096 --sweep fp8_e4m3 \
  --sweep-points 24:32768 --sweep-options "$SWEEP" --batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_gemma_fp8_mosaic_w4096.json > $OUT/sweep_w_log.txt 2>&1
echo "window rc=$?"; grep -v Warning $OUT/sweep_w_log.txt | grep -E " us |failed|Error" | cut -c1-200
