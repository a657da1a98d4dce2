#!/bin/bash
# Session 29: issue 7's Gemma-2-2B 32k rows with the G=32 presets on the Mosaic KIVI kernel and XLA's appends (the
# committed NATIVE_WIDE_WORDS_GROUPS = (128,)), bf16 in the same run. Then, with this copy's
# NATIVE_WIDE_WORDS_GROUPS at (128, 32) (call a: natively bit-identical), Gemma's B=8 32k KIVI-2 G=32 step and
# append by writer: call a's throughput row with that writer did not finish in 200 s, where the program with XLA's
# appends compiles in 68 s (call b) and the writer alone adds ~33 s of compile on the CPU.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
W=pallas_kernels/gpu/write.py
grep -n "^NATIVE_WIDE_WORDS_GROUPS" $W
timeout 330 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,kivi2,kivi4 --skip-b1 \
  --row-timeout 150 --out $OUT/tp_gemma_32k_s29c.json > $OUT/tp_gemma_32k_s29c_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_gemma_32k_s29c_log.txt | tail -n 6 | cut -c1-250
sed -i 's/^NATIVE_WIDE_WORDS_GROUPS = (128,)$/NATIVE_WIDE_WORDS_GROUPS = (128, 32)/' $W; grep -n "^NATIVE_WIDE_WORDS_GROUPS" $W
timeout 200 python3 benchmarks/decode_kernels.py --shape gemma2_2b --batches 8 --contexts 32768 --formats kivi2 \
  --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_gemma_g32_step.json > $OUT/step_g32_log.txt 2>&1
echo "step rc=$?"; grep -v Warning $OUT/step_g32_log.txt | grep -E " us |failed|Error|skipped" | cut -c1-200
