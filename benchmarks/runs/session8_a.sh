#!/bin/bash
# Session 8, device call 1: FP8 / INT8 value codes stored in 64-token tiles by the cache itself
# (`init_cache(value_tile=)`, the GPU default now): the GPU tests on tiled caches (kernel, one-kernel
# append), then the table's FP8 / INT8 cells (steps and appends at B=8) beside torch SDPA and cudnn,
# the checked variant sweep (tiled neighbours and the token-major layout) at B=8, 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "value_layouts or tiled or value_tile or append_equals or append_inplace or decode_step or (matches_reference and (fp8 or int8))" \
  > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
timeout 240 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats fp8_e4m3,int8 \
  --sweep fp8_e4m3,int8 --sweep-variants-only --batches 8 --contexts 1024,4096,32768,131072 \
  --formats fp8_e4m3,fp8_e5m2,int8 --peers torch_sdpa,cudnn --step-batches 8 --reps 3 \
  --out $OUT/decode_s8_b8.json > $OUT/b8_log.txt 2>&1; echo "b8 rc=$?"
timeout 130 python3 benchmarks/decode_kernels.py --batches 1,64 --contexts 4096,32768 \
  --formats fp8_e4m3,fp8_e5m2,int8 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s8_b1_b64.json > $OUT/b1_log.txt 2>&1; echo "b1/b64 rc=$?"
rm -f $OUT/*.png
tail -n 4 $OUT/pytest_log.txt | cut -c1-200
grep -E "check|sweep:" $OUT/b8_log.txt | cut -c1-100
for f in b8 b1; do grep -A8 "best bf16 peer" $OUT/${f}_log.txt | cut -c1-130; done
