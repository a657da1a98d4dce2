#!/bin/bash
# Session 21, call 4. Session21_b.sh (H100): the FP8 kernel alone at B=8 32k, 4 splits: a cluster of 4 merging
# in the kernel 272.8 us against 200.9 without the glue (2 splits 196.2 / 197.1, 8: 223.2 / 203.4; 128k 998.3 /
# 749.3), while the counted merge (`Fp8Options(merge="count")`: no cluster, the last program to count itself
# merges) is 200.8 (128k 758.5, 8 splits 208.3). 1. the native tests of both merges (names shown: the
# project's addopts say -q; "fp8-N" is the count, now the default); 2. through ops against the unfused Mosaic
# build, Triton's kernel (the default) and torch SDPA in the same run, at session20_a.sh's points.
# (Prepared in session 21, whose device time ran out before it could run.)
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 240 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_fp8.py \
  -k "(glue_in_the_kernel_natively and not tile) or ops_glue" > $OUT/pytest.txt 2>&1
echo "pytest rc=$?"; grep -E "PASSED|FAILED|passed|failed|Error" $OUT/pytest.txt | cut -c1-150 | tail -n 12
SWEEP='[{"mosaic_fp8": {"fused": true}, "value_tile": 128}, {"mosaic_fp8": true, "value_tile": 128}]'
timeout 200 python3 benchmarks/decode_kernels.py --batches 1,8 --contexts 4096,32768 --formats fp8_e4m3 \
  --peers torch_sdpa --step-batches "" --reps 3 --stream-gb 2 --sweep fp8_e4m3 \
  --sweep-points 8:32768,8:131072,64:4096,1:4096,1:1024,8:1024,8:4096 --sweep-options "$SWEEP" \
  --out $OUT/decode_s21c.json > $OUT/log.txt 2>&1; echo "rc=$?"
rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error" | cut -c1-200
