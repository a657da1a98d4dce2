#!/bin/bash
# Prepared in session 23 for the next device run. 1. The compiled 4-bit "words" writer, case by case
# (session24_words4_diag.py, 60 s each, a 2-bit control first); 2. KIVI-4's step at B=8 32k with the XLA
# append (the default while `write.NATIVE_WORDS_BITS = (2,)`; the one-kernel rows are skipped) against
# KIVI-2 G=32's one-kernel step, torch SDPA beside. Name the card: session 23 ran on an H100.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 330 python3 benchmarks/runs/session24_words4_diag.py \
  kivi2_g128_values,kivi4_g128_values,kivi4_g32_values,kivi4_g128_flush,kivi4_g32_flush > $OUT/diag.txt 2>&1
echo "diag rc=$?"; cut -c1-300 $OUT/diag.txt
timeout 240 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi4,kivi2 \
  --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_s24a.json > $OUT/log.txt 2>&1
echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error|skipped" | cut -c1-200
