#!/bin/bash
# Prepared in session 10 (no device time left), for session 11's first call: the experimental Mosaic
# GPU KIVI-2 kernel (`pallas_kernels/gpu/mosaic_kivi.py`: dequantized codes as WGMMA's register A
# operand; correct in the CPU interpreter, lowered for CUDA on the CPU) checked on the H200 and timed
# against the Triton kivi2_g128 kernel and torch SDPA in the same run, splits 4..32.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 400 python3 benchmarks/mosaic_kivi_bench.py --points 8:32768,1:32768,8:4096 --splits 4,8,16,32 --stages 2,3 \
  --out $OUT/mosaic_kivi_s11.json > $OUT/mosaic_log.txt 2>&1; echo "mosaic rc=$?"
JAX_PLATFORMS=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_kivi.py \
  > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
grep -v Warning $OUT/mosaic_log.txt | tail -n 30 | cut -c1-160
tail -n 3 $OUT/pytest_log.txt | cut -c1-200
