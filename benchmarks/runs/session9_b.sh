#!/bin/bash
# Prepared in session 8, for the next session: Gemma-2-2B throughput with the tiled FP8 / INT8 value
# layout (its FP8 kernel went from 543 to 426 us at B=24, 32k; `NOTES_gpu.md` session 8), bf16 in the
# same run, and Gemma at 4k.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 330 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,fp8_e4m3,int8 \
  --skip-b1 --row-timeout 105 --out $OUT/tp_gemma_32k_s9.json > $OUT/tp_gemma_32k_log.txt 2>&1; echo "gemma 32k rc=$?"
timeout 250 python3 benchmarks/throughput.py --models gemma2_2b --contexts 4096 --formats bf16,fp8_e4m3,kivi2 \
  --skip-b1 --row-timeout 80 --out $OUT/tp_gemma_4k_s9.json > $OUT/tp_gemma_4k_log.txt 2>&1; echo "gemma 4k rc=$?"
rm -f $OUT/*.png
tail -n 6 $OUT/tp_gemma_32k_log.txt; tail -n 6 $OUT/tp_gemma_4k_log.txt
