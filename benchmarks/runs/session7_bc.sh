#!/bin/bash
# Session 7, device call 2 (machine starts were refused for an hour, so calls b and c became this one):
# value codes transposed per 64-token block (`value_t`) for FP8 at B=8, 32k; the table's short-context
# and batch-1 cells with the short-context split rule (`ops.quant_target`) beside torch SDPA and cudnn;
# Llama-3-8B throughput at 4k for INT8 and KIVI-2 (session7_c.sh has the full list).
set -u
source "$(dirname "$0")/device_setup.sh"
F=fp8_e4m3,int8,int4,kivi4,kivi2,kivi2_g128
timeout 100 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats fp8_e4m3 \
  --sweep fp8_e4m3 --sweep-variants-only --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s7_value_t_tiled.json > $OUT/value_t_log.txt 2>&1; echo "value_t rc=$?"
timeout 150 python3 benchmarks/decode_kernels.py --batches 8 --contexts 1024,4096 --formats $F \
  --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 --out $OUT/decode_s7_b8.json > $OUT/b8_log.txt 2>&1; echo "b8 rc=$?"
timeout 120 python3 benchmarks/decode_kernels.py --batches 1 --contexts 4096,32768 --formats $F \
  --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 --out $OUT/decode_s7_b1.json > $OUT/b1_log.txt 2>&1; echo "b1 rc=$?"
timeout 190 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats int8,kivi2 \
  --skip-b1 --row-timeout 90 --out $OUT/tp_llama_4k_s7.json > $OUT/tp_4k_log.txt 2>&1; echo "tp 4k rc=$?"
rm -f $OUT/*.png
grep -E "value_t|sweep: " $OUT/value_t_log.txt | cut -c1-100
for f in b8 b1; do grep -A5 "best bf16 peer" $OUT/${f}_log.txt | tail -n 5; done
tail -n 6 $OUT/tp_4k_log.txt
