#!/bin/bash
# Session 30: the head_dim-256 G=32 writer is on by default with XLA quantizing its key blocks
# (write.IN_KERNEL_FLUSH_SLOW; call a: bit-identical, 27.2 us against XLA's 31.8 at B=8 32k). Natively: the writer's
# head_dim-256 tests, then issue 7's Gemma-2-2B 32k rows with it, bf16 in the same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
grep -n "^NATIVE_WIDE_WORDS_GROUPS\|^IN_KERNEL_FLUSH_SLOW" pallas_kernels/gpu/write.py
timeout 200 python3 -m pytest -q -p no:warnings tests/test_gpu_flush.py -k "h256" > $OUT/pytest_writer_h256.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_writer_h256.txt | cut -c1-250
timeout 360 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,kivi2,kivi4 --skip-b1 \
  --row-timeout 150 --out $OUT/tp_gemma_32k_s30c.json > $OUT/tp_gemma_32k_s30c_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_gemma_32k_s30c_log.txt | tail -n 6 | cut -c1-250
