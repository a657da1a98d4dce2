#!/bin/bash
# Session 14, call 4 (call 3 found the machine given back): the KIVI values of a "words" cache now
# quantized inside the one-kernel append too (call 2: the append's XLA value fusions were ~3 of its
# ~8 us). 1. GPU check (T=20 append over stale words: values into shared words, a key block flushed);
# 2. the step with each writer at B=8 32k; 3. Llama-3-8B throughput at 32k, bf16 and kivi2_g128, same run.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda timeout 110 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_kernels.py -k "planes" \
  > $OUT/pytest_log.txt 2>&1; echo "pytest rc=$?"
tail -n 2 $OUT/pytest_log.txt | cut -c1-200
timeout 90 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 \
  --formats kivi2_g128 --peers "" --step-batches 8 --reps 3 --stream-gb 1 \
  --out $OUT/decode_s14d_step.json > $OUT/step_log.txt 2>&1; echo "step rc=$?"
grep -v "Warning" $OUT/step_log.txt | grep -E " us |Error|error" | cut -c1-200
timeout 270 python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --formats bf16,kivi2_g128 \
  --skip-b1 --row-timeout 200 --out $OUT/tp_llama_32k_s14d.json > $OUT/tp_log.txt 2>&1; echo "tp rc=$?"
rm -f $OUT/*.png
grep -v Warning $OUT/tp_log.txt | tail -n 6 | cut -c1-250
