#!/bin/bash
# Session 32 (NOTES_gpu.md item -23 a, b): (1) the Gemma 32k generate step per kernel class for bf16 and KIVI-2
# (G=32) at their max batches (session 31 captured FP8 only: a process's first trace is empty, now warmed);
# (2) the G=32 writer at head_dim 256, B=16, 32, 64, beside XLA's scatters (`session31_d.sh`), to place
# `write.NATIVE_WIDE_WORDS_GROUPS[32]`.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 230 python3 benchmarks/profile_generate.py --model gemma2_2b --points bf16:0:32768,kivi2:0:32768 \
  --out $OUT/profile_generate_gemma_bf16_kivi2.json > $OUT/profile_log.txt 2>&1
echo "profile rc=$?"; grep -E "busy|attention|append|error|Error" $OUT/profile_log.txt | head -20 | cut -c1-220
bash benchmarks/runs/session31_d.sh
