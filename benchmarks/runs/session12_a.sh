#!/bin/bash
# Prepared in session 11 (device time spent), for session 12's first call. Session 11 ended with the
# Mosaic KIVI-2 kernel at 192.6 us (B=8 32k; torch SDPA 244.1) whatever the registers (113-180) and
# ~1300-1400 PTX instructions per thread per 128-token tile (benchmarks/ptx_mix.py), 224 of them scalar
# shr.u16. This call: the shift-free unpack ("folded_lazy_mask"), the dequantized tile in the A registers
# ("dequant", "dequant_mask": no per-tile q * s store and commit) and two tiles per step ("dequant2",
# "dequant2_sum") against "folded_lazy", PTX of every preset with its loop's instruction mix, then B=1
# 32k and B=8 4k.
set -u
source "$(dirname "$0")/device_setup.sh"
mkdir -p /tmp/dump
V=folded_lazy,folded_lazy_mask,dequant,dequant_mask,dequant2,dequant2_sum
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=/tmp/dump timeout 250 python3 \
  benchmarks/mosaic_kivi_bench.py --variants $V --points 8:32768 --splits 4,8 --out $OUT/mosaic_s12a.json \
  > $OUT/mosaic_log.txt 2>&1; echo "mosaic rc=$?"
python3 benchmarks/ptx_mix.py /tmp/dump/*.ptx --out $OUT/ptx_mix_s12a.json > $OUT/ptx_mix.txt; echo "mix rc=$?"
(cd /tmp/dump && grep -H "Used" *.ptxas) > $OUT/ptxas_used.txt
timeout 150 python3 benchmarks/mosaic_kivi_bench.py --no-check --variants dequant_mask,dequant2,folded_lazy \
  --points 1:32768,8:4096 --splits 32,4 --peers torch_sdpa,triton --out $OUT/mosaic_s12a_b.json \
  > $OUT/mosaic_b_log.txt 2>&1; echo "b rc=$?"
grep -v "Warning\|nvdisasm\|Source Loc\|dump.cc" $OUT/mosaic_log.txt | grep -v "^ \|^$" | tail -n 20 | cut -c1-200
grep -v "Warning\|nvdisasm\|Source Loc\|dump.cc" $OUT/mosaic_b_log.txt | grep -v "^ \|^$" | tail -n 12 | cut -c1-200
cut -c1-220 $OUT/ptx_mix.txt; cat $OUT/ptxas_used.txt | cut -c1-120
