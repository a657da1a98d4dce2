#!/bin/bash
# Session 18, call 3 (not run: no device in session 18; after session18_a/b, and only if the Mosaic FP8
# kernel won there). Llama-3-8B decode throughput at 32k, FP8 through the Mosaic kernel (`--mosaic-fp8`)
# against bf16 in the same run (issue 7's FP8 target, 1.9x, is met with Triton's kernel: 2.01x).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 420 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,fp8_e4m3 \
  --mosaic-fp8 --skip-b1 --row-timeout 200 --out $OUT/tp_llama_32k_s18c.json > $OUT/tp_log.txt 2>&1
echo "tp32k rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 5 | cut -c1-250
