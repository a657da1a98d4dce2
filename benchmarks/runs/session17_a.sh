#!/bin/bash
# Session 17, call 1. The KIVI-2 kernel's new tile step (preset dequant_denorm_s32_mb, mosaic_decode's
# default): the planes as fp16 subnormals (`Options(unpack="denorm")`: one HFMA2 per pair of codes after
# the mask, no 0x6400 / 1024), the shift for planes 5-7 on 32-bit pairs (`shift32`) and hand-placed
# barriers (`manual_barriers`); compiled for an H200 on the CPU the tile loop is 784 SASS instructions
# against the old default's 988. 1. the native tests (states == the reference for the new presets with
# bf16 and fp16 scales; the window in the kernel through decode_attention); 2. the kernel alone, B=8 32k,
# old default against each step of the new one (and lag 0, and the window program).
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 300 python3 -m pytest -q -p no:cacheprovider -x \
  tests/test_mosaic_kivi.py tests/test_mosaic_decode.py -k "natively or window_in_the_kernel or auto" \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.txt | tail -n 4
B='om:dequant_mask_s16_bal_om;den:dequant_denorm;d32:dequant_denorm_s32;mb:dequant_denorm_s32_mb'
B="$B;l0:dequant_denorm_s32_mb+lag=0;mbw:dequant_denorm_s32_mb:window;omw:dequant_mask_s16_bal_om:window"
timeout 200 python3 benchmarks/mosaic_sass.py --builds "$B" --out $OUT/mosaic_sass_s17a.json > $OUT/sass_log.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z0-9]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log.txt | cut -c1-300
