#!/bin/bash
# Session 17, call 4. Where kivi2_g128's short-context decode call spends its time (B=1 and 8, 1k and 4k,
# where it is 0.66-0.71x torch SDPA): the profiler's per-kernel times (q prep, the Mosaic kernel, the
# merge) and span, at the default splits and at 2 / 4 / 8 / 16 splits (16: 4k only).
set -u
source "$(dirname "$0")/device_setup.sh"
for s in default 2 4 8 16; do
  opt='{}'; [ "$s" != default ] && opt="{\"num_splits\": $s}"
  pts=1:1024,1:4096,8:1024,8:4096; [ "$s" = 16 ] && pts=1:4096,8:4096
  timeout 100 python3 benchmarks/profile_step.py --formats kivi2_g128 --points $pts --top 4 \
    --options "$opt" --out $OUT/profile_s17d_$s.json > $OUT/profile_$s.txt 2>&1; echo "splits $s rc=$?"
  grep -v Warning $OUT/profile_$s.txt | grep -E " span " | cut -c1-230
done
