#!/bin/bash
# Prepared in session 8 (no device time left), for the next session's first call: num_splits with the
# tiled FP8 / INT8 value layout. The tiled kernel holds 4 programs per SM (112 registers, CPU SASS), so
# one full wave is 528 programs; the default (`ops.quant_target`) gives 33 splits (2112 programs, 4
# waves of ~15 blocks) at B=8, 32k, where FP8 streams at 0.81 of the read-only rate but at 0.90 at 128k
# (62 blocks per program) and ~0.93 at B=64 (5 splits). Hypothesis: fewer, longer programs (8-16
# splits at B=8, 32k) close part of the gap to 129 us. The default is the first row of each point.
# Then splits at short contexts (B=8 1k: 4 splits 12.2 us vs the default 9's 14.9 in session 8, while
# B=1 4k wants its 64: which rule separates them?), INT8's variants with tiles, now with `narrow_qk=False` (its 8-bit q.k default is from session 3),
# and a profiler trace of the kernel call at short contexts (`profile_step.py`: q-prep fusion, Pallas
# call, split merge per step), where B=1 4k is 0.92x torch SDPA (12.6 vs 11.6 us); and of the
# append alone and the fused step at 1k / 32k / 128k (the append grows 4.0 -> 15.1 us with context).
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 230 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3,int8 \
  --sweep-points 8:32768,8:131072,64:32768,1:32768 --sweep-splits 4,8,16,24,48 \
  --peers "" --reps 3 --out $OUT/decode_s9_splits.json > $OUT/splits_log.txt 2>&1; echo "splits rc=$?"
timeout 90 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3 \
  --sweep-points 8:1024,8:2048,16:1024,1:8192 --sweep-splits 2,3,4,6,8,16,64 \
  --peers "" --reps 3 --stream-gb 1 --out $OUT/decode_s9_short.json > $OUT/short_log.txt 2>&1; echo "short rc=$?"
timeout 100 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats int8 --sweep int8 \
  --sweep-variants-only --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s9_int8.json > $OUT/int8_log.txt 2>&1; echo "int8 rc=$?"
timeout 100 python3 benchmarks/profile_step.py --formats fp8_e4m3,int8,bf16 --points 1:4096,8:1024,8:32768 \
  --out $OUT/profile_s9.json > $OUT/profile_log.txt 2>&1; echo "profile rc=$?"
timeout 80 python3 benchmarks/profile_step.py --what append,step --formats fp8_e4m3 --points 8:1024,8:32768,8:131072 \
  --out $OUT/profile_append_s9.json > $OUT/profile_append_log.txt 2>&1; echo "profile append rc=$?"
rm -f $OUT/*.png
grep -E "sweep:|stream" $OUT/splits_log.txt | cut -c1-100
grep -E "sweep:" $OUT/short_log.txt | cut -c1-100
grep -E "check|sweep:" $OUT/int8_log.txt | cut -c1-100
grep -v Warning $OUT/profile_log.txt | tail -n 12 | cut -c1-250
grep -v Warning $OUT/profile_append_log.txt | tail -n 8 | cut -c1-250
