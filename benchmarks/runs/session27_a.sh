#!/bin/bash
# Prepared in session 26: issue 7's Llama 32k rows with session 26's split rule (`mosaic_decode.default_splits`:
# up to 8 splits of >= 32 tiles above 256 (b, k) pairs; H200, kernel alone at B=69 G=128: 809.0 us against
# 1089.6 at 1 split). bf16 first (the ratio's base, same call), then KIVI-2 G=128, G=32, KIVI-4 (unchanged rule
# at B=31: 248 pairs), then the B=64 32k cells of the decode table against torch in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 \
  --formats bf16,kivi2_g128,kivi2,kivi4 --skip-b1 --row-timeout 150 --out $OUT/tp_llama_32k_s27a.json \
  > $OUT/tp_log.txt 2>&1
echo "tp32k rc=$?"; rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 8 | cut -c1-250
timeout 150 python3 benchmarks/decode_kernels.py --batches 64 --contexts 32768 --formats kivi2_g128,kivi2 \
  --peers torch_sdpa --step-batches "" --reps 3 --out $OUT/decode_s27a_b64.json > $OUT/decode_log.txt 2>&1
echo "decode rc=$?"; grep -E "torch|kivi" $OUT/decode_log.txt | tail -n 6 | cut -c1-200
# Below 257 pairs the rule is unchanged (untimed): KIVI-4's issue-7 batch (B=31, 2 splits) and B=32 at G=128.
REPS=3 timeout 100 python3 benchmarks/runs/session26_waves.py $OUT/waves_kivi4.json kivi4 31:0,31:4,31:8 \
  > $OUT/waves_log.txt 2>&1
REPS=3 timeout 80 python3 benchmarks/runs/session26_waves.py $OUT/waves_g128.json kivi2_g128 32:0,32:8 \
  >> $OUT/waves_log.txt 2>&1
echo "waves rc=$?"; grep -E "^\{" $OUT/waves_log.txt | cut -c1-200
