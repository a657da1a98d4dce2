#!/bin/bash
# Session 31: (1) `rows.flush_rows` without the padded residual copy (one-token appends in place,
# `rows._flush_one`) against the previous version natively: bit-identity and the append alone
# (`session31_flush.py`; on the CPU, compiled for an H200, the 32 MiB pad and scatter are gone:
# `decode_parts/session31/append_hlo_b64_inplace.txt`). (2) Gemma's G=32 step and append with XLA's scatters and
# the one-kernel writer (both with the new flush) at B=16, 32, 64, to place `write.NATIVE_WIDE_WORDS_GROUPS[32]`.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 benchmarks/runs/session31_flush.py $OUT/flush_inplace.json > $OUT/flush_log.txt 2>&1
echo "flush rc=$?"; grep ROW $OUT/flush_log.txt | python3 -c "
import sys, json
for l in sys.stdin:
  r = json.loads(l[4:]); print(r['shape'], r['format'], r['batch'], r['writer'], r.get('bit_identical'),
    *[round(r.get(k, -1), 1) for k in ('append_us_old', 'append_us_new', 'append_us_old_again')], r.get('error', ''))"
# this copy only: the writer at any batch (the committed gate is {128: None, 32: 8})
sed -i 's/^NATIVE_WIDE_WORDS_GROUPS = .*/NATIVE_WIDE_WORDS_GROUPS = {128: None, 32: None}/' pallas_kernels/gpu/write.py
grep -n "^NATIVE_WIDE_WORDS_GROUPS" pallas_kernels/gpu/write.py
timeout 300 python3 benchmarks/decode_kernels.py --shape gemma2_2b --batches 16,32,64 --contexts 32768 --formats kivi2 \
  --peers torch_sdpa --step-batches 16,32,64 --reps 3 --stream-gb 1 --out $OUT/decode_gemma_g32_writer.json > $OUT/writer_log.txt 2>&1
echo "writer rc=$?"; grep -v Warning $OUT/writer_log.txt | grep -E " us |failed|Error|skipped" | cut -c1-200
