#!/bin/bash
# Session 24, call c (after call a: the 4-bit "words" writer bit-identical natively at T=1, with and without a
# key flush, so `write.NATIVE_WORDS_BITS = (2, 4)`): 1. the T=3 cases of the same diag and the native pytest
# of the writer over 4-bit words; 2. KIVI-4's step and append at B=8 32k with the one-kernel writer, KIVI-2
# G=32 beside it, torch SDPA in the same run. Name the card.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
JAX_PLATFORMS=cuda,cpu timeout 150 python3 benchmarks/runs/session24_words4_diag.py \
  kivi2_g32_t3,kivi4_g32_t3,kivi4_g128_t3 > $OUT/diag_t3.txt 2>&1
echo "diag rc=$?"; cut -c1-300 $OUT/diag_t3.txt
JAX_PLATFORMS=cuda,cpu timeout 200 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "(flush_equals_xla and kivi4) or share_words" > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|SKIPPED|passed|failed|Timeout" $OUT/pytest.txt | cut -c1-150 | tail -n 12
timeout 200 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi4,kivi2 \
  --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s24c.json > $OUT/log.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error|skipped" | cut -c1-200
