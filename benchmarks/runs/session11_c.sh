#!/bin/bash
# Session 11, call 3: ptxas's verbose report (registers, spills, wgmma serialization warnings), the PTX
# and the resources of both Mosaic KIVI-2 variants, packed in one archive; where nvdisasm is, SASS too.
set -u
source "$(dirname "$0")/device_setup.sh"
nvd=$(find / -name nvdisasm -type f 2>/dev/null | head -n 1); echo "nvdisasm: ${nvd:-none}"
[ -n "$nvd" ] && export PATH=$(dirname $nvd):$PATH
mkdir -p /tmp/dump
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_RESOURCES=1 MOSAIC_GPU_DUMP_SASS=1 \
  MOSAIC_GPU_DUMP_TO=/tmp/dump timeout 120 python3 benchmarks/mosaic_kivi_bench.py --points "" --peers "" \
  --stream-gb 0.1 --out $OUT/dump_check.json > $OUT/dump_log.txt 2>&1; echo "dump rc=$?"
rm -f /tmp/dump/*constraint_system* /tmp/dump/*mlir-passes*
tar czf $OUT/dump.tgz -C /tmp dump; ls -la /tmp/dump | head -30
for f in /tmp/dump/*_0.ptxas /tmp/dump/*_2.ptxas; do echo "== $f"; grep -v "^$" $f | head -20 | cut -c1-250; done
cat /tmp/dump/*_0.resources.txt /tmp/dump/*_2.resources.txt 2>/dev/null | head -20
