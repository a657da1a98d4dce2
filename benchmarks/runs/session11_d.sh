#!/bin/bash
# Session 11, call 4. Call 3's ptxas report: session 10's kernel ("offset") takes 195 registers (two
# CTAs of 128 threads per SM), "exact" 255 with spills. This call times the register-lean presets
# (`mosaic_kivi.VARIANTS`: planes issued with 1-2 WGMMA groups in flight, the query read from SMEM, ex2.approx)
# against both, with ptxas's report of every compile (the check compiles each preset twice, in order).
set -u
source "$(dirname "$0")/device_setup.sh"
mkdir -p /tmp/dump
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_RESOURCES=1 MOSAIC_GPU_DUMP_TO=/tmp/dump timeout 330 python3 \
  benchmarks/mosaic_kivi_bench.py --points 8:32768 --splits 4,8 --out $OUT/mosaic_s11d.json \
  > $OUT/mosaic_log.txt 2>&1; echo "mosaic rc=$?"
(cd /tmp/dump && for f in *.ptxas; do echo "== $f"; grep -E "Used|spill|injected" $f | cut -c1-160; done) > $OUT/ptxas_summary.txt
timeout 80 python3 benchmarks/mosaic_kivi_bench.py --no-check --points 1:32768 --splits 32 --peers torch_sdpa \
  --out $OUT/mosaic_s11d_b1.json > $OUT/mosaic_b_log.txt 2>&1; echo "b1 rc=$?"
timeout 80 python3 benchmarks/mosaic_kivi_bench.py --no-check --points 8:4096 --splits 4 --peers torch_sdpa \
  --out $OUT/mosaic_s11d_4k.json >> $OUT/mosaic_b_log.txt 2>&1; echo "4k rc=$?"
grep -v Warning $OUT/mosaic_log.txt | grep -v "^ " | tail -n 30 | cut -c1-200
grep -v Warning $OUT/mosaic_b_log.txt | grep -v "^ " | tail -n 16 | cut -c1-200
grep -E "Used|==" $OUT/ptxas_summary.txt | paste - - | awk 'NR%2==1' | cut -c1-200
