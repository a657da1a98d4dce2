#!/bin/bash
# Session 29: the compiled writer at head_dim 256 with G=32 keys (Gemma 2's kivi2 / kivi4 presets; bit-identical
# to XLA's scatters interpreted, held back natively by `write.NATIVE_WIDE_WORDS_GROUPS`): this copy's
# NATIVE_WIDE_WORDS_GROUPS gets 32, the head_dim-256 writer tests run natively, and if they fail it is put back
# (the appends then take XLA's scatters). Then issue 7's Gemma-2-2B 32k rows with the G=32 presets on the Mosaic
# KIVI kernel (session 28's table still held Triton's planar kernel there), bf16 in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
W=pallas_kernels/gpu/write.py
sed -i 's/^NATIVE_WIDE_WORDS_GROUPS = (128,)$/NATIVE_WIDE_WORDS_GROUPS = (128, 32)/' $W
grep -n "^NATIVE_WIDE_WORDS_GROUPS" $W
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_flush.py -k "h256" > $OUT/pytest_writer_g32.txt 2>&1
rc=$?; echo "pytest rc=$rc"; tail -n 5 $OUT/pytest_writer_g32.txt | cut -c1-300
if [ $rc -ne 0 ]; then sed -i 's/^NATIVE_WIDE_WORDS_GROUPS = (128, 32)$/NATIVE_WIDE_WORDS_GROUPS = (128,)/' $W; fi
grep -n "^NATIVE_WIDE_WORDS_GROUPS" $W
timeout 330 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,kivi2,kivi4 --skip-b1 \
  --row-timeout 200 --out $OUT/tp_gemma_32k_s29a.json > $OUT/tp_gemma_32k_s29a_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_gemma_32k_s29a_log.txt | tail -n 6 | cut -c1-250
