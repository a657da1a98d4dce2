#!/bin/bash
# Prepared in session 31 (NOTES_gpu.md item -23): Gemma's G=32 step and append with XLA's scatters and the
# one-kernel writer at B=16, 32, 64, to place `write.NATIVE_WIDE_WORDS_GROUPS[32]` (session 30, H100: the
# writer wins at B=8, loses 2% of the step at B=64). Its first version also ran the in-place flush A/B, which
# session 31 ran in `session31_e.sh` (no gain; reverted).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
# this copy only: the writer at any batch (the committed gate is {128: None, 32: 8})
sed -i 's/^NATIVE_WIDE_WORDS_GROUPS = .*/NATIVE_WIDE_WORDS_GROUPS = {128: None, 32: None}/' pallas_kernels/gpu/write.py
grep -n "^NATIVE_WIDE_WORDS_GROUPS" pallas_kernels/gpu/write.py
timeout 400 python3 benchmarks/decode_kernels.py --shape gemma2_2b --batches 16,32,64 --contexts 32768 --formats kivi2 \
  --peers torch_sdpa --step-batches 16,32,64 --reps 3 --stream-gb 1 --out $OUT/decode_gemma_g32_writer.json > $OUT/writer_log.txt 2>&1
echo "writer rc=$?"; grep -v Warning $OUT/writer_log.txt | grep -E " us |failed|Error|skipped" | cut -c1-200
