#!/bin/bash
# Session 38: issue 3's table with the new KIVI-2 G=128 default (`dequant_fp8xp`) at the other contexts, every
# format beside every peer in the same call: 1k and 4k at B=1, 8, 64, then 128k at B=1, 8 in what the call allows
# (the 32k rows: call 3, `decode_parts/session38/call3/`). CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
LIMIT=${CALL_LIMIT_S:-560}
for ctx in 1024 4096; do
  timeout $(( LIMIT - SECONDS - 20 )) python3 benchmarks/decode_kernels.py --batches 1,8,64 --contexts $ctx \
    --step-batches 0 --stream-gb 2 --out $OUT/decode_h100_${ctx}_s38.json > $OUT/dk_${ctx}_log.txt 2>&1
  echo "dk $ctx rc=$?"
done
LEFT=$(( LIMIT - SECONDS - 10 ))
if (( LEFT > 60 )); then
  timeout $LEFT python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 131072 --step-batches 0 --stream-gb 2 \
    --out $OUT/decode_h100_131072_s38.json > $OUT/dk_131072_log.txt 2>&1
  echo "dk 131072 rc=$?"
fi
rm -f $OUT/*.png
cat $OUT/dk_*_log.txt | grep -v Warning | grep -E " us " | awk '{print $3, $4, $5, $6, $7}' | cut -c1-80 | tail -n 90
