#!/bin/bash
# Prepared in session 30 (item -22): where issue 7's Gemma-2-2B 32k decode step goes at the throughput rows' max
# batches (bf16 12, FP8 24, KIVI-2 64: `profile_generate.py`, per kernel and per class), to explain FP8's 1.61x
# (step 12.6 ms at B=24 against bf16's 10.1 at B=12) from measurement.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 450 python3 benchmarks/profile_generate.py --model gemma2_2b --points bf16:0:32768,fp8_e4m3:0:32768,kivi2:0:32768 \
  --steps 16 --out $OUT/profile_generate_gemma.json > $OUT/profile_generate_log.txt 2>&1
echo "profile rc=$?"; grep -v Warning $OUT/profile_generate_log.txt | tail -n 30 | cut -c1-200
