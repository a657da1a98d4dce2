#!/bin/bash
# Session 37's second call (name the card: either may come). First, on either card: what one register-A WGMMA
# costs an SM at decode's small N (`benchmarks/wgmma_rate.py`, new): fp16 m64nNk16 at N = 8-128 and 1-8
# programs per SM, with the kernel's lag 1 and with all issued before one wait, and e4m3 m64nNk32 (twice the k
# a WGMMA). Session 37's first call found the KIVI-2 G=128 kernel's B=8 32k time (H100) unmoved by a 5th
# program per SM and by its bytes coming from L2: if a small-N WGMMA costs the SM ~40 cycles, its 32 a tile
# are the bound, and N = 8 (no faster) fits that too.
# Then on an H200 (none lent since session 26): session 36's H200 branch (issue 7's Llama 32k rows, issue 3's
# B=8 32k cells beside torch SDPA and cuDNN).
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
LIMIT=${CALL_LIMIT_S:-580}
C="fp16:16:1:1,fp16:16:2:1,fp16:16:4:1,fp16:16:8:1,fp16:8:4:1,fp16:32:4:1,fp16:64:4:1,fp16:128:4:1"
C="$C,fp16:16:4:none,fp16:8:4:none,fp16:8:1:1,e4m3:8:4:1,e4m3:16:4:1,e4m3:16:4:none,e4m3:8:1:1,e4m3:16:1:1"
timeout 200 python3 benchmarks/wgmma_rate.py --cases "$C" --out $OUT/wgmma_rate.json > $OUT/rate_log.txt 2>&1
echo "rate rc=$?"; grep -v Warning $OUT/rate_log.txt | grep -E '^\{|Error' | python3 -c "
import json, sys
for l in sys.stdin:
  try: r = json.loads(l)
  except Exception: print(l[:200]); continue
  print(r['dtype'], r['n'], r['programs'], r['lag'], r.get('cycles_per_wgmma_per_sm'), r.get('ns_per_wgmma_per_sm'),
        r.get('max_rel_err'), r.get('error', '')[:150])"
if [[ "$card" == *H200* ]]; then
  CALL_LIMIT_S=$(( LIMIT - SECONDS )) bash "$(dirname "$0")/session36_a.sh" | tail -n +2
fi
