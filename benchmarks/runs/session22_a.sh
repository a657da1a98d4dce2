#!/bin/bash
# Session 22, call 1: KIVI-2 G=32 (the "kivi2" preset) on the Mosaic kernel (`mosaic_groups`: each M-block's
# group scales loaded per thread; the scales regrouped once a tile). Compiled for an H200 on the CPU (B=8 32k,
# 8 splits): tile loop 839 SASS instructions against G=128's 768; lag 0: 124 registers (4 programs per SM),
# lag 1: 130 (3). The Triton kernel (planar G=32) ran at 0.59-0.70x of torch SDPA at every point.
# 1. native tests of the G=32 path (and the KIVI merges: count / cluster at G=128, count at G=32);
# 2. the kernel alone at B=8 32k: G=128's default, G=32 lag 0 / lag 1 (mosaic_sass.py);
# 3. through ops: kivi2 planar (Triton, the default) and relaid as "words" (Mosaic) against torch SDPA.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  -k "g32 or merge_in_the_kernel" > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|passed|failed|Timeout" $OUT/pytest.txt | cut -c1-150 | tail -n 16
for g in 128 32; do
  B="g128:dequant_denorm_s32_mb"; [ $g = 32 ] && B="lag0:dequant_denorm_s32_mb_lag0;lag1:dequant_denorm_s32_mb"
  timeout 80 python3 benchmarks/mosaic_sass.py --point 8:32768 --splits 8 --group $g --builds "$B" \
    --out $OUT/mosaic_sass_g${g}.json > $OUT/sass_g${g}.txt 2>&1; echo "sass g$g rc=$?"
  grep -o '"build": "[a-z0-9]*".*"group": [0-9]*\|"registers": [0-9]*\|"us": [0-9.]*' $OUT/sass_g${g}.txt | tr '\n' ' '; echo
done
timeout 250 python3 benchmarks/decode_kernels.py --batches 1,8,64 --contexts 4096,32768 --formats kivi2 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 --sweep kivi2 \
  --sweep-points 8:32768,1:4096,8:4096,64:4096,1:32768,64:32768 --sweep-options '[{"kivi_layout": "words"}]' \
  --out $OUT/decode_s22a_kivi2.json > $OUT/log.txt 2>&1; echo "rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
