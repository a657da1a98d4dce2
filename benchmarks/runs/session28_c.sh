#!/bin/bash
# Session 28: the one-kernel writer at head_dim 256 (values' channel rows of 256, the key flush's 16 slabs; in the
# interpreter bit-identical to XLA's scatters) natively, then Gemma-2-2B's B=8 32k step and append (the writer
# against XLA's scatters) and issue 7's Gemma 32k rows again with it (session 28's call c appended by XLA).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_flush.py -k "words" > $OUT/pytest_writer.txt 2>&1
echo "pytest rc=$?"; tail -n 5 $OUT/pytest_writer.txt | cut -c1-300
timeout 200 python3 benchmarks/decode_kernels.py --shape gemma2_2b --batches 8 --contexts 32768 --formats kivi2_g128 \
  --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 --out $OUT/decode_gemma_step.json > $OUT/step_log.txt 2>&1
echo "step rc=$?"; grep -v Warning $OUT/step_log.txt | grep -E " us |failed|Error|skipped" | cut -c1-200
timeout 300 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,kivi2_g128 --skip-b1 \
  --row-timeout 200 --out $OUT/tp_gemma_32k_s28e.json > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 4 | cut -c1-250
