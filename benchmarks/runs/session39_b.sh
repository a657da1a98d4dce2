#!/bin/bash
# Session 39, the short call left at the budget's end: natively the placed writer's tests
# (`tests/test_gpu_placed_append.py`), then KIVI-2 G=128's B=8 32k step with the placed writer
# (`kvjax_step_pallas`) against the writer given XLA's positions (`kvjax_step_pallas_xla_pos`), each append alone,
# beside torch SDPA (`session40_a.sh` is the full call).
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
source "$(dirname "$0")/helpers.sh"
tag=$(echo "$card" | grep -q H200 && echo h200 || echo h100)
native_tests 70 pytest_placed "placed" tests/test_gpu_placed_append.py
timeout 120 python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 --formats kivi2_g128 \
  --peers torch_sdpa --step-batches 8 --step-writers pallas,pallas_xla_pos --stream-gb 1 --reps 3 --out $OUT/decode_${tag}_step_s39.json \
  > $OUT/dk_step_log.txt 2>&1
echo "dk step rc=$?"; grep -v Warning $OUT/dk_step_log.txt | grep -E " us |Error|skipped" | cut -c1-120 | tail -n 20
rm -f $OUT/*.png
