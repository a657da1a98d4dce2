#!/bin/bash
# Session 30: the Mosaic KIVI kernel's windowed builds compiled for an H200 on this CPU (needs
# `benchmarks/runs/aot_setup.sh`), their dumps (PTX, SASS control, resources, Mosaic IR) under ROOT, to check that a
# refactor leaves the kernel as it was. Run it in two trees (e.g. `git worktree add /tmp/base HEAD~1`), then
#   for f in $(cd A && find . -name '*.ptx'); do diff -q <(grep -v '\.loc\|\.file' A/$f) <(grep -v '\.loc\|\.file' B/$f); done
# (the .loc / .file lines name source lines; the .sass_ctrl and .resources.txt files compare as they are).
#   bash benchmarks/runs/mosaic_ir_dump.sh ROOT
set -u
R=$1; mkdir -p "$R"
B='w:dequant_mask_s16_bal:window;gl:dequant_mask_s16_bal:glue;gm:dequant_mask_s16_bal:gemma;m:dequant_mask_s16_bal:merged'
run() { n=$1; shift; CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu timeout 900 /tmp/cv/bin/python benchmarks/mosaic_sass.py \
  --target-config benchmarks/results/h200_target_config.txtpb --builds "$B" --splits 4 --dump-root "$R/$n" \
  --out "$R/$n.json" "$@" > "$R/$n.log" 2>&1; echo "$n rc=$?"; }
run g128 --group 128
run g32 --group 32
run k4 --group 32 --bits 4
B=${B%;m:*}  # the in-kernel merge takes head_dim 128 only
run gem32 --group 32 --shape gemma2_2b
