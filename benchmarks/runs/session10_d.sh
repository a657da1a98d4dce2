#!/bin/bash
# Session 10, call 4: Llama-3-8B throughput at 32k with session 10's kernels (query scaled and padded in
# the kernel, the reworked merge), end to end through the jitted generate loop; bf16 in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 240 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,fp8_e4m3,kivi2 \
  --row-timeout 80 --out $OUT/tp_llama_32k_s10.json > $OUT/tp_llama_log.txt 2>&1; echo "llama 32k rc=$?"
rm -f $OUT/*.png
tail -n 6 $OUT/tp_llama_log.txt
