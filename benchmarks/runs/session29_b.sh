#!/bin/bash
# Session 29: where issue 7's row time goes (session 29's Gemma KIVI-2 G=32 32k row did not finish in 200 s; session
# 27's Llama 4k KIVI rows in 150 s): trace / lower / compile / first and second run of the generate program by
# layer count (`session29_compile.py`), at the rows' batches.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
C=benchmarks/runs/session29_compile.py
timeout 200 python3 $C gemma2_2b kivi2 64 32768 2,26 > $OUT/compile_gemma_kivi2.txt 2>&1; echo "rc=$?"
grep -v Warning $OUT/compile_gemma_kivi2.txt | grep -E "^ |^\{" | cut -c1-300
timeout 150 python3 $C gemma2_2b kivi2_g128 85 32768 26 > $OUT/compile_gemma_g128.txt 2>&1; echo "rc=$?"
grep -v Warning $OUT/compile_gemma_g128.txt | grep -E "^ |^\{" | cut -c1-300
timeout 180 python3 $C llama3_8b kivi2 365 4096 32 > $OUT/compile_llama_4k.txt 2>&1; echo "rc=$?"
grep -v Warning $OUT/compile_llama_4k.txt | grep -E "^ |^\{" | cut -c1-300
