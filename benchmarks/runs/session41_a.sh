#!/bin/bash
# Prepared in session 40 for the next call: `Options.warp_fetch` where it has not run natively or been timed
# (the head_dim-256 case of tests/test_mosaic_pipeline.py; KIVI-4 and Gemma's G=32 build alone with and without
# it, interleaved; the Mosaic FP8 kernel with `Fp8Options.warp_fetch`, Llama's and Gemma's head_dim), then
# session 39's full call (`session40_a.sh`: FP8's step with both writers, the short-context
# profiles, issue 3's 1k / 4k / 128k table) in the budget left. CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-560}
native_tests 120 pytest_warp_fetch "warp_fetch or defaults_take" tests/test_mosaic_pipeline.py
G="g:dequant_denorm_s32_mb_lag0:glue;gw:dequant_denorm_s32_mb_lag0w:glue;g_again:dequant_denorm_s32_mb_lag0:glue"
G="$G;gw_again:dequant_denorm_s32_mb_lag0w:glue"
for spec in "kivi4 --bits 4 --group 128 --shape llama3_8b" "gemma_g32 --bits 2 --group 32 --shape gemma2_2b"; do
  set -- $spec; name=$1; shift
  builds=$G; [[ $name == gemma* ]] && builds=${G//:glue/:gemma}
  timeout 110 python3 benchmarks/mosaic_sass.py "$@" --point 8:32768 --splits 8 --reps 5 --builds "$builds" \
    --out $OUT/${name}_warp_fetch.json > $OUT/${name}_warp_fetch_log.txt 2>&1
  grep -h '"build"' $OUT/${name}_warp_fetch_log.txt | python3 -c "
import json, sys
for l in sys.stdin: r = json.loads(l); print('$name', r['build'], r.get('us'), r.get('registers'))"
done
F="f:fp8;fw:fp8+warp_fetch=True;f_again:fp8;fw_again:fp8+warp_fetch=True"  # the Mosaic FP8 kernel (opt-in)
for shape in llama3_8b gemma2_2b; do
  timeout 90 python3 benchmarks/mosaic_sass.py --kernel fp8 --shape $shape --point 8:32768 --splits 4 --reps 5 \
    --builds "$F" --out $OUT/fp8_${shape}_warp_fetch.json > $OUT/fp8_${shape}_warp_fetch_log.txt 2>&1
  grep -h '"build"' $OUT/fp8_${shape}_warp_fetch_log.txt | python3 -c "
import json, sys
for l in sys.stdin: r = json.loads(l); print('fp8 $shape', r['build'], r.get('us'), r.get('registers'))"
done
LEFT=$(( LIMIT - SECONDS - 10 ))
(( LEFT > 120 )) && CALL_LIMIT_S=$LEFT bash "$(dirname "$0")/session40_a.sh"
