#!/bin/bash
# Session 23, call 3. Calls 1-2 (H100): KIVI-4 on Mosaic is right natively and faster than Triton's planar
# kernel except at B=1 4k, so KIVI-4 caches now default to "words"; the KIVI kernel's dequant builds no longer
# keep the f32 query, the scaled query and the zero rows in shared memory (KIVI-4 G=32 68 -> 54 KB: 4
# programs per SM instead of 3, AOT). 1. the native KIVI-4 and G=32 tests with that change; 2. KIVI-4's
# kernel alone at B=8 32k (call 1, at 3 per SM: 197.4 us); 3. KIVI-4 / KIVI-2 G=32 / G=128 through ops at B=8
# 32k with the step and the append (the 4-bit "words" append goes through XLA's scatters), torch SDPA beside.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  -k "kivi4 or g32" > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|passed|failed|Timeout" $OUT/pytest.txt | cut -c1-150 | tail -n 12
timeout 60 python3 benchmarks/mosaic_sass.py --point 8:32768 --splits 8 --group 32 --bits 4 \
  --builds "lag0:dequant_denorm_s32_mb_lag0" --out $OUT/mosaic_sass_kivi4.json > $OUT/sass.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z0-9]*"\|"registers": [0-9]*\|"us": [0-9.]*' $OUT/sass.txt | tr '\n' ' '; echo
timeout 170 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi4,kivi2,kivi2_g128 \
  --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s23b.json > $OUT/log.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
