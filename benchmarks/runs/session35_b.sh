#!/bin/bash
# Session 35: what the KIVI-2 G=128 tile step costs without its dequantization (H100 or H200; name the card).
# The kernel alone at B=8 32k, 8 splits (`mosaic_sass.py`), the default beside two timing-only builds whose
# states are wrong on purpose (`Options.timing_only`): "scale" (A is the masked plane, no HFMA2: 770 -> 613
# SASS a tile compiled for an H200 on the CPU) and "unpack" (A is the code word itself: 500). If the time
# falls with the instructions as sessions 16-17's builds did (988 -> 768: 122.75 -> 105.34 us on the H200),
# these are ~93 and ~84 us: the floor of this kernel's structure with the dequantization free.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
B="base:dequant_denorm_s32_mb;noscale:dequant_denorm_s32_mb+timing_only=scale"
B="$B;nounpack:dequant_denorm_s32_mb+timing_only=unpack"
timeout ${DIAG_LIMIT_S:-200} python3 benchmarks/mosaic_sass.py --builds "$B" --point 8:32768 --splits 8 --reps 5 \
  --out $OUT/kivi_g128_floor.json > $OUT/floor_log.txt 2>&1
echo "floor rc=$?"; grep -v Warning $OUT/floor_log.txt | grep -E '"build"|Error|error' | cut -c1-400
