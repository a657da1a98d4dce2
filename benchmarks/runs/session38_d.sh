#!/bin/bash
# Session 38, with little device time left: `Options.ptx_words` (preset `dequant_fp8xp`) natively, lean: the
# words bit for bit against the jnp form and the preset against the reference, then KIVI-2 G=128 alone at B=8
# 32k against the default (`dequant_fp8x`). CALL_LIMIT_S: the call's budget in seconds.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
LIMIT=${CALL_LIMIT_S:-240}
timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_mosaic_fp8_planes.py tests/test_mosaic_decode.py \
  -k "e4m3_words or (fp8_mma_matches and fp8xp)" > $OUT/pytest_fp8xp.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_fp8xp.txt | cut -c1-300
B="fp8x:dequant_fp8x:glue;fp8xp:dequant_fp8xp:glue;fp8x_again:dequant_fp8x:glue;fp8xp_again:dequant_fp8xp:glue"
timeout $(( LIMIT - SECONDS - 5 )) python3 benchmarks/mosaic_sass.py --builds "$B" --point 8:32768 --splits 8 \
  --reps 5 --out $OUT/kivi_g128_fp8xp.json > $OUT/fp8xp_log.txt 2>&1
echo "alone rc=$?"; grep -v Warning $OUT/fp8xp_log.txt | grep -E '"build"|Error|error' | python3 -c "
import json, sys
for l in sys.stdin:
  try: r = json.loads(l); print(r['build'], r.get('us'), r.get('registers'), r.get('smem_bytes'))
  except Exception: print(l[:200])"
