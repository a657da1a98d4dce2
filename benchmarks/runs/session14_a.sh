#!/bin/bash
# Session 14, call 1. 1. GPU check of the one-kernel append into "words" caches (value codes into their
# bit planes, the key block flushed as packed rows; bit for bit against XLA scatters); 2. the Mosaic
# KIVI-2 kernel over bf16 scales (the cache's; session 12's bench used fp16: 128.0 us against 141.1 in
# the table's profile) per plane vs once per tile ("dequant_mask_s16"), WGMMA groups in flight (lag 2 / 4),
# 8 / 16 splits, 2 / 3 stages, B=8 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_kernels.py -k "words" \
  > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
tail -n 3 $OUT/pytest_log.txt | cut -c1-200
V=dequant_mask,dequant_mask_s16,dequant_mask_lag2,dequant_mask_lag4,dequant_mask_s16_lag2
timeout 200 python3 benchmarks/mosaic_kivi_bench.py --variants $V --points 8:32768 --splits 8 --peers "" \
  --scale-dtype bfloat16 --out $OUT/mosaic_s14a.json > $OUT/mosaic_log.txt 2>&1; echo "mosaic rc=$?"
timeout 150 python3 benchmarks/mosaic_kivi_bench.py --no-check --variants dequant_mask,dequant_mask_s16 \
  --points 8:32768 --splits 16 --stages 2,3 --peers torch_sdpa --scale-dtype bfloat16 \
  --out $OUT/mosaic_s14a_b.json > $OUT/mosaic_b_log.txt 2>&1; echo "b rc=$?"
timeout 60 python3 benchmarks/mosaic_kivi_bench.py --no-check --variants dequant_mask \
  --points 8:32768 --splits 8 --peers "" --out $OUT/mosaic_s14a_f16.json > $OUT/mosaic_f16_log.txt 2>&1
echo "f16 rc=$?"
for f in mosaic_log mosaic_b_log mosaic_f16_log; do
  grep -v "Warning\|nvdisasm\|Source Loc\|dump.cc" $OUT/$f.txt | grep -E "check|mosaic|torch|Error|error" | tail -n 14 | cut -c1-200
done
