#!/bin/bash
# Session 35: the KIVI tile step's softmax over 8 query columns (`Options.narrow_softmax`, new: 758 -> 675 SASS a
# tile through the default call path, compiled for an H200 on the CPU) and what the KIVI-2 G=128 step costs
# without its dequantization (H100 or H200; name the card).
# 1. Native checks: the narrow softmax's states against the reference; every format through ops against the XLA
#    reference (`decode_kernels.py --check`, the KIVI formats).
# 2. The kernel alone at B=8 32k, 8 splits (`mosaic_sass.py`), as `mosaic_decode` calls it (":glue"): narrow
#    against wide, then two timing-only builds whose states are wrong on purpose (`Options.timing_only`):
#    "scale" (A is the masked plane, no HFMA2: 770 -> 613 SASS a tile without the glue) and "unpack" (A is the
#    code word itself: 500). Sessions 16-17's builds fell with the instructions (988 -> 768: 122.75 -> 105.34 us
#    on the H200); if these do too they are ~93 and ~84 us: this structure's floor with the dequantization free.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_mosaic_kivi.py tests/test_mosaic_fp8.py -k "narrow" \
  > $OUT/pytest_narrow.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_narrow.txt | cut -c1-300
timeout 150 python3 benchmarks/decode_kernels.py --check --check-quick --check-formats kivi2_g128,kivi2,kivi4 \
  --batches 1 --contexts 1024 --formats kivi2_g128 --peers "" --step-batches 0 --reps 1 --stream-gb 1 \
  --out $OUT/check_kivi.json > $OUT/check_log.txt 2>&1
echo "check rc=$?"; grep -v Warning $OUT/check_log.txt | grep -iE "check|error|fail" | tail -n 12 | cut -c1-200
B="narrow:dequant_denorm_s32_mb:glue;wide:dequant_denorm_s32_mb+narrow_softmax=False:glue"
B="$B;noscale:dequant_denorm_s32_mb+timing_only=scale:glue;nounpack:dequant_denorm_s32_mb+timing_only=unpack:glue"
timeout ${DIAG_LIMIT_S:-200} python3 benchmarks/mosaic_sass.py --builds "$B" --point 8:32768 --splits 8 --reps 5 \
  --out $OUT/kivi_g128_narrow_floor.json > $OUT/floor_log.txt 2>&1
echo "floor rc=$?"; grep -v Warning $OUT/floor_log.txt | grep -E '"build"|Error|error' | cut -c1-300
