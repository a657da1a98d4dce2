#!/bin/bash
# Session 35's first call. On an H200 (the card issues 3 and 7 name): issue 7's Llama-3-8B 32k rows with the
# large-batch split rule (session 26) and the committed defaults, the formats with targets first (bf16 the base,
# KIVI-2 G=32, FP8, KIVI-2 G=128), then in what time is left issue 3's B=8 32k FP8 cell (Triton's kernel, the
# default, and the Mosaic FP8 kernel over 128-token value tiles, its softmax over 8 columns (new) and over 16)
# beside torch SDPA and cuDNN in the same run.
# On an H100: session35_b.sh (the KIVI-2 G=128 step without its dequantization, timing-only builds).
set -u
source "$(dirname "$0")/device_setup.sh"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
if [[ "$card" != *H200* ]]; then exec bash "$(dirname "$0")/session35_b.sh"; fi
LIMIT=${CALL_LIMIT_S:-580}
# the narrow softmax (new this session, the default) natively right before any row runs through it
timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_mosaic_kivi.py tests/test_mosaic_fp8.py -k "narrow" \
  > $OUT/pytest_narrow.txt 2>&1
rc=$?; echo "pytest rc=$rc"; tail -n 3 $OUT/pytest_narrow.txt | cut -c1-300
if (( rc != 0 )); then echo "narrow softmax not right natively: no rows"; exit 1; fi
timeout $(( LIMIT - 130 - SECONDS )) python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 --skip-b1 \
  --row-timeout 170 --formats ${TP_FORMATS:-bf16,kivi2,fp8_e4m3,kivi2_g128} --out $OUT/tp_llama_32k_s35a.json \
  > $OUT/tp_log.txt 2>&1
echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 10 | cut -c1-250
LEFT=$(( LIMIT - SECONDS - 8 ))
if (( LEFT > 45 )); then
  SWEEP='[{"mosaic_fp8": true, "value_tile": 128}, {"mosaic_fp8": {"narrow_softmax": false}, "value_tile": 128}]'
  timeout $LEFT python3 benchmarks/decode_kernels.py --sweep fp8_e4m3 --sweep-points 8:32768 \
    --sweep-options "$SWEEP" --batches 8 --contexts 32768 --formats fp8_e4m3,bf16 \
    --peers torch_sdpa,cudnn --step-batches 0 --reps 5 --stream-gb 1 --out $OUT/decode_fp8_b8_32k_s35a.json \
    > $OUT/decode_log.txt 2>&1
  echo "decode rc=$?"
  grep -v Warning $OUT/decode_log.txt | grep -E " us |failed|Error|stream|x " | cut -c1-200 | tail -n 20
fi
