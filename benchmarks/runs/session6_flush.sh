#!/bin/bash
# Session 6, last device call (trimmed from session6_llama.sh to the budget left): the in-kernel KIVI key
# flush checked on the GPU against the XLA path, and its append timed at B=8, 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 75 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "kivi_key_flush" > $OUT/flush_pytest_log.txt 2>&1; echo "pytest rc=$?"
timeout 55 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi2 \
  --peers "" --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s6_append.json > $OUT/append_log.txt 2>&1; echo "append rc=$?"
rm -f $OUT/*.png
tail -n 4 $OUT/flush_pytest_log.txt; grep -E "append|step" $OUT/append_log.txt | cut -c1-90
