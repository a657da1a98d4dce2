"""Session 15: the kivi2_g128 rows of the new default (`mosaic_decode.DEFAULT_WINDOW = "auto"`) from call
3's same-run timings (`decode_parts/decode_s15c_kivi.json`): at each point, the row of the window that
session 15's `auto_window` picked for that point's default splits (the kernel's window where a split
holds <= 8 capacity tiles; session 16 takes it everywhere) (the sweep's mosaic_window="kernel" row, or the
table's kvjax row, which was window_merge's), and the run's torch SDPA rows. Writes
`decode_parts/decode_s15c_auto.json` (merged into `decode_h200.json` with `decode_kernels.py --merge`).

  python3 benchmarks/runs/session15_auto_rows.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from pallas_kernels.gpu import mosaic_decode as md  # noqa: E402

PARTS = os.path.join(os.path.dirname(__file__), "..", "results", "decode_parts")


def main():
  d = json.load(open(os.path.join(PARTS, "decode_s15c_kivi.json")))
  by = {(r["impl"], r["batch"], r["context"]): r for r in d["rows"]}
  rows = []
  for (impl, b, ctx), r in sorted(by.items(), key=lambda kv: kv[0][1:]):
    if impl == "torch_sdpa":
      rows.append(r)
    if impl != "kvjax":
      continue
    tiles = ctx // 128
    window = "kernel" if tiles <= 8 * md.default_splits(b, 8, tiles, min_tiles=1) else "pallas"  # session 15's rule
    pick = by.get(("sweep:mosaic_window=kernel", b, ctx)) if window == "kernel" else r
    rows.append(dict(pick, impl="kvjax"))
    print(f"B={b:<3d} ctx={ctx:<6d} window={window:7s} {pick['us']:8.1f} us "
          f"(window_merge {r['us']:.1f}) torch {by[('torch_sdpa', b, ctx)]['us']:.1f}")
  meta = dict(d["meta"], note="kvjax kivi2_g128 rows: mosaic_decode window='auto' picked from call 3's rows "
              "(benchmarks/runs/session15_auto_rows.py)")
  with open(os.path.join(PARTS, "decode_s15c_auto.json"), "w") as fh:
    json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
  main()
