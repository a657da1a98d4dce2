#!/bin/bash
# Session 23, call 2 (call 1 was session22_d.sh): 1. which part of the KIVI in-kernel glue fails natively
# (session22_kivi_merge_diag.py, each case in its own 30 s subprocess); 2. session21_c.sh as prepared (the FP8
# counted merge's native tests, then through ops against the unfused Mosaic build, Triton and torch SDPA).
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 130 python3 benchmarks/runs/session22_kivi_merge_diag.py > $OUT/diag.txt 2>&1
echo "diag rc=$?"; cat $OUT/diag.txt | cut -c1-300
bash benchmarks/runs/session21_c.sh
