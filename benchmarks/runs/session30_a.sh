#!/bin/bash
# Prepared in session 29 (NOTES_gpu.md item -21): the head_dim-256 G=32 writer natively with and without its
# in-kernel key flush (bit-identity, then the append alone at B=8 32k beside XLA's scatters), then issue 7's Llama
# 4k KIVI rows (session 27's timed out at 150 s; the writer now traces once per program).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
TIMEOUT=100 timeout 340 python3 benchmarks/runs/session30_writer.py $OUT/writer_h256.json 8:32768 kivi2,kivi4 \
  > $OUT/writer_h256_log.txt 2>&1
echo "writer rc=$?"; grep -E "^\{" $OUT/writer_h256_log.txt | cut -c1-260
