"""Session 26: the KIVI kernel at issue 7's batches by splits. At B=69 (KIVI-2 G=128's largest batch in 40 GiB
at 32k) there are 69 x 8 = 552 (b, k) pairs; `mosaic_decode.default_splits` gave 1 split above 256 pairs
(session 26 changed that), and 128 registers a thread allow 4 programs per SM, 528 on a 132-SM H100 / H200.
Times the kernel through `ops.decode_attention` at each B:splits (splits 0: the default rule) and checks each
output against the first point of the same batch (`max_abs_diff_vs_first`, `rel_err_vs_first`). Writes JSON.

    python3 benchmarks/runs/session26_waves.py OUT.json [fmt] [B:splits,...]
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../.."))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import decode_kernels as dk  # noqa: E402
from pallas_kernels.gpu import mosaic_decode as md, ops  # noqa: E402
from row_log import measured  # noqa: E402


def main():
  out = sys.argv[1]
  fmt = sys.argv[2] if len(sys.argv) > 2 else "kivi2_g128"
  points = [tuple(map(int, p.split(":"))) for p in (sys.argv[3] if len(sys.argv) > 3 else
                                                     "69:1,69:2,69:4,69:8,64:0,66:0").split(",")]
  reps, ctx = int(os.environ.get("REPS", 3)), int(os.environ.get("CONTEXT", 32768))
  res = {"device": jax.devices()[0].device_kind, "format": fmt, "context": ctx, "rows": []}
  key = jax.random.PRNGKey(0)
  first = {}
  for b, ns in points:
    def measure(row, b=b, ns=ns):
      c0 = dk.random_cache(fmt, b, ctx, ctx - 256, key)  # `cache_sets`' first cache and query
      q = jax.random.normal(jax.random.fold_in(key, 99), (b, dk.SHAPE.n_heads, 1, dk.SHAPE.head_dim), jnp.bfloat16)
      o = np.asarray(jax.jit(functools.partial(ops.decode_attention, num_splits=ns or None))(q, c0), np.float32)
      ref = first.setdefault(b, o)
      row["max_abs_diff_vs_first"] = float(np.max(np.abs(o - ref)))
      row["rel_err_vs_first"] = float(np.linalg.norm(o - ref) / max(np.linalg.norm(ref), 1e-30))
      del c0
      (_, row["us"], row["bytes_read"]), = dk.kvjax_rows(fmt, b, ctx, reps, key, False,
                                                         {"num_splits": ns} if ns else None)
      row["us_per_seq"] = row["us"] / b
    measured(res, out, dict(format=fmt, batch=b, context=ctx, splits=ns or md.default_splits(b, 8, ctx // 128),
                            default=not ns), measure)


if __name__ == "__main__":
  main()
