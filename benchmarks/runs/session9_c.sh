#!/bin/bash
# Session 9, call 2: the one-kernel split merge (`pallas_kernels/gpu/merge.py`, the GPU default now)
# and the one-wave split rule for tiled caches (`ops.tiled_splits`), both from call 1's data
# (session9_a.sh: B=8 32k 8 splits 136.7 us vs 146.0; the XLA merge and q prep were 5.9 of the 11.8 us
# per call at B=1 4k). GPU check of the defaults (merge kernel) and the XLA-merge variant; the merge A/B
# and the splits around the new rule at short and long cells; the table (fp8/int8 at B=1/8/64 with the
# torch SDPA and cuDNN peers); a profile of the glue left; the merge tests under pytest on the GPU.
# Also the append with FP8 / INT8 quantized in the writer kernel (`cache.QuantRows`): bit-identical to
# XLA's `quant.quantize` (pytest), and its time in the table's step rows and the profile.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 110 python3 benchmarks/decode_kernels.py --check --check-quick \
  --check-formats fp8_e4m3,fp8_e4m3_static,int8,kivi2_g128,bf16 --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s9_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
JAX_PLATFORMS=cuda timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "merge or one_wave or (append_equals and (fp8 or int8 or bf16))" > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
timeout 170 python3 benchmarks/decode_kernels.py --batches 1,8,64 --contexts 1024,4096,32768,131072 \
  --formats fp8_e4m3,int8 --peers torch_sdpa,cudnn --step-batches 8 --reps 3 \
  --out $OUT/decode_s9_table.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
timeout 90 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3 \
  --sweep-points 8:1024,8:2048,16:1024,1:4096,1:8192,8:4096 \
  --sweep-options '[{"pallas_merge": false}, {"num_splits": 2}, {"num_splits": 4}, {"num_splits": 8}, {"num_splits": 16}, {"num_splits": 33}, {"num_splits": 64}]' \
  --peers "" --reps 3 --stream-gb 1 --out $OUT/decode_s9_short2.json > $OUT/short2_log.txt 2>&1; echo "short rc=$?"
timeout 90 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3,int8 \
  --sweep-points 8:32768,64:32768,8:131072 \
  --sweep-options '[{"pallas_merge": false}, {"num_splits": 1}, {"num_splits": 2}, {"num_splits": 4}, {"num_splits": 16}, {"prefetch": 0}]' \
  --peers "" --reps 3 --stream-gb 1 --out $OUT/decode_s9_long2.json > $OUT/long2_log.txt 2>&1; echo "long rc=$?"
timeout 70 python3 benchmarks/profile_step.py --what attend,append,step --formats fp8_e4m3 --points 1:4096,8:1024,8:32768 \
  --out $OUT/profile_s9c.json > $OUT/profile_log.txt 2>&1; echo "profile rc=$?"
rm -f $OUT/*.png
grep -E "check" $OUT/check_log.txt | cut -c1-90
grep -A14 "best bf16 peer" $OUT/table_log.txt | cut -c1-140
grep -E "sweep:" $OUT/short2_log.txt $OUT/long2_log.txt | cut -c1-110
grep -v Warning $OUT/profile_log.txt | tail -n 9 | cut -c1-230
tail -n 2 $OUT/pytest_log.txt | cut -c1-200
