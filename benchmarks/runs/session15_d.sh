#!/bin/bash
# Session 15, call 4 (run at commit 24ba6eb). The in-kernel window folded into split 0 (its state the
# start of split 0's online softmax) instead of an extra program per (b, k), to test whether call 3's
# B=8 32k slowdown (171.5 us against 146.4) came from the 576 programs over 528 resident slots. It did
# not (174.1), and the fold was slower everywhere else, so the tree went back to the extra program: run
# on a later commit this script times that instead. 1. GPU check (`-k window`); 2. the sweep of
# mosaic_window="kernel" (8 splits) against the default at 8 points, with the kivi2_g128 table against
# torch SDPA in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_mosaic_decode.py -k "window" > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|Error" $OUT/pytest_log.txt | tail -n 3 | cut -c1-300
grep -E "registers|spill" $OUT/pytest_log.txt | sort | uniq -c | head -n 12 | cut -c1-200
timeout 330 python3 benchmarks/decode_kernels.py --batches 8,1,64 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --sweep kivi2_g128 --sweep-options '[{"mosaic_window": "kernel"}]' \
  --sweep-points 8:32768,1:32768,8:4096,1:4096,8:1024,1:1024,64:4096,64:1024 \
  --out $OUT/decode_s15d_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error|failed" | cut -c1-200
