#!/bin/bash
# Session 6, device call 1: why Gemma-2-2B FP8 decodes no faster than bf16 (throughput_parts/tp_gemma_32k_s5.json).
# Kernel at the Gemma head shape (8q/4kv, d=256, soft-cap 50) at B=24, global and 4k-window, vs torch SDPA/cudnn;
# then the FP8 Gemma throughput row with the optimized HLO of its generate loop dumped and scanned for copies.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 330 python3 benchmarks/decode_kernels.py --shape gemma2_2b --check --check-quick --check-formats fp8_e4m3,bf16 \
  --sweep fp8_e4m3,int8 --sweep-variants-only --sweep-batch 24 --batches 24 --contexts 32768 \
  --formats bf16,fp8_e4m3,int8,int4,kivi2 --peers torch_sdpa,cudnn --step-batches 24 --reps 3 \
  --out $OUT/decode_gemma_s6.json > $OUT/gemma_kernel_log.txt 2>&1; echo "kernel rc=$?"
timeout 90 python3 benchmarks/decode_kernels.py --shape gemma2_2b --window 4096 --batches 24 --contexts 32768 \
  --formats bf16,fp8_e4m3 --peers "" --step-batches "" --reps 3 \
  --out $OUT/decode_gemma_window_s6.json > $OUT/gemma_window_log.txt 2>&1; echo "window rc=$?"
XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*generate.*" \
  timeout 150 python3 benchmarks/throughput.py --models gemma2_2b --contexts 32768 --formats fp8_e4m3 --skip-b1 \
  --row-timeout 140 --out $OUT/tp_gemma_fp8_s6.json > $OUT/gemma_tp_log.txt 2>&1; echo "tp rc=$?"
python3 - <<'PY' >> $OUT/gemma_tp_log.txt 2>&1
import glob, os, re, collections
fs = sorted(glob.glob("/tmp/hlo/*after_optimizations.txt"), key=os.path.getsize)
print("dumped:", [(os.path.basename(f), os.path.getsize(f)) for f in fs][-4:])
if fs:
  text = open(fs[-1]).read()
  ops = collections.Counter(m.group(1) for m in re.finditer(r"= \S+ (\w[\w-]*)\(", text))
  print("op counts:", ops.most_common(25))
  for line in text.splitlines():
    if re.search(r"\b(copy|copy-start|dynamic-update-slice)\(", line) and re.search(r"\[\d+,\d+,\d{4,}", line):
      print("BIG:", line.strip()[:300])
  import gzip, shutil
  with open(fs[-1], "rb") as a, gzip.open(os.environ["OUT"] + "/gemma_fp8_generate_hlo.txt.gz", "wb") as b:
    shutil.copyfileobj(a, b)
PY
tail -n 30 $OUT/gemma_kernel_log.txt; tail -n 6 $OUT/gemma_window_log.txt; grep -v "^BIG" $OUT/gemma_tp_log.txt | tail -n 8; grep -c "^BIG" $OUT/gemma_tp_log.txt
