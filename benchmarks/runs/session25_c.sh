#!/bin/bash
# Session 25, first device call: natively, 1. the Mosaic decode tests with the query read in the kernel at any
# row count (`mosaic_epilogue.load_query_t` masks the rows past the query's, session 25; the 4-token cases are 16
# rows) and the in-kernel merge's tests (`test_merge_in_the_kernel`, 16-bit rows, now up to 16); 2. the FP8
# Mosaic kernel's tests (it shares `load_query_t`); 3. the in-kernel merge timed against the default
# (`session25_merge.py`), torch SDPA in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
JAX_PLATFORMS=cuda,cpu timeout 200 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  --durations=5 > $OUT/pytest_decode.txt 2>&1; echo "pytest decode rc=$?"
grep -E "PASSED|FAILED|ERROR|passed|failed|Timeout" $OUT/pytest_decode.txt | cut -c1-160 | tail -n 40
JAX_PLATFORMS=cuda,cpu timeout 100 python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/test_mosaic_fp8.py \
  > $OUT/pytest_fp8.txt 2>&1; echo "pytest fp8 rc=$?"
grep -E "FAILED|passed|failed|Timeout" $OUT/pytest_fp8.txt | cut -c1-160 | tail -n 8
REPS=5 timeout 270 python3 benchmarks/runs/session25_merge.py $OUT/merge.json > $OUT/merge_log.txt 2>&1
echo "merge rc=$?"; grep -E "^\{|torch" $OUT/merge_log.txt | cut -c1-230
