#!/bin/bash
# Session 10, call 3: the table with session 10's defaults (query scaled and padded in the kernel; the
# reworked merge kernel by default but where >= 64 (b, k) pairs have <= 4 splits; kivi2_g128 folded),
# torch SDPA and cuDNN in the same run; bf16 / kivi2 GPU check (call 2's check ran out of time there);
# sweeps for the next decisions: B=1 splits with the new merge, the merge A/B at B=64 and B=8 1k.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 60 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats bf16,kivi2 \
  --batches "" --peers "" --reps 3 --stream-gb 1 --out $OUT/decode_s10_check3.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
timeout 220 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096,32768 \
  --formats fp8_e4m3,int8,int4,kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 \
  --out $OUT/decode_s10_table.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
timeout 80 python3 benchmarks/decode_kernels.py --batches 64 --contexts 1024,4096 \
  --formats fp8_e4m3,int8 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s10_b64_short.json > $OUT/b64_log.txt 2>&1; echo "b64 rc=$?"
timeout 110 python3 benchmarks/decode_kernels.py --batches "" --sweep fp8_e4m3 \
  --sweep-points 1:4096,1:8192,8:1024,64:4096,64:32768 \
  --sweep-options '[{"pallas_merge": false}, {"pallas_merge": true}, {"num_splits": 8}, {"num_splits": 32}, {"num_splits": 64}]' \
  --peers "" --reps 3 --stream-gb 1 --out $OUT/decode_s10_sweep3.json > $OUT/sweep_log.txt 2>&1; echo "sweep rc=$?"
rm -f $OUT/*.png
grep -E "check" $OUT/check_log.txt | cut -c1-90
grep -A8 "best bf16 peer" $OUT/table_log.txt | cut -c1-150
grep -A4 "best bf16 peer" $OUT/b64_log.txt | cut -c1-150
grep -E "sweep:" $OUT/sweep_log.txt | cut -c1-110
