#!/bin/bash
# Session 23, call 5. Call 3 (session23_b.sh, H100): the KIVI-4 kernel alone at 4 programs per SM 154.9 us
# (call 1, 3 per SM: 197.4); its pytest ran out of its 150 s at the 8th of 9 tests (7 passed), and the step
# timing hit the one-kernel writer's refusal of 4-bit words, since built (`write.store_planes` and
# `flush.flush_keys` take 4-bit codes). 1. the rest of the native KIVI-4 tests and the writer's bit-identity
# tests for 4-bit words; 2. `--check` of kivi4 (Mosaic now) on the GPU, and the step / append at B=8 32k.
set -u
source "$(dirname "$0")/device_setup.sh"
JAX_PLATFORMS=cuda,cpu timeout 140 python3 -m pytest -o addopts="" -v -p no:cacheprovider tests/test_mosaic_decode.py \
  tests/test_gpu_kernels.py -k "(kivi4 and (fmt2 or xla)) or (flush_equals_xla and kivi4) or share_words" \
  > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|passed|failed|Timeout" $OUT/pytest.txt | cut -c1-150 | tail -n 12
timeout 150 python3 benchmarks/decode_kernels.py --check --check-formats kivi4 --check-quick --batches 8 \
  --contexts 32768 --formats kivi4 --peers torch_sdpa --step-batches 8 --reps 3 --stream-gb 1 \
  --out $OUT/decode_s23e.json > $OUT/log.txt 2>&1; echo "rc=$?"; rm -f $OUT/*.png
grep -hv "Warning" $OUT/log.txt | grep -E " us |failed|Error|error|worst|check" | cut -c1-200 | tail -n 20
