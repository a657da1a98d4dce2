#!/bin/bash
# Session 41, the short form of `session41_b.sh` for a call of ~6 minutes: the tests of `Options.redux_max`,
# `full_tiles` and `f16_rest` natively (one pytest), KIVI-2 G=128 alone at B=8 32k (`dequant_fp8xpw` against
# `dequant_fp8xpwrmh`, interleaved), then through ops beside torch SDPA at B=8 32k. CALL_LIMIT_S: the budget.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-360}
native_tests 110 pytest_redux_full "redux_max or f16_rest or warp_fetch_valid or defaults_take or e4m3_words" \
  tests/test_mosaic_pipeline.py tests/test_mosaic_fp8_planes.py
W="w:dequant_fp8xpw:glue;wrmh:dequant_fp8xpwrmh:glue;w_again:dequant_fp8xpw:glue;wrmh_again:dequant_fp8xpwrmh:glue"
alone "$W" kivi_g128_redux_full 110
(( LIMIT - SECONDS > 70 )) && timeout $(( LIMIT - SECONDS - 5 )) python3 benchmarks/runs/session37_ops.py $OUT \
  8:32768 dequant_fp8xpw,dequant_fp8xpwrmh > $OUT/ops_log.txt 2>&1
echo "ops rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/ops_log.txt | grep -E " us |Error" | cut -c1-120 | tail -n 12
