#!/bin/bash
# Session 15, call 1. `Options.stop_at_length` (preset dequant_mask_s16_stop: each split's pipeline over a
# dynamic grid of its steps below the length) and `Options.balance` (dequant_mask_s16_bal: the splits
# share those steps evenly) against the default dequant_mask_s16 (walks the whole capacity, masked):
# GPU check, then B=8 at 32k full (is the dynamic grid free?) and holding 1/32 and 1/4 of the
# capacity (1k / 8k tokens in a 32k cache; B=8 and B=1), 8 and 32 splits, bf16 scales as a cache's.
set -u
source "$(dirname "$0")/device_setup.sh"
V=dequant_mask_s16,dequant_mask_s16_stop,dequant_mask_s16_bal
timeout 220 python3 benchmarks/mosaic_kivi_bench.py --variants $V --points 8:32768 --splits 8,32 --peers torch_sdpa \
  --scale-dtype bfloat16 --out $OUT/mosaic_s15a.json > $OUT/mosaic_log.txt 2>&1; echo "mosaic rc=$?"
for f in 0.03125 0.25; do
  timeout 150 python3 benchmarks/mosaic_kivi_bench.py --no-check --variants $V --points 8:32768,1:32768 --splits 8,32 \
    --peers "" --scale-dtype bfloat16 --fill $f --out $OUT/mosaic_s15a_fill$f.json > $OUT/mosaic_fill$f.txt 2>&1
  echo "fill $f rc=$?"
done
for f in $OUT/mosaic_log.txt $OUT/mosaic_fill*.txt; do
  grep -v "Warning\|nvdisasm\|Source Loc\|dump.cc" $f | grep -E "check|mosaic|torch|Error|error" | tail -n 12 | cut -c1-200
done
