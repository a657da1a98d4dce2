#!/bin/bash
# Prepared in session 25: the KIVI in-kernel merge natively, now that m's rows are padded so that l's TMA
# destination is 128-byte aligned (`mosaic_epilogue.tma_padded`; session 25's call c failed with
# CUDA_ERROR_MISALIGNED_ADDRESS at 3 states, l 192 bytes past m). 1. One case alone first (an error is sticky
# for the process), then the rest; 2. if they pass, the in-kernel merge timed against the default
# (`session25_merge.py`: count and cluster, B=1 / 8, 1k / 4k, B=1 32k), torch SDPA in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
CUDA_LAUNCH_BLOCKING=1 JAX_PLATFORMS=cuda,cpu timeout 90 python3 -m pytest -o addopts="" -v -p no:cacheprovider \
  tests/test_mosaic_decode.py -k "merge_in_the_kernel and count-kivi2_g128-lengths0" > $OUT/pytest_one.txt 2>&1
echo "one case rc=$?"; grep -E "PASSED|FAILED|Error|error" $OUT/pytest_one.txt | cut -c1-200 | head -n 8
JAX_PLATFORMS=cuda,cpu timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  -k "merge_in_the_kernel" > $OUT/pytest_merge.txt 2>&1; echo "merge tests rc=$?"
grep -E "PASSED|FAILED|passed|failed" $OUT/pytest_merge.txt | cut -c1-150 | tail -n 12
REPS=5 timeout 270 python3 benchmarks/runs/session25_merge.py $OUT/merge.json > $OUT/merge_log.txt 2>&1
echo "merge rc=$?"; grep -E "^\{|torch" $OUT/merge_log.txt | cut -c1-230
