#!/bin/bash
# Session 7, device call 3: the throughput rows the table still lacks. Llama-3-8B at 4k for INT8,
# KIVI-4 and KIVI-2 (max batch at the 40 GiB budget, decode tokens/s), and at 32k FP8 and INT8 with
# the batch-1 step latency and prefill. The 4k bf16 / FP8 rows are session 3's (tp_llama_4k_s3.json).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 330 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats int8,kivi4,kivi2 \
  --skip-b1 --row-timeout 120 --out $OUT/tp_llama_4k_s7.json > $OUT/tp_4k_log.txt 2>&1; echo "tp 4k rc=$?"
timeout 200 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats fp8_e4m3,int8 \
  --row-timeout 100 --out $OUT/tp_llama_32k_b1_s7.json > $OUT/tp_b1_log.txt 2>&1; echo "tp b1 rc=$?"
rm -f $OUT/*.png
tail -n 8 $OUT/tp_4k_log.txt; tail -n 6 $OUT/tp_b1_log.txt
