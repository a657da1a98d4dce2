#!/bin/bash
# Prepared in session 24 for the next device run: 1. the native test of a T=20 append into 4-bit words (tokens
# 16 apart share a word), alone with a long limit: a stall or a slow compile? (session 24: not finished in the
# time left of 200 s; `write.NATIVE_WORDS4_MAX_TOKENS` refuses it meanwhile); 2. the KIVI in-kernel merge's
# native tests, now that its "hang" is known to be a compile-time layout search (session 24) and the merge is
# limited to 16-bit rows, <= 4 of them (its 16-row case falls back to XLA's merge).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
JAX_PLATFORMS=cuda,cpu timeout 300 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "share_words and kivi4" --durations=0 > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|passed|failed|Timeout|s call" $OUT/pytest.txt | cut -c1-150 | tail -n 6
JAX_PLATFORMS=cuda,cpu timeout 240 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  -k "merge_in_the_kernel" > $OUT/pytest_merge.txt 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|passed|failed|Error" $OUT/pytest_merge.txt | cut -c1-150 | tail -n 12
