#!/bin/bash
# Session 40, first: `Options.warp_fetch` (preset `dequant_fp8xpw`: the tile pipeline's refetch issued by one
# warp a tile, rotating, `mosaic_pipeline`; compiled for an H200 the loop is 623 -> 562 SASS, 61 of them run by
# one warp of 4) natively, then KIVI-2 G=128 alone at B=8 32k against the default (`dequant_fp8xp`), interleaved,
# the grouped build (G=32, KIVI-4) alone likewise, then G=128 through ops beside torch SDPA at B=8 and B=64
# 32k. CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-330}
native_tests 100 pytest_warp_fetch "warp_fetch or (fp8_mma_matches and fp8xp)" tests/test_mosaic_pipeline.py \
  tests/test_mosaic_decode.py
B="xp:dequant_fp8xp:glue;xpw:dequant_fp8xpw:glue;xp_again:dequant_fp8xp:glue;xpw_again:dequant_fp8xpw:glue"
alone "$B" kivi_g128_warp_fetch 100
for gb in "32 2 kivi2_g32" "128 4 kivi4"; do  # the grouped build (GROUPED_VARIANT) with and without it
  set -- $gb
  (( LIMIT - SECONDS > 150 )) && timeout 60 python3 benchmarks/mosaic_sass.py --group $1 --bits $2 --point 8:32768 \
    --splits 8 --reps 5 --builds "g:dequant_denorm_s32_mb_lag0:glue;gw:dequant_denorm_s32_mb_lag0w:glue" \
    --out $OUT/$3_warp_fetch.json > $OUT/$3_warp_fetch_log.txt 2>&1
  grep -h '"build"' $OUT/$3_warp_fetch_log.txt 2>/dev/null | python3 -c "
import json, sys
for l in sys.stdin: r = json.loads(l); print('$3', r['build'], r.get('us'), r.get('registers'))"
done
(( LIMIT - SECONDS > 60 )) && timeout $(( LIMIT - SECONDS - 5 )) python3 benchmarks/runs/session37_ops.py $OUT \
  8:32768,64:32768 dequant_fp8xp,dequant_fp8xpw > $OUT/ops_log.txt 2>&1
echo "ops rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/ops_log.txt | grep -E " us |Error" | cut -c1-120 | tail -n 12
