#!/bin/bash
# Session 40, call 2. Short-context parity (issue 3: no quantized format slower than the best bf16 peer at any
# context >= 1k and any batch): the splits and the merge's place swept at B=1 1k / 4k and B=8 1k for the
# KIVI formats (the misses on the H200 in session 25) and FP8 / INT8, then those points' table rows beside
# torch SDPA and cuDNN in the same run. CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
LIMIT=${CALL_LIMIT_S:-400}
tag=$(echo "$card" | grep -q H200 && echo h200 || echo h100)
OPTS='[{"num_splits": 1}, {"num_splits": 2}, {"num_splits": 4}, {"num_splits": 8}, {"pallas_merge": false}]'
timeout $(( LIMIT - 20 )) python3 benchmarks/decode_kernels.py --sweep ${SWEEP_FORMATS:-kivi2_g128,kivi2,kivi4,fp8_e4m3,int8} \
  --sweep-points 1:1024,1:4096,8:1024 --sweep-options "$OPTS" --batches 1,8 --contexts 1024,4096 \
  --formats ${SWEEP_FORMATS:-kivi2_g128,kivi2,kivi4,fp8_e4m3,int8} --peers torch_sdpa,cudnn --step-batches 0 \
  --stream-gb 2 --out $OUT/decode_${tag}_short_s40.json > $OUT/dk_short_log.txt 2>&1
echo "dk short rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/dk_short_log.txt | grep -E " us |Error|failed" | awk '{print $2, $3, $4, $5, $6}' | cut -c1-90 | tail -n 120
