#!/bin/bash
# Session 33: INT8 through the Mosaic FP8 kernel, first native run. (1) tests/test_mosaic_fp8{,_wide}.py natively
# (head_dim 256, soft-cap, window, INT8 with the prmt conversion, the switches); (2) INT8 attention alone at
# Gemma-2-2B heads (soft-cap 50), issue 7's INT8 batch at 32k (B=24) and B=1: Triton's INT8 kernel (the default row)
# against the Mosaic 64-token build with the prmt conversion, with Mosaic's astype, with key_perm; (3) the same at
# Llama-3-8B heads, B=8 32k (issue 3's point), 128-token builds, beside torch SDPA bf16 in the same call.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q tests/test_mosaic_fp8.py tests/test_mosaic_fp8_wide.py > $OUT/pytest_fp8_all.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_fp8_all.txt | cut -c1-300
SWEEP='[{"mosaic_fp8": true, "value_tile": 64}, {"mosaic_fp8": {"tile": 64, "int8_prmt": false}, "value_tile": 64},
 {"mosaic_fp8": {"tile": 64, "key_perm": true}, "value_tile": 64}]'
timeout 170 python3 benchmarks/decode_kernels.py --shape gemma2_2b --sweep int8 --sweep-points 24:32768,1:32768 \
  --sweep-options "$SWEEP" --batches "" --reps 3 --stream-gb 1 --out $OUT/decode_gemma_int8_mosaic.json \
  > $OUT/sweep_gemma_log.txt 2>&1
echo "gemma rc=$?"; grep -v Warning $OUT/sweep_gemma_log.txt | grep -E " us |failed|Error|stream" | cut -c1-200
SWEEP='[{"mosaic_fp8": true, "value_tile": 64}, {"mosaic_fp8": {"int8_prmt": false}, "value_tile": 64},
 {"mosaic_fp8": {"key_perm": true}, "value_tile": 64}]'
timeout 170 python3 benchmarks/decode_kernels.py --sweep int8 --sweep-points 8:32768 --sweep-options "$SWEEP" \
  --batches 8 --contexts 32768 --formats bf16 --peers torch_sdpa --step-batches 0 --reps 3 --stream-gb 1 \
  --out $OUT/decode_llama_int8_mosaic.json > $OUT/sweep_llama_log.txt 2>&1
echo "llama rc=$?"; grep -v Warning $OUT/sweep_llama_log.txt | grep -E " us |failed|Error|stream" | cut -c1-200
