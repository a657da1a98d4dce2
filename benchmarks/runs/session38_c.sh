#!/bin/bash
# Session 38, second build: the e4m3 tile with B's e4m3 words from one PTX block a register pair
# (`Options.ptx_words`, preset `dequant_fp8xp`; `mosaic_fp8_planes._words_ptx`: 652 -> 600 loop SASS compiled for
# an H200, 126 registers), both with o kept x 2^VALUE_SCALE_LOG2 through the loop. Natively: the tests (the words
# bit for bit against the jnp form), KIVI-2 G=128 alone at B=8 32k against the default and the fp16 build, through
# ops beside torch SDPA at B=8 and B=64 32k, then issue 3's table at 1k (B=1, 8, 64: every format, every peer) in
# what the call allows. CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-560}
native_tests 180 pytest_fp8 "xwarp or half or fp8_mma or planes or products or e4m3_words" \
  tests/test_mosaic_xwarp.py tests/test_mosaic_decode.py tests/test_mosaic_fp8_planes.py
B="fp16:dequant_denorm_s32_mb:glue;fp8x:dequant_fp8x:glue;fp8xp:dequant_fp8xp:glue"
B="$B;fp8x_again:dequant_fp8x:glue;fp8xp_again:dequant_fp8xp:glue"
alone "$B" kivi_g128_fp8 $(( LIMIT - SECONDS - 300 ))
timeout $(( LIMIT - SECONDS - 150 )) python3 benchmarks/runs/session37_ops.py $OUT 8:32768,64:32768 \
  dequant_fp8x,dequant_fp8xp > $OUT/ops_log.txt 2>&1
echo "ops rc=$?"
grep -v Warning $OUT/ops_log.txt | grep -E " us |failed|Error" | cut -c1-200 | tail -n 8
LEFT=$(( LIMIT - SECONDS - 10 ))
if (( LEFT > 60 )); then
  timeout $LEFT python3 benchmarks/decode_kernels.py --batches 1,8,64 --contexts 1024 --step-batches 0 \
    --stream-gb 2 --out $OUT/decode_h100_1024_s38.json > $OUT/dk_1024_log.txt 2>&1
  echo "dk 1024 rc=$?"
  grep -v Warning $OUT/dk_1024_log.txt | grep -E " us " | awk '{print $3, $4, $5, $7}' | tail -n 40
fi
rm -f $OUT/*.png
