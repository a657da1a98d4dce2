#!/bin/bash
# Session 12, call 2: the Mosaic KIVI-2 kernel wired to the cache. On GPU, `init_cache` now stores
# KIVI-2 G=R=H=128 codes in the kernel's "words" layout (`QArray.layout`) and `ops` sends one-token
# decode over such a cache to `mosaic_decode` (default preset dequant_mask: 128.0 us at B=8 32k in
# call 1, against folded_lazy's 185.0). 1. GPU check (prefill + appends through the new writer, then
# the kernel); 2. Llama-3-8B throughput at 32k, bf16 against kivi2_g128, same run; 3. the kivi2_g128
# table cells with torch SDPA and cuDNN.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 90 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128 \
  --batches "" --peers "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s12_check.json > $OUT/check_log.txt 2>&1; echo "check rc=$?"
timeout 250 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2_g128 \
  --skip-b1 --row-timeout 120 --out $OUT/tp_llama_32k_s12.json > $OUT/tp_log.txt 2>&1; echo "tp rc=$?"
timeout 220 python3 benchmarks/decode_kernels.py --batches 8,1 --contexts 32768,4096,1024 \
  --formats kivi2_g128 --peers torch_sdpa,cudnn --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s12_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -E "check" $OUT/check_log.txt | cut -c1-200
tail -n 8 $OUT/tp_log.txt | cut -c1-200
grep -A12 "best bf16 peer" $OUT/table_log.txt | cut -c1-160
grep -v "Warning" $OUT/table_log.txt | tail -n 5 | cut -c1-300
