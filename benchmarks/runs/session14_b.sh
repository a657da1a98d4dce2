#!/bin/bash
# Session 14, call 2 (default variant now dequant_mask_s16). 1. GPU check: the shared-words append test
# (call 1 timed out after the three flush tests passed) and the kivi2_g128 kernel path; 2. the kivi2_g128
# table against torch SDPA and cuDNN, B = 1, 8, 64 x 1k, 4k, 32k; 3. the step with each writer at B=8 32k
# (XLA scatters vs the one-kernel append into "words"); 4. per-kernel profile of attend / append / step.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_kernels.py -k "planes" \
  > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
tail -n 2 $OUT/pytest_log.txt | cut -c1-200
timeout 100 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128 \
  --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s14b_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
grep -E "check" $OUT/check_log.txt | cut -c1-200
timeout 170 python3 benchmarks/decode_kernels.py --batches 8,1,64 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s14b_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error" | cut -c1-200
timeout 90 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 \
  --formats kivi2_g128 --peers "" --step-batches 8 --reps 3 --stream-gb 1 \
  --out $OUT/decode_s14b_step.json > $OUT/step_log.txt 2>&1; echo "step rc=$?"
grep -v "Warning" $OUT/step_log.txt | grep -E " us |Error|error" | cut -c1-200
timeout 80 python3 benchmarks/profile_step.py --formats kivi2_g128 --points 8:32768 \
  --what attend,append,step --out $OUT/profile_s14b.json > $OUT/profile_log.txt 2>&1; echo "profile rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/profile_log.txt | grep -E "span|kernel|us" | tail -n 30 | cut -c1-260
