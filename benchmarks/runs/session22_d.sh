#!/bin/bash
# Session 22 (prepared; device time ran out): KIVI-4 (4-bit codes, "words" layout: 4 codes a uint16, two word
# tiles a row) on the Mosaic kernel. Interpreted and compiled for an H200 on the CPU (G=32, B=8 32k,
# `decode_parts/mosaic_sass_aot_kivi4_s22.json`): lag 0 126 registers, loop 851 SASS, but 68 KB of shared
# memory, 3 programs per SM (the codes' pipeline slots double). Triton's planar KIVI-4 kernel: 0.59-0.68x.
# 1. the native KIVI-4 tests; 2. the kernel alone at B=8 32k (lag 0 / 1); 3. through ops: kivi4 planar
# (Triton, the default) and relaid as "words" (Mosaic) against torch SDPA.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 120 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  -k "kivi4" > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|passed|failed|Timeout" $OUT/pytest.txt | cut -c1-150 | tail -n 8
timeout 90 python3 benchmarks/mosaic_sass.py --point 8:32768 --splits 8 --group 32 --bits 4 \
  --builds "lag0:dequant_denorm_s32_mb_lag0;lag1:dequant_denorm_s32_mb" --out $OUT/mosaic_sass_kivi4.json > $OUT/sass.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z0-9]*"\|"registers": [0-9]*\|"us": [0-9.]*' $OUT/sass.txt | tr '\n' ' '; echo
timeout 300 python3 benchmarks/decode_kernels.py --batches 1,8,64 --contexts 4096,32768 --formats kivi4 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --sweep kivi4 \
  --sweep-points 8:32768,1:4096,8:4096,64:4096,1:32768,64:32768 --sweep-options '[{"kivi_layout": "words"}]' \
  --out $OUT/decode_s22d_kivi4.json > $OUT/log.txt 2>&1; echo "rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
