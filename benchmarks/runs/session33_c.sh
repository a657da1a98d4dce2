#!/bin/bash
# Session 33, one call when device time is short: (1) the Mosaic FP8 kernel's INT8 and Gemma tests natively;
# (2) INT8 attention alone, Triton's kernel (the default row) against the Mosaic build: Gemma-2-2B heads B=24 32k
# (and key_perm), Llama-3-8B heads B=8 32k beside torch SDPA bf16; (3) in what the call has left, Gemma's 32k
# bf16 and INT8 throughput rows with INT8 through the Mosaic kernel (`--mosaic-int8`; Triton's: 1908.6 tokens/s).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q tests/test_mosaic_fp8.py tests/test_mosaic_fp8_wide.py -k "int8 or gemma or natively" \
  > $OUT/pytest_fp8_int8.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_fp8_int8.txt | cut -c1-300
SWEEP='[{"mosaic_fp8": true, "value_tile": 64}, {"mosaic_fp8": {"tile": 64, "key_perm": true}, "value_tile": 64}]'
timeout 110 python3 benchmarks/decode_kernels.py --shape gemma2_2b --sweep int8 --sweep-points 24:32768 \
  --sweep-options "$SWEEP" --batches "" --reps 3 --stream-gb 1 --out $OUT/decode_gemma_int8_mosaic.json \
  > $OUT/sweep_gemma_log.txt 2>&1
echo "gemma rc=$?"; grep -v Warning $OUT/sweep_gemma_log.txt | grep -E " us |failed|Error|stream" | cut -c1-200
[ $(( ${CALL_LIMIT_S:-560} - SECONDS )) -gt 110 ] || exit 0  # a short call: the Gemma points only
timeout 90 python3 benchmarks/decode_kernels.py --sweep int8 --sweep-points 8:32768 \
  --sweep-options '[{"mosaic_fp8": true, "value_tile": 64}]' --batches 8 --contexts 32768 --formats bf16 \
  --peers torch_sdpa --step-batches 0 --reps 3 --stream-gb 1 --out $OUT/decode_llama_int8_mosaic.json \
  > $OUT/sweep_llama_log.txt 2>&1
echo "llama rc=$?"; grep -v Warning $OUT/sweep_llama_log.txt | grep -E " us |failed|Error|stream" | cut -c1-200
LEFT=$(( ${CALL_LIMIT_S:-560} - SECONDS - 15 ))  # the throughput rows in what the call has left (~70 s a row)
echo "left for throughput: $LEFT s"; [ "$LEFT" -gt 150 ] || exit 0
timeout $LEFT python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,int8 --mosaic-int8 \
  --skip-b1 --row-timeout 120 --out $OUT/tp_gemma_32k_s33c.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 5 | cut -c1-250
