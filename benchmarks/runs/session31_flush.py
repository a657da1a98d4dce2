"""Session 31: XLA's KIVI key flush in place against the committed one (`rows.flush_rows`, which copies the residual
and the new tokens into a zero-padded buffer: at Gemma B=64 a 32 MiB pad, its scatter and a 16 MiB residual copy
back, `decode_parts/session30/append_hlo_b64.txt`). `inplace_flush_rows` (below; `rows._flush_one` at commit
7817d97) writes a one-token append's token into ``k_res`` in place, quantizes the block from it and zeroes the
rows whose block filled. In one process: bit-identity over ragged single-token appends across a key block's end,
then the append alone timed (`decode_kernels.append_only`, caches rotated beyond L2; "old" / "new" / "old_again":
padded / in place / padded) with XLA's scatters and with the one-kernel writer storing XLA's flush
(`flush_in_kernel=False`).

    python3 benchmarks/runs/session31_flush.py OUT.json [shape:fmt:B:context ...]

Run in session 31 on an H100 at commit 9c9d9cb, where the in-place version was `rows.flush_rows` and the padded
one a copy here (`decode_parts/session31/flush_inplace.json`): bit-identical, and the append alone with XLA's
scatters at Gemma KIVI-2 32k B=64 took 92.6 us in place against 94.8 / 93.4 padded (B=8: 34.0 against 30.1 /
32.5): no measurable gain, so `rows.flush_rows` stayed padded and the in-place version lives here only.
"""
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import decode_kernels as dk  # noqa: E402
from kvjax import cache as cache_lib, formats, quant, rows  # noqa: E402
from pallas_kernels.gpu import write  # noqa: E402

PADDED_FLUSH = rows.flush_rows  # the committed flush: residual and new tokens in a zero-padded buffer
POINTS = ("gemma2_2b:kivi2:8:32768", "gemma2_2b:kivi2:64:32768", "gemma2_2b:kivi2_g128:64:32768",
          "llama3_8b:kivi2_g128:8:32768", "llama3_8b:kivi2_g128:64:32768")


def inplace_flush_rows(cache, f):
  """`rows.flush_rows` as commit 7817d97 had it for one-token appends (`rows._flush_one`, reverted): the token
  into ``k_res`` in place, the block quantized from it, filled rows zeroed by a scatter. Equal to the padded
  flush where ``k_res``'s slots from ``lengths % R`` on are zero (every cache kvjax builds); longer appends
  take the padded flush."""
  fmt, r_len = cache.fmt, cache.fmt.residual
  if f.new.shape[2] != 1 or r_len == 1:
    return PADDED_FLUSH(cache, f)
  b, h = f.new.shape[:2]
  r = f.lengths % r_len
  start = f.lengths - r
  k_res = rows._scatter_tokens(cache.k_res, f.new, jnp.where(f.count > 0, r, r_len)[:, None])
  full = (r + f.count) // r_len  # 0 or 1
  blocks = k_res[:, :, None]
  if fmt.sink:
    blocks = rows._without_sinks(blocks, start, fmt.sink)
  qb = quant.quantize(blocks.astype(jnp.float32), fmt.key, block=r_len, layout=cache.k.layout)
  n_stored = cache.capacity // r_len
  dest = jnp.where(full > 0, start // r_len, n_stored)[:, None]
  writes = [rows.RowWrite(f"k.{n}", (b, h, n_stored, -1, getattr(qb, n).shape[-1]), getattr(qb, n), dest)
            for n in ("codes", "scale", "zero")]
  return writes, k_res.at[jnp.where(full > 0, jnp.arange(b), b)].set(0, mode="drop")


def with_flush(flush, fn):
  """`fn` traced with `rows.flush_rows` set to `flush` (`lower_flushes` looks it up at trace time)."""
  def run(*a, **k):
    rows.flush_rows = flush
    try:
      return fn(*a, **k)
    finally:
      rows.flush_rows = PADDED_FLUSH
  return run


def point(spec):
  shape, fmt_name, b, ctx = spec.split(":")
  b, ctx = int(b), int(ctx)
  dk.SHAPE = dk.SHAPES[shape]
  fmt, h, k = formats.preset(fmt_name), dk.SHAPE.head_dim, dk.SHAPE.k_heads
  out = []
  for wname, base in (("xla", cache_lib.append), ("writer_xla_flush", functools.partial(write.append, flush_in_kernel=False))):
    row = dict(shape=shape, format=fmt_name, batch=b, context=ctx, writer=wname, device=jax.devices()[0].device_kind)
    try:
      # bit-identity: 4 sequences at ragged lengths around a key block's end, 3 single-token appends
      r = fmt.residual
      c = cache_lib.init_cache(fmt, 4, k, 3 * r, h, kivi_layout="words")
      x = jax.random.normal(jax.random.PRNGKey(0), (4, k, 3 * r, h)) * jnp.linspace(0.1, 4, h)
      c = cache_lib.append(c, x, -x, jnp.asarray([0, r - 2, r - 1, 2 * r + 5]))
      res = {}
      for tag, flush in (("old", PADDED_FLUSH), ("new", inplace_flush_rows)):
        step = jax.jit(with_flush(flush, lambda c_, t_: base(c_, t_, t_ * 0.25)))
        cc = c
        for i in range(3):
          t = jax.random.normal(jax.random.PRNGKey(i + 1), (4, k, 1, h), jnp.bfloat16)
          cc = step(cc, t)
        res[tag] = cc
      diff = [jax.tree_util.keystr(p) for (p, a), bb in zip(jax.tree_util.tree_leaves_with_path(res["old"]),
                                                             jax.tree_util.tree_leaves(res["new"]))
              if not np.array_equal(np.asarray(a), np.asarray(bb))]
      row.update(bit_identical=not diff, differing_leaves=diff)
      length, nb, ns, caches, q = dk.cache_sets(fmt_name, b, ctx, jax.random.PRNGKey(7))
      caches = tuple(cache_lib.with_kivi_layout(cc, "words") for cc in caches)
      for tag, flush in (("old", PADDED_FLUSH), ("new", inplace_flush_rows), ("old_again", PADDED_FLUSH)):
        t0 = time.perf_counter()
        app = with_flush(flush, dk.append_only(base, b, ctx, length))
        row[f"append_us_{tag}"] = dk.time_loop(app, (q, caches), 128, 5) / ns
        row[f"time_s_{tag}"] = time.perf_counter() - t0
      del caches
    except Exception as e:  # noqa: BLE001  (a writer that declines this cache: recorded, the next one runs)
      row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print("ROW " + json.dumps(row), flush=True)
    out.append(row)
  return out


def main():
  path, specs = sys.argv[1], sys.argv[2:] or POINTS
  rows_out = []
  for spec in specs:
    rows_out += point(spec)
    with open(path, "w") as f:
      json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
  main()
