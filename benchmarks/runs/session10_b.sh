#!/bin/bash
# Session 10, call 2: the glue around the decode kernel.
# 1. The query is scaled and padded inside the decode kernels (`decode.load_q`): no XLA q fusions (the
#    session 9 profile had a convert and a pad fusion, 1.8 + 1.4 us at B=8 32k, before every call).
# 2. The split merge kernel reworked (`merge.py`): one program per (b, k, column block), all splits'
#    m / l loaded at once, o loaded in one piece; session 9's version walked the splits serially
#    (5.1 us at B=1 4k against XLA's 4.1). A/B against the XLA merge at B=1 and B=8 decides the
#    threshold (`ops.PALLAS_MERGE_MIN_PROGRAMS`, 64 now).
# 3. kivi2_g128 with `fold_value_scales` on by default (session 10 call 1: 321.5 vs 342.7 us).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 120 python3 benchmarks/decode_kernels.py --check --check-quick \
  --check-formats fp8_e4m3,fp8_e4m3_static,int8,int4,kivi2_g128,bf16 --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s10_check2.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
JAX_PLATFORMS=cuda timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_merge_splits.py \
  -k "merge_states or pallas_merge" > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
timeout 150 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3,int8 \
  --sweep-points 1:1024,1:4096,1:8192,1:32768,8:1024,8:4096,8:32768 \
  --sweep-options '[{"pallas_merge": false}, {"pallas_merge": true}]' \
  --peers "" --reps 3 --stream-gb 1 --out $OUT/decode_s10_merge.json > $OUT/merge_log.txt 2>&1; echo "merge rc=$?"
timeout 70 python3 benchmarks/profile_step.py --what attend --formats fp8_e4m3 --points 1:4096,8:1024,8:32768 \
  --options '{"pallas_merge": true}' \
  --out $OUT/profile_s10b.json > $OUT/profile_log.txt 2>&1; echo "profile rc=$?"
rm -f $OUT/*.png
grep -E "check" $OUT/check_log.txt | cut -c1-90
grep -E "sweep:" $OUT/merge_log.txt | cut -c1-110
grep -v Warning $OUT/profile_log.txt | tail -n 4 | cut -c1-260
tail -n 2 $OUT/pytest_log.txt | cut -c1-200
