#!/bin/bash
# Session 16, call 4. Serving throughput with the window inside the Mosaic kernel (mosaic_decode's "auto"
# now takes it everywhere): Llama-3-8B at 32k, bf16 and kivi2_g128 in the same run, then 4k kivi2_g128
# (against session 3's bf16 row).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 270 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2_g128 \
  --skip-b1 --row-timeout 200 --out $OUT/tp_llama_32k_s16d.json > $OUT/tp_log.txt 2>&1; echo "tp32k rc=$?"
grep -v Warning $OUT/tp_log.txt | tail -n 5 | cut -c1-250
timeout 250 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats kivi2_g128 \
  --skip-b1 --row-timeout 230 --out $OUT/tp_llama_4k_s16d.json > $OUT/tp4k_log.txt 2>&1; echo "tp4k rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp4k_log.txt | tail -n 4 | cut -c1-250
