#!/bin/bash
# Session 16, call 1. What the Mosaic KIVI-2 kernel compiles to, with and without the residual window as
# one more program (why B=8 32k is slower with it: 171.5 against 146.4 us in session 15): ptxas
# registers and spills, programs per SM they allow, and each build's time alone at B=8 32k
# (benchmarks/mosaic_sass.py; the raw PTX / ptxas dumps in a tarball: the device wrote no SASS, which
# benchmarks/ptx_registers.py then made from the PTX on the CPU).
set -u
source "$(dirname "$0")/device_setup.sh"
B='base:dequant_mask_s16_bal;window:dequant_mask_s16_bal:window;walk:dequant_mask_s16'
timeout 400 python3 benchmarks/mosaic_sass.py --builds "$B" --out $OUT/mosaic_sass_s16a.json \
  --dumps $OUT/mosaic_dumps_s16a.tar.gz > $OUT/log.txt 2>&1; echo "rc=$?"
grep -v "^\s*/\*\|^\s*$" $OUT/log.txt | grep -i "build\|error\|Traceback\|registers" | cut -c1-400 | tail -n 30
