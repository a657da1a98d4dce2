#!/bin/bash
# Session 16, call 2. The window's ring keys from shared memory (against q = hi + lo) instead of the A
# registers: the kernel's registers and time with and without the window (benchmarks/mosaic_sass.py),
# then the window tests natively on the GPU.
set -u
source "$(dirname "$0")/device_setup.sh"
B='base:dequant_mask_s16_bal;window:dequant_mask_s16_bal:window'
timeout 250 python3 benchmarks/mosaic_sass.py --builds "$B" --out $OUT/mosaic_sass_s16b.json > $OUT/log.txt 2>&1; echo "sass rc=$?"
grep -v "^\s*/\*\|^\s*$" $OUT/log.txt | grep -i "build\|error\|Traceback" | cut -c1-300 | tail -n 20
JAX_PLATFORMS=cuda timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_decode.py -k window > $OUT/pytest.txt 2>&1
echo "pytest rc=$?"; tail -n 5 $OUT/pytest.txt
