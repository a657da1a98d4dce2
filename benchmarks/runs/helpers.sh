# Sourced by the run scripts here (after device_setup.sh). `native_tests SECONDS NAME EXPR FILE...` runs the
# tests of FILE... that -k EXPR selects, natively, into $OUT/NAME.txt, and prints the return code and its tail.
native_tests() {
  local secs=$1 name=$2 expr=$3; shift 3
  timeout "$secs" python3 -m pytest -q -x -p no:cacheprovider "$@" -k "$expr" > "$OUT/$name.txt" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$OUT/$name.txt" | cut -c1-300
}

# `alone BUILDS NAME SECONDS` times KIVI-2 G=128 alone
# at B=8 32k (8 splits) for each `mosaic_sass.py` build of BUILDS ("name:variant:window;..."), within SECONDS,
# into $OUT/NAME.json (log $OUT/NAME_log.txt), and prints each build's time, registers and shared memory.
alone() {
  timeout "$3" python3 benchmarks/mosaic_sass.py --builds "$1" --point 8:32768 --splits 8 --reps 5 \
    --out "$OUT/$2.json" > "$OUT/$2_log.txt" 2>&1
  echo "alone rc=$?"; grep -v Warning "$OUT/$2_log.txt" | grep -E '"build"|Error|error' | python3 -c "
import json, sys
for l in sys.stdin:
  try: r = json.loads(l); print(r['build'], r.get('us'), r.get('registers'), r.get('smem_bytes'))
  except Exception: print(l[:200])"
}
