"""Session 27 (prepared for 28): the Mosaic KIVI kernel with Gemma 2's logit soft-cap and a sliding window
(`mosaic_decode.decode_attention(logit_softcap=, sliding_window=)`, reached through `ops.decode_attention`'s
logit_softcap / window; until session 27 such calls on a "words" cache fell back to XLA's reference), natively:
each point's output against `kvjax.attention.decode_attention` with the same options (`rel_err_vs_reference`),
then the kernel timed as `decode_kernels.kvjax_rows` times it, and XLA's reference (the old fallback) timed
once per format. Llama-3-8B heads (the kernel takes head_dim 128; Gemma-2-27B's is 128 too). Writes JSON.

    python3 benchmarks/runs/session28_softcap.py OUT.json [fmt,...] [B:context,...]
"""
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../.."))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import decode_kernels as dk  # noqa: E402
from kvjax import attention  # noqa: E402
from pallas_kernels.gpu import ops  # noqa: E402
from row_log import measured  # noqa: E402

OPTIONS = {"plain": {}, "softcap50": {"logit_softcap": 50.0}, "window4096": {"window": 4096},
           "softcap50_window4096": {"logit_softcap": 50.0, "window": 4096}}


def _xla_us(q, c, opts, reps=5):
  f = jax.jit(functools.partial(attention.decode_attention, **opts))
  f(q, c).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(reps):
    out = f(q, c)
  out.block_until_ready()
  return (time.perf_counter() - t0) / reps * 1e6  # wall clock: launches included (a loose upper figure)


def main():
  out = sys.argv[1]
  fmts = (sys.argv[2] if len(sys.argv) > 2 else "kivi2_g128,kivi2").split(",")
  points = [tuple(map(int, p.split(":"))) for p in (sys.argv[3] if len(sys.argv) > 3 else "8:32768,1:32768").split(",")]
  reps = int(os.environ.get("REPS", 3))
  res = {"device": jax.devices()[0].device_kind, "rows": []}
  key = jax.random.PRNGKey(0)
  for fmt in fmts:
    for b, ctx in points:
      c0 = dk.random_cache(fmt, b, ctx, ctx - 256, key)
      q = jax.random.normal(jax.random.fold_in(key, 99), (b, dk.SHAPE.n_heads, 1, dk.SHAPE.head_dim), jnp.bfloat16)
      for name, opts in OPTIONS.items():
        def measure(row, opts=opts, name=name):
          o = np.asarray(jax.jit(functools.partial(ops.decode_attention, **opts))(q, c0), np.float32)
          ref = np.asarray(jax.jit(functools.partial(attention.decode_attention, **opts))(q.astype(jnp.float32), c0))
          row["rel_err_vs_reference"] = float(np.linalg.norm(o - ref) / max(np.linalg.norm(ref), 1e-30))
          if name in ("plain", "softcap50_window4096"):
            row["xla_reference_us"] = _xla_us(q, c0, opts)
          (_, row["us"], row["bytes_read"]), = dk.kvjax_rows(fmt, b, ctx, reps, key, False, opts)
        measured(res, out, dict(format=fmt, batch=b, context=ctx, options=name), measure)
      del c0


if __name__ == "__main__":
  main()
