#!/bin/bash
# Session 19, call 3. Session 18's Mosaic FP8 kernel timed 271 us alone at B=8 32k (call 1,
# `decode_parts/mosaic_sass_fp8_s18a_*.json`), flat in splits, stages and the step's tokens: TMA bound
# (the codes were copied as [8, 16]-byte tiles: 16-byte rows); the 8-bit key path (keys in 128-byte
# swizzled tiles) 186. Now every code tile goes in whole swizzled rows (`Fp8Options.swizzle`, default) and
# is loaded whole, sliced into slabs in registers. 1. native tests; 2. builds alone; 3. through ops against
# Triton's FP8 kernel and torch SDPA (long contexts and B=64 4k).
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_fp8.py \
  -k "natively or (TestMosaicFp8Decode and (ragged or several or value_layouts or gqa))" \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -n 4
B8="sw8:fp8;sw64_8:fp8+tile=64;swk3_8:fp8+key_terms=3;sw64k3_8:fp8+tile=64+key_terms=3;old8:fp8+swizzle=False;up8:fp8+upcast_layout=True;kp8:fp8+key_perm=True"
timeout 160 python3 benchmarks/mosaic_sass.py --kernel fp8 --splits 8 --out $OUT/mosaic_sass_fp8_s19a.json \
  --builds "$B8" > $OUT/sass_log.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z0-9_]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log.txt | cut -c1-200
SWEEP='[{"mosaic_fp8": true}, {"mosaic_fp8": true, "num_splits": 8}, {"mosaic_fp8": {"tile": 64}},
        {"mosaic_fp8": {"key_perm": true}}, {"mosaic_fp8": {"key_terms": 3}}]'
timeout 230 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768,131072 --formats fp8_e4m3 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 2 --sweep fp8_e4m3 \
  --sweep-points 8:32768,8:131072,64:4096 --sweep-options "$SWEEP" \
  --out $OUT/decode_s19a_long.json > $OUT/long_log.txt 2>&1; echo "long rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/long_log.txt | grep -E " us |failed|Error|error" | cut -c1-200
