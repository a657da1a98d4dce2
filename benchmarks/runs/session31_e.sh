#!/bin/bash
# Session 31, for what device time was left after six refused calls: (1) `session31_flush.py` at Gemma-2-2B KIVI-2
# 32k B=64 and 8 (the in-place one-token flush against the padded one: bit-identity, the append alone with XLA's
# scatters and with the writer storing XLA's flush); (2) issue 7's Gemma 32k bf16 and KIVI-2 rows with the
# batch-1 step latency (the KIVI-2 max-batch row takes XLA's appends, now with the in-place flush).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 benchmarks/runs/session31_flush.py $OUT/flush_inplace.json gemma2_2b:kivi2:64:32768 \
  gemma2_2b:kivi2:8:32768 > $OUT/flush_log.txt 2>&1
echo "flush rc=$?"; grep ROW $OUT/flush_log.txt | python3 -c "
import sys, json
for l in sys.stdin:
  r = json.loads(l[4:]); print(r['shape'], r['format'], r['batch'], r['writer'], r.get('bit_identical'),
    *[round(r.get(k, -1), 1) for k in ('append_us_old', 'append_us_new', 'append_us_old_again')], r.get('error', ''))"
timeout 320 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats bf16,kivi2 \
  --row-timeout 150 --out $OUT/tp_gemma_32k_s31e.json > $OUT/tp_gemma_32k_s31e_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_gemma_32k_s31e_log.txt | tail -n 7 | cut -c1-250
