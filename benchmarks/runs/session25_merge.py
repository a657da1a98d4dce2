"""Session 25: the KIVI in-kernel merge (`mosaic_decode.KERNEL_MERGE`, the NS + 1 states merged by the kernel:
by the last program to count itself, or by the first of a cluster), now that it builds (its native "hang" was
Mosaic GPU's layout inference, session 24; `mosaic_epilogue.load_query_t` masks the query's rows since session 25),
against the default (the glue in the kernel, then the Triton or XLA merge: 2 launches), through
`ops.decode_attention`, at the short contexts where a launch is a large share of the call, torch SDPA (bf16) in
the same run. Checks first that each variant gives the default's numbers on the timed cache. Writes JSON.

    python3 benchmarks/runs/session25_merge.py OUT.json [fmt,fmt] [B:ctx,B:ctx]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../.."))
import jax  # noqa: E402
import numpy as np  # noqa: E402

import decode_kernels as dk  # noqa: E402
from pallas_kernels.gpu import mosaic_decode as md, ops  # noqa: E402
from row_log import measured  # noqa: E402

VARIANTS = (("kvjax", dict(KERNEL_MERGE=False)),
            ("kvjax_kmerge_count", dict(KERNEL_MERGE=True, MERGE_BY="count")),
            ("kvjax_kmerge_cluster", dict(KERNEL_MERGE=True, MERGE_BY="cluster")))


def main():
  out = sys.argv[1]
  fmts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["kivi2", "kivi2_g128", "kivi4"]
  points = [tuple(map(int, p.split(":"))) for p in (sys.argv[3] if len(sys.argv) > 3 else
                                                     "1:1024,8:1024,1:4096,8:4096,1:32768").split(",")]
  reps = int(os.environ.get("REPS", 5))
  res = {"device": jax.devices()[0].device_kind, "rows": []}
  key = jax.random.PRNGKey(0)
  saved = {k: getattr(md, k) for _, v in VARIANTS for k in v}
  for b, ctx in points:
    tr = dk.torch_row(b, ctx, reps) if jax.default_backend() == "gpu" else None
    res["rows"].append(dict(impl="torch_sdpa", format="bf16", batch=b, context=ctx, us=tr and tr[0]))
    for f in fmts:
      _, _, _, caches, q = dk.cache_sets(f, b, ctx, key)
      base = {}  # the first variant's output that ran
      for impl, attrs in VARIANTS:
        for k, v in attrs.items():
          setattr(md, k, v)
        def measure(row, f=f, caches=caches, q=q, base=base, b=b, ctx=ctx):
          o = np.asarray(jax.jit(ops.decode_attention)(q, caches[0]), np.float32)
          row["max_abs_diff_vs_default"] = float(np.max(np.abs(o - base.setdefault("o", o))))
          (_, row["us"], row["bytes_read"]), = dk.kvjax_rows(f, b, ctx, reps, key, False)
        measured(res, out, dict(impl=impl, format=f, batch=b, context=ctx), measure)
      for k, v in saved.items():
        setattr(md, k, v)
    print(f"B={b} {ctx}: torch {tr and tr[0]}", flush=True)


if __name__ == "__main__":
  main()
