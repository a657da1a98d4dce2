#!/bin/bash
# Prepared in session 26, after session27_a.sh on the same card: the large-batch split rule checked natively
# (each point's output against the batch's first point: 8 splits take the Triton merge's chunked path, not yet
# checked on a GPU), KIVI-4 at issue 7's B=31 and G=128 at B=32 by splits (the rule is unchanged at <= 256 pairs),
# and the B=64 32k cells against torch SDPA in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
REPS=3 timeout 150 python3 benchmarks/runs/session26_waves.py $OUT/waves_g128.json kivi2_g128 69:1,69:0,32:0,32:8 \
  > $OUT/waves_log.txt 2>&1
REPS=3 timeout 130 python3 benchmarks/runs/session26_waves.py $OUT/waves_kivi4.json kivi4 31:0,31:4,31:8 \
  >> $OUT/waves_log.txt 2>&1
echo "waves rc=$?"; grep -E "^\{" $OUT/waves_log.txt | cut -c1-260
timeout 200 python3 benchmarks/decode_kernels.py --batches 64 --contexts 32768 --formats kivi2_g128,kivi2 \
  --peers torch_sdpa --step-batches "" --reps 3 --out $OUT/decode_s27b_b64.json > $OUT/decode_log.txt 2>&1
echo "decode rc=$?"; grep -E "torch|kivi" $OUT/decode_log.txt | tail -n 6 | cut -c1-200
