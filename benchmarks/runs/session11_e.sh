#!/bin/bash
# Session 11, call 5 (the last of the session's device time). Call 4: "lean_lazy" (registers 178, the only
# cross-warp sums per tile the zero term's and the max) is the fastest preset, 192.6 us at B=8 32k.
# This call: "folded" / "folded_lazy" (zero / scale folded into each fp16 plane: the max is the only
# cross-warp sum per tile) against lean_lazy, torch SDPA and Triton kivi2_g128, with ptxas's report.
set -u
source "$(dirname "$0")/device_setup.sh"
mkdir -p /tmp/dump
V=folded,folded_lazy,lean_lazy
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=/tmp/dump timeout 150 python3 benchmarks/mosaic_kivi_bench.py \
  --variants $V --points 8:32768 --splits 4 --out $OUT/mosaic_s11e.json > $OUT/mosaic_log.txt 2>&1; echo "mosaic rc=$?"
(cd /tmp/dump && for f in *.ptxas; do echo "== $f"; grep -E "Used|spill" $f | cut -c1-160; done) > $OUT/ptxas_summary.txt
timeout 60 python3 benchmarks/mosaic_kivi_bench.py --no-check --variants folded_lazy --points 1:32768,8:4096 \
  --splits 32,4 --peers torch_sdpa --out $OUT/mosaic_s11e_b.json > $OUT/mosaic_b_log.txt 2>&1; echo "b rc=$?"
grep -v Warning $OUT/mosaic_log.txt | grep -v "^ " | tail -n 16 | cut -c1-200
grep -v Warning $OUT/mosaic_b_log.txt | grep -v "^ " | tail -n 10 | cut -c1-200
grep -E "Used" $OUT/ptxas_summary.txt | sort | uniq -c | cut -c1-200
