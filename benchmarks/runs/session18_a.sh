#!/bin/bash
# Session 18, call 1 (written without a device: none was lent in session 18; the next session's first call,
# `carry: [".whl"]` after `bash benchmarks/runs/wheels.sh`). The Mosaic GPU FP8 kernel
# (`pallas_kernels/gpu/mosaic_fp8.py`, `ops.decode_attention(mosaic_fp8=True)`), checked in the interpreter
# only; compiled for an H200 on the CPU (`decode_parts/mosaic_sass_aot_fp8_s18.json`): 128-token steps 110
# registers, 76 KB of shared memory (2 programs per SM), 708 SASS instructions a step (32 KB of codes);
# 64-token steps 82 registers, 42 KB (5 per SM), 453; the keys as 8-bit products against q in 2 / 3 e4m3
# terms (`key_terms`): 124 / 145 registers, 658 / 718. 1. its native tests (the states against the
# reference; the shared decode cases through ops); 2. the kernel alone at B=8 32k by build and splits.
# Then `session18_b.sh`: through ops against Triton's FP8 kernel and torch SDPA.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 190 python3 -m pytest -q -p no:cacheprovider -x tests/test_mosaic_fp8.py \
  -k "natively or (TestMosaicFp8Decode and (ragged or several or value_layouts or gqa))" \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -n 4
B4="f4:fp8;s3_4:fp8+stages=3;t64_4:fp8+tile=64;t64s3_4:fp8+tile=64+stages=3;k3_4:fp8+key_terms=3;k2_4:fp8+key_terms=2"
B8="f8:fp8;s3_8:fp8+stages=3;t64_8:fp8+tile=64;t64s3_8:fp8+tile=64+stages=3;t64k3_8:fp8+tile=64+key_terms=3"
B16="t64_16:fp8+tile=64;f16:fp8"
declare -A LIMIT=([4]=150 [8]=130 [16]=60)
for ns in 4 8 16; do
  builds=B$ns
  timeout ${LIMIT[$ns]} python3 benchmarks/mosaic_sass.py --kernel fp8 --splits $ns --out $OUT/mosaic_sass_fp8_s18a_$ns.json \
    --builds "${!builds}" > $OUT/sass_log_$ns.txt 2>&1
  echo "sass $ns rc=$?"; grep -o '"build": "[a-z0-9_]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log_$ns.txt | cut -c1-200
done
