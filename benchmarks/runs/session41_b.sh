#!/bin/bash
# Session 41, first: `Options.redux_max` (the tile's key-scale max by one REDUX a warp) and `Options.full_tiles`
# (the softmax's length mask only on tiles that hold the length, behind a warp-uniform branch): compiled for an
# H200, KIVI-2 G=128's loop 562 (default `dequant_fp8xpw`) -> 554 (`dequant_fp8xpwr`) -> 534 on a full tile
# (`dequant_fp8xpwrm`) -> 518 with `Options.f16_rest` (B's lo words from the rest in fp16: `dequant_fp8xpwrmh`),
# 123 registers, 4 programs per SM; G=32 723 -> 712 (`dequant_denorm_s32_mb_lag0wm`).
# Their tests natively, then KIVI-2 G=128 alone at B=8 32k (interleaved), through ops beside torch SDPA at
# B=8 / B=64 32k, and G=32 alone; then session 41's other call (`session41_a.sh`) in the budget left.
# CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-560}
native_tests 100 pytest_redux_full "redux_max or f16_rest or warp_fetch_valid or defaults_take" \
  tests/test_mosaic_pipeline.py
native_tests 60 pytest_words "e4m3_words" tests/test_mosaic_fp8_planes.py
W="w:dequant_fp8xpw:glue;wr:dequant_fp8xpwr:glue;wrm:dequant_fp8xpwrm:glue;wrmh:dequant_fp8xpwrmh:glue"
alone "$W;w_again:dequant_fp8xpw:glue;wrmh_again:dequant_fp8xpwrmh:glue" kivi_g128_redux_full 160
(( LIMIT - SECONDS > 150 )) && timeout 120 python3 benchmarks/runs/session37_ops.py $OUT \
  8:32768,64:32768 dequant_fp8xpw,dequant_fp8xpwrmh > $OUT/ops_log.txt 2>&1
echo "ops rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/ops_log.txt | grep -E " us |Error" | cut -c1-120 | tail -n 12
(( LIMIT - SECONDS > 100 )) && timeout 70 python3 benchmarks/mosaic_sass.py --group 32 --point 8:32768 --splits 8 \
  --reps 5 --builds "gw:dequant_denorm_s32_mb_lag0w:glue;gwm:dequant_denorm_s32_mb_lag0wm:glue" \
  --out $OUT/kivi2_g32_full.json > $OUT/kivi2_g32_full_log.txt 2>&1
grep -h '"build"' $OUT/kivi2_g32_full_log.txt 2>/dev/null | python3 -c "
import json, sys
for l in sys.stdin: r = json.loads(l); print('kivi2_g32', r['build'], r.get('us'), r.get('registers'))"
LEFT=$(( LIMIT - SECONDS - 10 ))
(( LEFT > 150 )) && CALL_LIMIT_S=$LEFT bash "$(dirname "$0")/session41_a.sh"
