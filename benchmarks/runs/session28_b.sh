#!/bin/bash
# Session 28: the Mosaic KIVI kernel at head_dim 256 (Gemma 2, G=128; right in the interpreter, compiled for an H200
# on the CPU at 167 registers, `decode_parts/session28/sass_aot_head_dim_256.json`) natively: its tests, then
# Gemma-2-2B heads timed against Triton's planar kernel (the path before) and torch SDPA, same run.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_decode.py -k "head_dim_256" > $OUT/pytest_h256.txt 2>&1
echo "pytest rc=$?"; tail -n 5 $OUT/pytest_h256.txt | cut -c1-300
REPS=3 timeout 340 python3 benchmarks/runs/session28_gemma.py $OUT/gemma_h256.json 8:32768,1:32768,1:4096,8:4096 \
  > $OUT/gemma_log.txt 2>&1
echo "gemma rc=$?"; grep -E "^\{" $OUT/gemma_log.txt | cut -c1-260
