#!/bin/bash
# Session 7, device call 3: the throughput rows the table still lacks (Llama-3-8B: KIVI-4 at 4k;
# FP8 and INT8 at 32k with the batch-1 step latency and prefill), and INT8 with the per-block
# transposed value codes (`value_t`) at B=8, 32k. Gemma at 4k is left for a later call.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 60 python3 benchmarks/decode_kernels.py --sweep int8 --sweep-variants-only --batches "" --peers "" \
  --reps 3 --stream-gb 1 --out $OUT/decode_s7_value_t_int8.json > $OUT/value_t_int8_log.txt 2>&1; echo "int8 rc=$?"
timeout 100 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats kivi4 \
  --skip-b1 --row-timeout 95 --out $OUT/tp_llama_4k_s7c.json > $OUT/tp_4k_log.txt 2>&1; echo "tp 4k rc=$?"
timeout 170 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats fp8_e4m3,int8 \
  --row-timeout 84 --out $OUT/tp_llama_32k_b1_s7.json > $OUT/tp_b1_log.txt 2>&1; echo "tp b1 rc=$?"
rm -f $OUT/*.png
grep -E "sweep: " $OUT/value_t_int8_log.txt | cut -c1-100
tail -n 4 $OUT/tp_4k_log.txt; tail -n 5 $OUT/tp_b1_log.txt
