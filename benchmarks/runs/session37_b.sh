#!/bin/bash
# Session 37's e4m3 KIVI-2 tile (`Options.fp8_mma`, preset "dequant_fp8"), natively: its tests (and
# `mosaic_fp8_planes`'), then KIVI-2 G=128 alone at B=8 32k (8 splits, glue build) against the default, then
# through ops beside torch SDPA (B=8 32k, B=1 32k, B=64 32k; OPS_POINTS to change). Compiled for an H200 on the
# CPU (`decode_parts/session37/mosaic_sass_aot_fp8_v*.json`): v1 (calls 6) 123 registers, 632 loop SASS a tile;
# v2 (call 7) 122, 676; v3 (committed, never run natively) 124, 665; the default 117, 675; all 52 / 48 KB (4
# programs per SM), 16 QGMMA against 32 HGMMA.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
LIMIT=${CALL_LIMIT_S:-560}
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_mosaic_decode.py tests/test_mosaic_fp8_planes.py \
  -k "fp8_mma or planes or products or wgmma" > $OUT/pytest_fp8.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_fp8.txt | cut -c1-300
B="default:dequant_denorm_s32_mb:glue;fp8:dequant_fp8:glue;default_again:dequant_denorm_s32_mb:glue"
B="$B;fp8_again:dequant_fp8:glue"
timeout $(( LIMIT - SECONDS - 200 )) python3 benchmarks/mosaic_sass.py --builds "$B" --point 8:32768 --splits 8 \
  --reps 5 --out $OUT/kivi_g128_fp8.json > $OUT/fp8_log.txt 2>&1
echo "alone rc=$?"; grep -v Warning $OUT/fp8_log.txt | grep -E '"build"|Error|error' | python3 -c "
import json, sys
for l in sys.stdin:
  try: r = json.loads(l); print(r['build'], r.get('us'), r.get('registers'), r.get('smem_bytes'))
  except Exception: print(l[:200])"
LEFT=$(( LIMIT - SECONDS - 8 ))
if (( LEFT > 60 )); then
  timeout $LEFT python3 benchmarks/runs/session37_ops.py $OUT ${OPS_POINTS:-8:32768,1:32768,64:32768} > $OUT/ops_log.txt 2>&1
  echo "ops rc=$?"; rm -f $OUT/*.png
  grep -v Warning $OUT/ops_log.txt | grep -E " us |failed|Error" | cut -c1-200 | tail -n 12
fi
