#!/bin/bash
# Session 28: G=32 at head_dim 256 in the Mosaic KIVI kernel (Gemma 2's kivi2 / kivi4 presets; right in the
# interpreter, compiled for an H200 on the CPU at 174 registers, 2 programs per SM) natively: the head_dim-256
# tests, then B=8 32k and B=1 4k against Triton's planar kernel (their path until now) and torch SDPA.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mosaic_decode.py -k "head_dim_256" > $OUT/pytest_g32.txt 2>&1
echo "pytest rc=$?"; tail -n 5 $OUT/pytest_g32.txt | cut -c1-300
WINDOWS=none REPS=3 timeout 170 python3 benchmarks/runs/session28_gemma.py $OUT/gemma_g32.json 8:32768,1:4096 kivi2,kivi4 \
  > $OUT/gemma_g32_log.txt 2>&1
echo "gemma rc=$?"; grep -E "^\{" $OUT/gemma_g32_log.txt | cut -c1-230
