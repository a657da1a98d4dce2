#!/bin/bash
# Session 13, call 6: several query tokens (speculative verify) on a "words" KIVI-2 cache now run the
# Mosaic kernel + window_merge (causal among the last T, up to 16 rows per KV head) instead of falling
# back to XLA: the GPU check's T = 3 case (4 heads x 3 tokens = 12 rows) and the T = 1 large case.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 120 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128 \
  --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s13f_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
grep -E "check" $OUT/check_log.txt | cut -c1-200
