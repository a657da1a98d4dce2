#!/bin/bash
# Session 8, device call 4: (1) the KIVI append after `cache._round_to` (jitted == eager on the GPU?),
# (2) the tiled value layout at Gemma-2-2B heads (head_dim 256; B=24, 32k) checked and swept against
# token-major beside torch SDPA, (3) num_splits at short contexts with the tiled FP8 layout.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 60 python3 benchmarks/runs/session8_c_diag.py > $OUT/diag_log.txt 2>&1; echo "diag rc=$?"
JAX_PLATFORMS=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "append_inplace" > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
timeout 120 python3 benchmarks/decode_kernels.py --shape gemma2_2b --check --check-quick --check-formats fp8_e4m3,int8 \
  --sweep fp8_e4m3,int8 --sweep-variants-only --sweep-batch 24 --batches 24 --contexts 32768 \
  --formats fp8_e4m3,int8 --peers torch_sdpa --step-batches "" --reps 3 \
  --out $OUT/decode_gemma_s8.json > $OUT/gemma_log.txt 2>&1; echo "gemma rc=$?"
timeout 60 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3 \
  --sweep-points 8:1024,1:4096 --sweep-splits 4,8,16,32,64 --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s8_splits.json > $OUT/splits_log.txt 2>&1; echo "splits rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/diag_log.txt | tail -n 10
tail -n 2 $OUT/pytest_log.txt | cut -c1-200
grep -E "check|sweep:|torch" $OUT/gemma_log.txt | cut -c1-100
grep -E "sweep:" $OUT/splits_log.txt | cut -c1-100
