"""Session 28: Gemma-2-2B heads (8 q / 4 KV, head_dim 256, soft-cap 50) on the Mosaic KIVI kernel, new at head_dim
256 (G=128: a "words" cache, the GPU default there now), natively: each point's output against
`kvjax.attention.decode_attention` (`rel_err_vs_reference`, with the soft-cap and, for "window4096", a local
layer's window), then timed as `decode_kernels.kvjax_rows` times it: "words" (the Mosaic kernel), "planar" (the
same format through Triton's planar kernel, where every head_dim-256 KIVI cache went before), and torch SDPA
bf16 in the same run. Writes JSON.

    python3 benchmarks/runs/session28_gemma.py OUT.json [B:context,...] [fmt,...]

WINDOWS (env): the sliding windows timed, comma-separated, "none" for the full context (default "none,4096").
LAYOUTS (env): which of "words,planar" (default both). SPLITS (env, session 29): the `num_splits` values timed,
comma-separated, 0 for `ops.default_splits`' choice (default "0").
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
from kvjax import attention, cache as cache_lib  # noqa: E402
from pallas_kernels.gpu import ops  # noqa: E402
from row_log import measured  # noqa: E402

LAYOUTS = {"words": {"kivi_layout": "words"}, "planar": {"kivi_layout": ""}}


def main():
  out = sys.argv[1]
  points = [tuple(map(int, p.split(":"))) for p in (sys.argv[2] if len(sys.argv) > 2 else "8:32768,1:32768").split(",")]
  fmts = (sys.argv[3] if len(sys.argv) > 3 else "kivi2_g128").split(",")
  reps = int(os.environ.get("REPS", 3))
  windows = [None if w == "none" else int(w) for w in os.environ.get("WINDOWS", "none,4096").split(",")]
  layouts = {k: LAYOUTS[k] for k in os.environ.get("LAYOUTS", ",".join(LAYOUTS)).split(",")}
  splits = [int(n) for n in os.environ.get("SPLITS", "0").split(",")]
  dk.SHAPE = dk.SHAPES["gemma2_2b"]
  res = {"device": jax.devices()[0].device_kind, "shape": "gemma2_2b", "rows": []}
  key = jax.random.PRNGKey(0)
  for b, ctx in points:
    def torch(row, b=b, ctx=ctx):
      row["us"], row["bytes_read"] = dk.torch_row(b, ctx, reps)
    measured(res, out, dict(impl="torch_sdpa", format="bf16", batch=b, context=ctx), torch)
    for fmt in fmts:
      for win in windows:
        for (layout, lopts), ns in ((lo, n) for lo in layouts.items() for n in splits):
          def measure(row, fmt=fmt, win=win, lopts=lopts, ns=ns):
            dk.WINDOW = win
            c0 = dk.random_cache(fmt, b, ctx, ctx - 256, key)
            c0 = cache_lib.with_kivi_layout(c0, lopts["kivi_layout"])
            row["cache_layout"] = c0.k.layout
            q = jax.random.normal(jax.random.fold_in(key, 99), (b, 8, 1, 256), jnp.bfloat16)
            opts = dict(logit_softcap=50.0, window=win)
            split = {"num_splits": ns} if ns else {}
            o = np.asarray(jax.jit(functools.partial(ops.decode_attention, **opts, **split))(q, c0), np.float32)
            ref = np.asarray(jax.jit(functools.partial(attention.decode_attention, **opts))(q.astype(jnp.float32), c0))
            row["rel_err_vs_reference"] = float(np.linalg.norm(o - ref) / max(np.linalg.norm(ref), 1e-30))
            (_, row["us"], row["bytes_read"]), = dk.kvjax_rows(fmt, b, ctx, reps, key, False, {**lopts, **split})
            row["tbps"] = row["bytes_read"] / row["us"] / 1e6
          measured(res, out, dict(impl="kvjax", format=fmt, layout=layout, window=win, batch=b, context=ctx,
                        num_splits=ns or None),
                   measure)
      dk.WINDOW = None


if __name__ == "__main__":
  main()
