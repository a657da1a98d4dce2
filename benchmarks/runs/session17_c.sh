#!/bin/bash
# Session 17, call 3. The default's softmax without its second mask (a masked logit is NEG 2^14 below any
# m, so exp2 gives 0 itself: the tile loop 784 -> 768 SASS instructions on the CPU's compile). 1. the native
# tests again; 2. the kernel alone (B=8 32k, with and without the window program); 3. the kivi2_g128 rows
# at B = 8 and 1 (32k / 4k / 1k / 128k) against torch SDPA, same run; 4. Llama-3-8B throughput at 4k.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 200 python3 -m pytest -q -p no:cacheprovider -x \
  tests/test_mosaic_kivi.py tests/test_mosaic_decode.py -k "natively or window_in_the_kernel" \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; head -n 1 $OUT/pytest.txt; grep -E "Error|FAILED" $OUT/pytest.txt | head -n 4
timeout 60 python3 benchmarks/mosaic_sass.py --builds 'mb:dequant_denorm_s32_mb;mbw:dequant_denorm_s32_mb:window' \
  --out $OUT/mosaic_sass_s17c.json > $OUT/sass_log.txt 2>&1
echo "sass rc=$?"; grep -o '"build": "[a-z0-9]*".*"us": [0-9.]*\|"registers": [0-9]*' $OUT/sass_log.txt | cut -c1-300
timeout 130 python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 32768,4096,1024,131072 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s17c_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
grep -v "Warning" $OUT/table_log.txt | grep -E "x/|Error|error|failed" | cut -c1-200
timeout 190 python3 benchmarks/throughput.py --models llama3_8b --contexts 4096 --formats kivi2_g128 \
  --skip-b1 --row-timeout 180 --out $OUT/tp_llama_4k_s17c.json > $OUT/tp4k_log.txt 2>&1; echo "tp4k rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp4k_log.txt | tail -n 4 | cut -c1-250
