#!/bin/bash
# Session 13, call 1: the KIVI-2 window + split merge as one Pallas kernel (`window_merge`, replacing a
# dozen XLA kernels that cost 43 us over the 128 us Mosaic kernel at B=8 32k) and a jit around
# `mosaic_decode` (32 layers lower once: session 12's kivi2_g128 throughput row timed out at 120 s).
# 1. GPU check of kivi2_g128 (words cache -> Mosaic kernel + window_merge; and pallas_merge=False, the
# XLA window); 2. Llama-3-8B throughput at 32k, bf16 and kivi2_g128 in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 100 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128 \
  --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s13_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
grep -E "check" $OUT/check_log.txt | cut -c1-200
timeout 440 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2_g128 \
  --skip-b1 --row-timeout 330 --out $OUT/tp_llama_32k_s13.json > $OUT/tp_log.txt 2>&1; echo "tp rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 12 | cut -c1-250
