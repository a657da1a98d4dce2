#!/bin/bash
# Prepared in session 9 (device time spent), for the next session's first call:
# 1. the GPU check of what session 9's call 2 did not reach (kivi2_g128 and bf16 with the kernel merge
#    where B x K >= 64, and the new `fold_value_scales` KIVI variant);
# 2. B=1 with session 9's final defaults (XLA merge below 64 (b, k) pairs, at most 16 splits for small
#    caches), torch SDPA and cuDNN in the same run: 1k / 4k / 8k / 32k (0.79x at 4k with the kernel
#    merge; the sweep ran 16 splits at 13.0 us against torch's 11.65);
# 3. B=64 32k with the peers (the table's missing cells), KIVI-2 G=128 fold vs not at B=8 32k;
# 4. Gemma-2-2B at 4k (bf16, FP8, KIVI-2), never run.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 120 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128,bf16,kivi2 \
  --sweep kivi2_g128 --sweep-variants-only --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s10_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
timeout 150 python3 benchmarks/decode_kernels.py --batches 1 --contexts 1024,4096,8192,32768 \
  --formats fp8_e4m3,int8,int4,kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s10_b1.json > $OUT/b1_log.txt 2>&1; echo "b1 rc=$?"
timeout 90 python3 benchmarks/decode_kernels.py --batches 64 --contexts 32768 --formats fp8_e4m3,int8 \
  --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s10_b64.json > $OUT/b64_log.txt 2>&1; echo "b64 rc=$?"
timeout 200 python3 benchmarks/throughput.py --models gemma2_2b --contexts 4096 --formats bf16,fp8_e4m3,kivi2 \
  --skip-b1 --row-timeout 65 --out $OUT/tp_gemma_4k_s10.json > $OUT/tp_gemma_4k_log.txt 2>&1; echo "gemma 4k rc=$?"
rm -f $OUT/*.png
grep -E "check|sweep:" $OUT/check_log.txt | cut -c1-100
for f in b1 b64; do grep -A8 "best bf16 peer" $OUT/${f}_log.txt | cut -c1-140; done
tail -n 6 $OUT/tp_gemma_4k_log.txt
