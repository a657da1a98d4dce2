#!/bin/bash
# Prepared in session 24 for the next device run: issue 7's Llama-3-8B rows at 32k (40 GiB of KV cache) with
# session 24's KIVI path (4 launches a step): bf16, KIVI-4 (G=32, "words": its first row on the Mosaic kernel),
# KIVI-2 G=32 and G=128, in one run. Rows take ~2 min each to compile (session 22: 122 s for G=32).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 580 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 \
  --formats bf16,kivi4,kivi2,kivi2_g128 --skip-b1 --row-timeout 190 --out $OUT/tp_llama_32k_s25b.json \
  > $OUT/tp_log.txt 2>&1
echo "tp32k rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 8 | cut -c1-250
