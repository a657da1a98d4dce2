#!/bin/bash
# Session 20, call 1 (prepared; no device was lent in session 20). Session 19: the Mosaic FP8 kernel alone 127.0 us at B=8 32k, 138.6 through ops (torch
# SDPA 244.4: 1.85x needs 132.1), the rest XLA q prep and merge and their launch gaps. Now both are in the
# kernel (`Fp8Options.fused`, `mosaic_epilogue`: q read as given, the splits of a (b, k) one cluster merged by
# its first program). 1. native tests (the cluster merge repeated over many clusters); 2. the kernel alone,
# fused or not (mosaic_sass); 3. through ops against
# Triton's FP8 kernel, the unfused Mosaic build and torch SDPA, long and short contexts.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_fp8.py \
  -k "natively or (TestMosaicFp8Decode and (ragged or several or gqa))" \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error|assert" $OUT/pytest.txt | tail -n 8
timeout 110 python3 benchmarks/mosaic_sass.py --kernel fp8 --splits 4 --out $OUT/mosaic_sass_fp8_s20a.json \
  --builds "base:fp8;fused:fp8+fused=True" > $OUT/sass_log.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log.txt | cut -c1-160
SWEEP='[{"mosaic_fp8": {"fused": true}, "value_tile": 128}, {"mosaic_fp8": true, "value_tile": 128},
        {"mosaic_fp8": {"fused": true}, "value_tile": 128, "num_splits": 8}]'
timeout 300 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 4096,32768 --formats fp8_e4m3 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 2 --sweep fp8_e4m3 \
  --sweep-points 8:32768,8:131072,64:4096,1:4096,1:1024,8:1024 --sweep-options "$SWEEP" \
  --out $OUT/decode_s20a.json > $OUT/log.txt 2>&1; echo "rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
