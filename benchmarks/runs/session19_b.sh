#!/bin/bash
# Session 19, call 4 (after session19_a.sh): the swizzled Mosaic FP8 kernel through ops at short contexts
# against Triton's FP8 kernel and torch SDPA, then Llama-3-8B FP8 throughput at 32k with it (`--mosaic-fp8`)
# against bf16 in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
SWEEP='[{"mosaic_fp8": true}, {"mosaic_fp8": {"tile": 64}}]'
timeout 200 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024 --formats fp8_e4m3 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --sweep fp8_e4m3 \
  --sweep-points 1:1024,8:1024,1:4096,8:4096,1:32768,64:32768 --sweep-options "$SWEEP" \
  --out $OUT/decode_s19b_short.json > $OUT/short_log.txt 2>&1; echo "short rc=$?"
grep -hv "Warning" $OUT/short_log.txt | grep -E " us |failed|Error|error" | cut -c1-200
timeout 330 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,fp8_e4m3 \
  --mosaic-fp8 --skip-b1 --row-timeout 150 --out $OUT/tp_llama_32k_s19b.json > $OUT/tp_log.txt 2>&1
echo "tp32k rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 5 | cut -c1-250
