#!/bin/bash
# Session 34, the last ~450 s of device time: on an H200 (the card issue 7 names), issue 7's Llama-3-8B 32k rows
# with the split rule, bf16 then FP8 then KIVI-2 (G=32) in what the call allows; on an H100, the Gemma 32k INT8
# step on the Mosaic kernel profiled beside bf16's (`profile_generate.py`: attention / matmuls / append / other).
set -u
source "$(dirname "$0")/device_setup.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
LEFT=$(( ${CALL_LIMIT_S:-400} - SECONDS - 10 ))
if [[ "$card" == *H200* ]]; then
  timeout $LEFT python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --skip-b1 --row-timeout 170 \
    --formats ${TP_FORMATS:-bf16,fp8_e4m3,kivi2} --out $OUT/tp_llama_32k_s34e.json > $OUT/tp_log.txt 2>&1
  echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 8 | cut -c1-250
else
  timeout $LEFT python3 benchmarks/profile_generate.py --model gemma2_2b --points bf16:1:4096,int8:0:32768,bf16:0:32768 \
    --steps 16 --out $OUT/profile_generate_gemma_int8_mosaic.json > $OUT/profile_log.txt 2>&1
  echo "profile rc=$?"; grep -v Warning $OUT/profile_log.txt | tail -n 12 | cut -c1-250
fi
