#!/bin/bash
# Session 17, call 5: NOT RUN (the session's device time ran out: a failed start took 90 s of the last 380;
# the next session's first call). Short contexts at 4 tiles a split (mosaic_decode.default_splits' MIN_TILES_PER_SPLIT;
# the default preset dequant_denorm_s32_mb4 also keeps 4 live tiles a split in a longer cache; call 4's
# profiles chose it): 1. the native tests of the default's states (bf16 and fp16 scales); 2. the kivi2_g128
# rows at B = 1 and 8, 1k and 4k, against torch SDPA in the same run. (Cut to fit the session's last
# ~290 s of device time: one start had failed and cost 90 s.)
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 70 python3 -m pytest -q -p no:cacheprovider -x \
  tests/test_mosaic_kivi.py tests/test_mosaic_decode.py -k "natively and mb4" \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; head -n 1 $OUT/pytest.txt; grep -E "Error|FAILED" $OUT/pytest.txt | head -n 4
timeout 75 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 1024,4096 \
  --formats kivi2_g128 --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 1 \
  --out $OUT/decode_s17e_kivi.json > $OUT/table_log.txt 2>&1; echo "table rc=$?"
rm -f $OUT/*.png
grep -v "Warning" $OUT/table_log.txt | grep -E " us |x/|Error|error|failed" | cut -c1-200
