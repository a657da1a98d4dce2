#!/bin/bash
# Session 40, first: `Options.warp_fetch` (preset `dequant_fp8xpw`: the tile pipeline's refetch issued by one
# warp a tile, rotating, `mosaic_pipeline`; compiled for an H200 the loop is 623 -> 562 SASS, ~60 of them run by
# one warp of 4) natively, then KIVI-2 G=128 alone at B=8 32k against the default (`dequant_fp8xp`), interleaved,
# then both through ops beside torch SDPA at B=8 and B=64 32k. CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-300}
native_tests 100 pytest_warp_fetch "warp_fetch or (fp8_mma_matches and fp8xp)" tests/test_mosaic_pipeline.py \
  tests/test_mosaic_decode.py
B="xp:dequant_fp8xp:glue;xpw:dequant_fp8xpw:glue;xp_again:dequant_fp8xp:glue;xpw_again:dequant_fp8xpw:glue"
alone "$B" kivi_g128_warp_fetch 100
(( LIMIT - SECONDS > 60 )) && timeout $(( LIMIT - SECONDS - 5 )) python3 benchmarks/runs/session37_ops.py $OUT \
  8:32768,64:32768 dequant_fp8xp,dequant_fp8xpw > $OUT/ops_log.txt 2>&1
echo "ops rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/ops_log.txt | grep -E " us |Error" | cut -c1-120 | tail -n 12
