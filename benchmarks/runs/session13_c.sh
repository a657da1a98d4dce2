#!/bin/bash
# Session 13, call 3: `window_merge` took 216 us at B=8 (call 2, profile_s13.json): its f32 dots at
# HIGHEST precision compile to FMA loops (CPU-compiled SASS: 255 registers, spills, 73 KB shared). Now
# tf32 tensor-core dots over 16-channel slices (151 registers, no spills, 10 KB, 80 HGMMA). 1. GPU check;
# 2. the table cells (B=8 32k/4k/1k, B=1 32k) with torch / cuDNN; 3. per-kernel profile; 4. Llama-3-8B
# throughput at 32k, bf16 and kivi2_g128.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 100 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128 \
  --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s13c_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
grep -E "check" $OUT/check_log.txt | cut -c1-200
timeout 150 python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 32768,1024 \
  --formats kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s13c_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
grep -v "Warning" $OUT/table_log.txt | grep -E "us |Error|error" | cut -c1-200
timeout 60 python3 benchmarks/profile_step.py --formats kivi2_g128 --points 8:32768,8:1024 \
  --what attend --out $OUT/profile_s13c.json > $OUT/profile_log.txt 2>&1; echo "profile rc=$?"
grep -v "Warning" $OUT/profile_log.txt | grep "span" | cut -c1-260
timeout 250 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2_g128 \
  --skip-b1 --row-timeout 200 --out $OUT/tp_llama_32k_s13c.json > $OUT/tp_log.txt 2>&1; echo "tp rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
