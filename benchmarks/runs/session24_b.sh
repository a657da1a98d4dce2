#!/bin/bash
# Session 24, call b: 1. which option of the KIVI Mosaic kernel makes its counted in-kernel merge hang
# (`session24_merge_bisect.py`, 45 s a case); 2. the KIVI glue in the kernel (`mosaic_decode.GLUE_IN_KERNEL`)
# against the default through ops, torch SDPA in the same run (`session24_glue.py`). Name the card.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/runs/session24_merge_bisect.py > $OUT/bisect.txt 2>&1
echo "bisect rc=$?"; cut -c1-400 $OUT/bisect.txt
timeout 330 python3 benchmarks/runs/session24_glue.py $OUT/glue.json > $OUT/glue_log.txt 2>&1
echo "glue rc=$?"; grep -v Warning $OUT/glue_log.txt | grep -E "torch|Error|error" | cut -c1-200
