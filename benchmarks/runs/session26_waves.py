"""Session 26: is the KIVI kernel losing a wave at issue 7's batch? At B=69 (KIVI-2 G=128's largest batch in
40 GiB at 32k) there are 69 x 8 = 552 (b, k) pairs; `mosaic_decode.default_splits` gives 1 split above 512,
and 128 registers a thread allow 4 programs per SM, 528 on a 132-SM H100 / H200: so 528 programs run in the
first wave and 24 in a second. Times the kernel through `ops.decode_attention` at B=64 / 66 (one wave) and at
B=69 with 1, 2, 4 and 8 splits (more, shorter programs: less tail). Writes JSON.

    python3 benchmarks/runs/session26_waves.py OUT.json [fmt] [B:splits,...]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../.."))
import jax  # noqa: E402

import decode_kernels as dk  # noqa: E402
from pallas_kernels.gpu import mosaic_decode as md  # noqa: E402


def main():
  out = sys.argv[1]
  fmt = sys.argv[2] if len(sys.argv) > 2 else "kivi2_g128"
  points = [tuple(map(int, p.split(":"))) for p in (sys.argv[3] if len(sys.argv) > 3 else
                                                     "69:1,69:2,69:4,69:8,64:0,66:0").split(",")]
  reps, ctx = int(os.environ.get("REPS", 3)), int(os.environ.get("CONTEXT", 32768))
  res = {"device": jax.devices()[0].device_kind, "format": fmt, "context": ctx, "rows": []}
  key = jax.random.PRNGKey(0)
  for b, ns in points:
    row = dict(format=fmt, batch=b, context=ctx, splits=ns or md.default_splits(b, 8, ctx // 128), default=not ns)
    try:
      (_, row["us"], row["bytes_read"]), = dk.kvjax_rows(fmt, b, ctx, reps, key, False,
                                                         {"num_splits": ns} if ns else None)
      row["us_per_seq"] = row["us"] / b
    except Exception as e:  # noqa: BLE001 (a failed point is a row with its error)
      row["error"] = repr(e)[:300]
    res["rows"].append(row)
    print(row, flush=True)
    with open(out, "w") as fh:
      json.dump(res, fh, indent=1)


if __name__ == "__main__":
  main()
