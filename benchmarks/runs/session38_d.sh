#!/bin/bash
# Session 38, with little device time left: `Options.ptx_words` (preset `dequant_fp8xp`) natively, lean: the
# words bit for bit against the jnp form and the preset against the reference, then KIVI-2 G=128 alone at B=8
# 32k against the default (`dequant_fp8x`). CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-240}
native_tests 90 pytest_fp8xp "e4m3_words or (fp8_mma_matches and fp8xp)" tests/test_mosaic_fp8_planes.py \
  tests/test_mosaic_decode.py
B="fp8x:dequant_fp8x:glue;fp8xp:dequant_fp8xp:glue;fp8x_again:dequant_fp8x:glue;fp8xp_again:dequant_fp8xp:glue"
alone "$B" kivi_g128_fp8xp $(( LIMIT - SECONDS - 5 ))
