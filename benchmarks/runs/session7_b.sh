#!/bin/bash
# Session 7, device call 2 (Llama-3-8B heads): the table's short-context and batch-1 cells with the
# short-context split rule (`ops.quant_target`) and this session's defaults, beside torch SDPA and
# cudnn; value codes transposed per 64-token block (`value_t`, tiled) swept for FP8 / INT8 at B=8, 32k;
# the KIVI-2 G=128 append with its key flush in the kernel (now the default) at B=8, 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
F=fp8_e4m3,int8,int4,kivi4,kivi2,kivi2_g128
timeout 130 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats fp8_e4m3 \
  --sweep fp8_e4m3,int8 --sweep-variants-only --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s7_value_t_tiled.json > $OUT/value_t_log.txt 2>&1; echo "value_t rc=$?"
timeout 200 python3 benchmarks/decode_kernels.py --batches 1 --contexts 1024,4096,32768,131072 --formats $F \
  --peers torch_sdpa,cudnn --step-batches "" --reps 3 --out $OUT/decode_s7_b1.json > $OUT/b1_log.txt 2>&1; echo "b1 rc=$?"
timeout 150 python3 benchmarks/decode_kernels.py --batches 8 --contexts 1024,4096 --formats $F \
  --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 --out $OUT/decode_s7_b8.json > $OUT/b8_log.txt 2>&1; echo "b8 rc=$?"
timeout 80 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi2_g128,fp8_e4m3 \
  --peers "" --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s7_append.json > $OUT/append_log.txt 2>&1; echo "append rc=$?"
rm -f $OUT/*.png
grep -E "value_t|sweep: " $OUT/value_t_log.txt | cut -c1-100
for f in b1 b8; do grep -A9 "best bf16 peer" $OUT/${f}_log.txt | tail -n 9; done
grep -E "append|step|kvjax " $OUT/append_log.txt | cut -c1-90
