#!/bin/bash
# Session 36's first call (name the card: either may come).
# On an H200 (the card issues 3 and 7 name; none lent since session 26): issue 7's Llama-3-8B 32k rows with the
# split rule (session 26) and the narrow softmax (session 35), then issue 3's B=8 32k cells (FP8, KIVI-2 G=128
# and G=32) beside torch SDPA and cuDNN in the same run.
# On an H100: what the KIVI-2 G=128 kernel's time is made of, B=8 32k, 8 splits, as `mosaic_decode` calls it:
# every program reading one (b, k)'s tiles (`Options.timing_only="l2"`, new: the bytes from L2, the same
# instructions), 3 pipeline stages, lag 0 (109 registers against 117), two tiles a step (602 SASS a tile
# against 675, but 149 registers: 3 programs per SM), and the same code at 3 and 2 programs per SM
# (`Options.smem_pad_kb`, new: unused shared memory). New: `Options.narrow_mma` (WGMMA at N = 8): with lag 0,
# 93 registers and 40 KB (the window's ring keys in 32-channel parts): 5 programs per SM (compiled for an H200
# on the CPU); its tests natively first. Session 35's fit was 55 us + 0.077 us per loop
# instruction; if "l2" takes ~50 us off, the loads and the loop do not overlap; the occupancy curve says what
# a 5th program per SM (N=8 MMAs: ~16 registers less) could be worth.
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
source "$(dirname "$0")/device_setup.sh"
LIMIT=${CALL_LIMIT_S:-580}
if [[ "$card" == *H200* ]]; then
  timeout $(( LIMIT - 200 - SECONDS )) python3 benchmarks/throughput.py --models llama3_8b --contexts 32768 \
    --skip-b1 --row-timeout 120 --formats ${TP_FORMATS:-bf16,kivi2,fp8_e4m3,kivi2_g128} \
    --out $OUT/tp_llama_32k_s36a.json > $OUT/tp_log.txt 2>&1
  echo "tp rc=$?"; rm -f $OUT/*.png; grep -v Warning $OUT/tp_log.txt | tail -n 9 | cut -c1-200
  timeout $(( LIMIT - SECONDS - 8 )) python3 benchmarks/decode_kernels.py --batches 8 --contexts 32768 \
    --formats fp8_e4m3,kivi2_g128,kivi2,bf16 --peers torch_sdpa,cudnn --step-batches 0 --reps 5 --stream-gb 1 \
    --out $OUT/decode_b8_32k_s36a.json > $OUT/decode_log.txt 2>&1
  echo "decode rc=$?"; rm -f $OUT/*.png
  grep -v Warning $OUT/decode_log.txt | grep -E " us |failed|Error|stream|x " | cut -c1-200 | tail -n 20
  exit 0
fi
timeout 110 python3 -m pytest -q -x -p no:cacheprovider tests/test_mosaic_kivi.py tests/test_mosaic_decode.py \
  -k "narrow_mma or (narrow_softmax and n8)" > $OUT/pytest_n8.txt 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_n8.txt | cut -c1-300
V=dequant_denorm_s32_mb
B="narrow:$V:glue;n8_lag0:$V+narrow_mma=True+lag=0:glue;l2:$V+timing_only=l2:glue;occ3:$V+smem_pad_kb=10:glue"
B="$B;occ2:$V+smem_pad_kb=30:glue;lag0:$V+lag=0:glue;stages3:$V+stages=3:glue"
B="$B;n8_lag0_s3:$V+narrow_mma=True+lag=0+stages=3:glue;narrow_again:$V:glue"
timeout $(( LIMIT - SECONDS - ${SPLITS10_S:-160} )) python3 benchmarks/mosaic_sass.py --builds "$B" --point 8:32768 \
  --splits 8 --reps 5 --out $OUT/kivi_g128_parts.json > $OUT/parts_log.txt 2>&1
echo "parts rc=$?"; grep -v Warning $OUT/parts_log.txt | grep -E '"build"|Error|error' | cut -c1-200
# 8 splits are 512 + 64 window programs: 4 an SM hold 528, 5 an SM 660; 10 splits (704) fill 5 an SM
B="n8_lag0_10:$V+narrow_mma=True+lag=0:glue;narrow_10:$V:glue"
timeout $(( LIMIT - SECONDS - 90 )) python3 benchmarks/mosaic_sass.py --builds "$B" --point 8:32768 --splits 10 \
  --reps 5 --out $OUT/kivi_g128_splits10.json > $OUT/splits10_log.txt 2>&1
echo "splits10 rc=$?"; grep -v Warning $OUT/splits10_log.txt | grep -E '"build"|Error|error' | cut -c1-200
LEFT=$(( LIMIT - SECONDS - 8 ))
if (( LEFT > 60 )); then  # through ops: the default build beside torch SDPA, then the N = 8 build
  timeout $LEFT python3 benchmarks/runs/session36_ops.py $OUT 8:32768 > $OUT/ops_log.txt 2>&1
  echo "ops rc=$?"; rm -f $OUT/*.png
  grep -v Warning $OUT/ops_log.txt | grep -E " us |failed|Error|x " | cut -c1-200 | tail -n 12
fi
