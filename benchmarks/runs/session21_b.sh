#!/bin/bash
# Session 21, call 3. Session20_a.sh (this session, on an H100): the FP8 kernel with its glue inside
# (`Fp8Options(fused=True)`) alone 268.7 us at B=8 32k 4 splits against 199.9 without, and 34% slower at 128k
# as well (a rate, not a tail), yet at B=64 4k (1 split: no cluster) 182.1 through ops against 192.0. Is it the
# cluster? 1. the native tests named (pytest ran past 150 s there); 2. the kernel alone fused or not at
# 1 / 2 / 4 / 8 splits (1: q read in the kernel, no cluster) at B=8 32k, and 4 splits at 128k.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 170 python3 -m pytest -v -o faulthandler_timeout=60 -p no:cacheprovider \
  tests/test_mosaic_fp8.py -k "glue_in_the_kernel_natively or ops_glue" > $OUT/pytest.txt 2>&1
echo "pytest rc=$?"; grep -E "PASSED|FAILED|Timeout|passed|failed|File .*kernels" $OUT/pytest.txt | cut -c1-150 | tail -n 24
for point in 8:32768/1 8:32768/2 8:32768/4 8:32768/8 8:131072/4; do
  tag=$(echo $point | tr ':/' '__')
  timeout 80 python3 benchmarks/mosaic_sass.py --kernel fp8 --point ${point%/*} --splits ${point#*/} \
    --out $OUT/mosaic_sass_fp8_s21b_$tag.json --builds "base:fp8;fused:fp8+fused=True;count:fp8+fused=True+merge=count" > $OUT/sass_log_$tag.txt 2>&1
  echo "sass $point rc=$?"
  grep -o '"build": "[a-z]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log_$tag.txt | cut -c1-160
done
