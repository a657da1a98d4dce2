#!/bin/bash
# Prepared in session 27: the Mosaic KIVI kernel's logit soft-cap and sliding window (session 27: right in the
# interpreter, compiled for an H200 on the CPU at 123-128 registers, `decode_parts/session27/sass_aot_softcap_sliding.json`)
# natively: the tests, then each option against XLA's reference and timed (B=8 / 1, 32k, KIVI-2 G=128 and G=32).
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_mosaic_decode.py -k "softcap" > $OUT/pytest_softcap.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_softcap.txt
REPS=3 timeout 330 python3 benchmarks/runs/session28_softcap.py $OUT/softcap.json kivi2_g128,kivi2 8:32768,1:32768 \
  > $OUT/softcap_log.txt 2>&1
echo "softcap rc=$?"; grep -E "^\{" $OUT/softcap_log.txt | cut -c1-230
