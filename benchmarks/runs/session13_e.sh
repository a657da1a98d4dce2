#!/bin/bash
# Session 13, call 5: Llama-3-8B throughput at 4k for kivi2_g128 (words cache -> Mosaic kernel +
# window_merge); bf16 at 4k is the session-3 row (4596 tok/s, B=79; not this run).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 250 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats kivi2_g128 \
  --skip-b1 --row-timeout 240 --out $OUT/tp_llama_4k_s13e.json > $OUT/tp_log.txt 2>&1; echo "tp rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
