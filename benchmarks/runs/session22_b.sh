#!/bin/bash
# Session 22, call 2 (after session22_a.sh showed the Mosaic G=32 kernel right and ahead of Triton's):
# Llama-3-8B decode throughput at 32k, 40 GiB of KV cache, bf16 against KIVI-2 G=32 (the "kivi2" preset,
# the KIVI paper's) through the Mosaic kernel (`--kivi-words-g32`: the "words" layout; session 5's kivi2 row,
# Triton's planar kernel: 620 tokens/s, 0.94x) and kivi2_g128 (session 17: 1689, 2.67x), same run.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 560 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2,kivi2_g128 \
  --kivi-words-g32 --skip-b1 --row-timeout 180 --out $OUT/tp_llama_32k_s22b.json > $OUT/tp_log.txt 2>&1
echo "tp32k rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
