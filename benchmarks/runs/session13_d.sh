#!/bin/bash
# Session 13, call 4: `window_merge` with every load issued first (call 3: 17.0 us at B=8 32k, 13.6 at
# B=8 1k, latency-bound: each 16-channel slice loaded, then dotted) at 8 warps (CPU-compiled SASS: 4 warps
# spill, 8 do not; 1856 instructions against 2504). 1. GPU check; 2. the kivi2_g128 table against torch
# SDPA and cuDNN, B = 1, 8, 64 x 1k, 4k, 32k; 3. per-kernel profile; 4. Llama-3-8B throughput at 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 100 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128 \
  --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s13d_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
grep -E "check" $OUT/check_log.txt | cut -c1-200
timeout 170 python3 benchmarks/decode_kernels.py --batches 8,1,64 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s13d_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
grep -v "Warning" $OUT/table_log.txt | grep -E " us |Error|error" | cut -c1-200
timeout 60 python3 benchmarks/profile_step.py --formats kivi2_g128 --points 8:32768,1:32768,8:1024 \
  --what attend --out $OUT/profile_s13d.json > $OUT/profile_log.txt 2>&1; echo "profile rc=$?"
grep -v "Warning" $OUT/profile_log.txt | grep "span" | cut -c1-260
timeout 230 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2_g128 \
  --skip-b1 --row-timeout 190 --out $OUT/tp_llama_32k_s13d.json > $OUT/tp_log.txt 2>&1; echo "tp rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
