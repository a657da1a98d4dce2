#!/bin/bash
# Session 16, call 5. Llama-3-8B bf16 at 4k, so the 4k kivi2_g128 row of call 4 has a bf16 row of this
# session's machine beside it (the README's was session 3's).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 200 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats bf16 \
  --skip-b1 --row-timeout 180 --out $OUT/tp_llama_4k_bf16_s16e.json > $OUT/tp_log.txt 2>&1; echo "tp rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 4 | cut -c1-250
