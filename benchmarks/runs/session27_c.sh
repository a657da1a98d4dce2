#!/bin/bash
# Prepared in session 26: the rows issue 7 asks for that `throughput_h200.json` lacks: Gemma-2-2B at 4k for INT8
# and KIVI-4 (and KIVI-2 on the Mosaic kernel), with bf16 in the same call, each with its batch-1 step latency and
# prefill (no --skip-b1: the merged table kept batch-1 figures only for the Llama 32k FP8 / INT8 rows).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 560 python3 benchmarks/throughput.py --models gemma2_2b --contexts 4096 \
  --formats bf16,int8,kivi4,kivi2 --row-timeout 130 --out $OUT/tp_gemma_4k_s27c.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 7 | cut -c1-250
