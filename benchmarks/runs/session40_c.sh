#!/bin/bash
# Session 40: on an H200 only (the card issue 7 names; its rows there date from session 26), issue 7's
# Llama-3-8B 32k rows with today's defaults, bf16 first, then KIVI-2 G=32, FP8 and KIVI-2 G=128 in what the call
# allows. On another card it stops at once.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
if [[ "$card" != *H200* ]]; then echo "not an H200: nothing run"; exit 0; fi
source "$(dirname "$0")/device_setup.sh"
timeout $(( ${CALL_LIMIT_S:-360} - SECONDS - 8 )) python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 \
  --skip-b1 --row-timeout 120 --formats ${TP_FORMATS:-bf16,kivi2,fp8_e4m3,kivi2_g128} \
  --out $OUT/tp_llama_32k_s40.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 9 | cut -c1-200
