#!/bin/bash
# Session 27: Llama-3-8B at 4k with every KIVI format on the Mosaic kernel (the committed H200 rows for
# KIVI-2 G=32 and KIVI-4 at 4k are Triton's, sessions 7-16: KIVI-2 G=32 0.97x bf16), bf16 first (the base).
# Env: ROW_TIMEOUT (300 s; 150 s timed out the KIVI rows on an H100 in session 27), TP_FORMATS, TP_TIMEOUT.
set -u
source "$(dirname "$0")/device_setup.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
tag=$([[ "$card" == *H200* ]] && echo h200 || echo h100)
timeout ${TP_TIMEOUT:-560} python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --skip-b1 --row-timeout ${ROW_TIMEOUT:-300} \
  --formats ${TP_FORMATS:-bf16,kivi4,kivi2,kivi2_g128} --out $OUT/tp_llama_4k_s27e_$tag.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 10 | cut -c1-250
