#!/bin/bash
# Session 7, device call 1 (Llama-3-8B heads): channel-major value codes (`value_t`) for FP8 / INT8
# GPU-checked and swept at B=8, 32k beside torch SDPA; the in-kernel KIVI key flush checked on the GPU
# for the formats session 6 did not reach (G=128, a sink format); a num_splits sweep at short contexts.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 230 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats fp8_e4m3,int8 \
  --sweep fp8_e4m3,int8 --sweep-variants-only --tune --batches 8 --contexts 32768 --formats fp8_e4m3,int8 \
  --peers torch_sdpa,cudnn --step-batches "" --reps 3 --out $OUT/decode_s7_value_t.json > $OUT/value_t_log.txt 2>&1
echo "value_t rc=$?"
JAX_PLATFORMS=cuda timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "kivi_key_flush and (g128 or sink)" > $OUT/flush_pytest_log.txt 2>&1; echo "pytest rc=$?"
timeout 190 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3,kivi2 \
  --sweep-points 8:1024,8:4096,1:4096,1:32768 --sweep-splits 2,4,8,16,64 --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s7_splits.json > $OUT/splits_log.txt 2>&1; echo "splits rc=$?"
rm -f $OUT/*.png
grep -E "check|sweep|tuned|stream|torch|cudnn|kvjax" $OUT/value_t_log.txt | cut -c1-110
tail -n 3 $OUT/flush_pytest_log.txt
grep -E "sweep" $OUT/splits_log.txt | cut -c1-100
