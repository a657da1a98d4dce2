#!/bin/bash
# Session 38: session 37's e4m3 KIVI-2 tile (`Options.fp8_mma`, preset "dequant_fp8": its committed B_K range,
# never run natively) and the same with its two cross-warp reductions split around the step's own barriers
# (`Options.xwarp_split`, preset "dequant_fp8x", `mosaic_xwarp`: 7 BAR.SYNC a tile -> 4, compiled for an H200 on
# the CPU: 126 registers, 662 loop SASS, 54 KB, 4 programs per SM), natively: their tests, then KIVI-2 G=128 alone
# at B=8 32k (8 splits, glue build) against the default, then through ops beside torch SDPA (OPS_POINTS, default
# B=8 32k and B=64 32k). CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-560}
native_tests 180 pytest_fp8 "xwarp or half or fp8_mma or planes or products" tests/test_mosaic_xwarp.py \
  tests/test_mosaic_decode.py tests/test_mosaic_fp8_planes.py
B="default:dequant_denorm_s32_mb:glue;fp8:dequant_fp8:glue;fp8x:dequant_fp8x:glue"
B="$B;default_again:dequant_denorm_s32_mb:glue;fp8_again:dequant_fp8:glue;fp8x_again:dequant_fp8x:glue"
alone "$B" kivi_g128_fp8 $(( LIMIT - SECONDS - 240 ))
LEFT=$(( LIMIT - SECONDS - 8 ))
if (( LEFT > 60 )); then
  timeout $LEFT python3 benchmarks/runs/session37_ops.py $OUT ${OPS_POINTS:-8:32768,64:32768} \
    dequant_denorm_s32_mb,dequant_fp8x,dequant_fp8 > $OUT/ops_log.txt 2>&1
  echo "ops rc=$?"; rm -f $OUT/*.png
  grep -v Warning $OUT/ops_log.txt | grep -E " us |failed|Error" | cut -c1-200 | tail -n 14
fi
