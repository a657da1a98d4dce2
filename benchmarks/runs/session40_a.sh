#!/bin/bash
# Session 40, call 1 (session 39's unrun full call). (1) The step at B=8 32k (KIVI-2 G=128, FP8) with each
# writer (placed, XLA's positions) beside torch SDPA: the append's share. (2) The kernels of G=128's append and
# step, and of the attention alone at B=1 1k / 4k and B=8 1k (KIVI-2 G=128, G=32), from profiler traces.
# (3) Issue 3's table at 1k and 4k (B=1, 8, 64), every format beside every peer, and 128k (B=8, 1) in what the
# call allows. CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
LIMIT=${CALL_LIMIT_S:-560}
tag=$(echo "$card" | grep -q H200 && echo h200 || echo h100)
timeout 150 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi2_g128,fp8_e4m3 \
  --peers torch_sdpa --step-batches 8 --stream-gb 2 --out $OUT/decode_${tag}_step_s40.json > $OUT/dk_step_log.txt 2>&1
echo "dk step rc=$?"; grep -v Warning $OUT/dk_step_log.txt | grep -E " us |Error" | cut -c1-120 | tail -n 20
(( LIMIT - SECONDS > 140 )) && timeout 60 python3 benchmarks/profile_step.py --what append,step --formats kivi2_g128 \
  --points 8:32768 --top 8 --out $OUT/profile_step_s40.json > $OUT/profile_log.txt 2>&1
echo "profile rc=$?"; grep -v Warning $OUT/profile_log.txt | tail -n 20 | cut -c1-160
(( LIMIT - SECONDS > 100 )) && timeout 80 python3 benchmarks/profile_step.py --what attend --formats kivi2_g128,kivi2 \
  --points 1:1024,1:4096,8:1024 --top 6 --out $OUT/profile_attend_s40.json > $OUT/profile_attend_log.txt 2>&1
echo "profile attend rc=$?"; grep -v Warning $OUT/profile_attend_log.txt | tail -n 40 | cut -c1-160
for ctx in 1024 4096; do
  (( LIMIT - SECONDS > 80 )) || break
  timeout $(( LIMIT - SECONDS - 20 )) python3 benchmarks/decode_kernels.py --batches 1,8,64 --contexts $ctx \
    --step-batches 0 --stream-gb 2 --out $OUT/decode_${tag}_${ctx}_s40.json > $OUT/dk_${ctx}_log.txt 2>&1
  echo "dk $ctx rc=$?"
done
LEFT=$(( LIMIT - SECONDS - 10 ))
if (( LEFT > 60 )); then
  timeout $LEFT python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 131072 --step-batches 0 --stream-gb 2 \
    --out $OUT/decode_${tag}_131072_s40.json > $OUT/dk_131072_log.txt 2>&1
  echo "dk 131072 rc=$?"
fi
rm -f $OUT/*.png
cat $OUT/dk_[0-9]*_log.txt | grep -v Warning | grep -E " us " | awk '{print $3, $4, $5, $6, $7}' | cut -c1-80 | tail -n 90
