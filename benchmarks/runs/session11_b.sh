#!/bin/bash
# Session 11, call 2. Call 1 (session11_a.sh) ran the Mosaic GPU KIVI-2 kernel on the H200 for the first
# time: correct, 218 us at B=8 32k (Triton 320, torch SDPA 245) and flat in the split count. This call:
# ptxas's register counts and SASS of both variants; the in-kernel profiler's ns per tile of each region;
# variant "offset" (call 1's kernel) against "exact" (one cross-warp reduction per tile, not four).
set -u
source "$(dirname "$0")/device_setup.sh"
mkdir -p $OUT/dump
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$OUT/dump timeout 90 python3 \
  benchmarks/mosaic_kivi_bench.py --points "" --peers "" --stream-gb 0.1 --out $OUT/dump_check.json \
  > $OUT/dump_log.txt 2>&1; echo "dump rc=$?"
timeout 300 python3 benchmarks/mosaic_kivi_bench.py --points 8:32768 --splits 4,8 --profile 8:8192:4 \
  --profile-dir $OUT/prof --out $OUT/mosaic_s11b.json > $OUT/mosaic_log.txt 2>&1; echo "mosaic rc=$?"
timeout 110 python3 benchmarks/mosaic_kivi_bench.py --no-check --points 1:32768 --splits 16,32 --peers torch_sdpa \
  --out $OUT/mosaic_s11b_b1.json > $OUT/mosaic_b1_log.txt 2>&1; echo "b1 rc=$?"
grep -v Warning $OUT/mosaic_log.txt | grep -v "^ " | tail -n 20 | cut -c1-250
grep -v Warning $OUT/mosaic_b1_log.txt | tail -n 6 | cut -c1-160
grep -i -E "registers|spill|error" $OUT/dump_log.txt | head -20
ls $OUT/dump | head; du -sh $OUT/dump $OUT/prof
