#!/bin/bash
# Session 17, call 2. The new default (dequant_denorm_s32_mb; call 1: kernel alone at B=8 32k 107.2 us
# against 122.8, natively == the reference) through ops against torch SDPA in the same run: the
# kivi2_g128 rows at B = 8, 1, 64 and 32k / 4k / 1k; then Llama-3-8B decode throughput at 32k (bf16 and
# kivi2_g128 at the 40 GiB budget's max batch).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 200 python3 benchmarks/decode_kernels.py --batches 8,1,64 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s17b_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
grep -v "Warning" $OUT/table_log.txt | grep -E "x/|Error|error|failed" | cut -c1-200
timeout 300 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2_g128 \
  --skip-b1 --row-timeout 200 --out $OUT/tp_llama_32k_s17b.json > $OUT/tp_log.txt 2>&1; echo "tp32k rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 5 | cut -c1-250
