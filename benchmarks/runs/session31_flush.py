"""Session 31, prepared for a device: `rows.flush_rows` (XLA's KIVI key flush) no longer copies the residual
into a padded (n_blocks + 1) R row buffer (session 30's HLO: 32 MiB at Gemma B=64, written, scattered, read and
copied back, `decode_parts/session30/append_hlo_b64.txt`): a one-token append writes the token into ``k_res``
in place, quantizes the block from it and zeroes the rows whose block filled (`rows._flush_one`); longer appends
use an R + n row buffer. Here the previous version (`padded_flush_rows`,
kept below as the record of what is compared) against the new one in the same process: bit-identity over ragged
single-token appends across a key block's end, then the append alone timed (`decode_kernels.append_only`, caches
rotated beyond L2) with XLA's scatters and with the one-kernel writer storing XLA's flush (`flush_in_kernel=False`).

    python3 benchmarks/runs/session31_flush.py OUT.json [shape:fmt:B:context ...]

Run in session 31 on an H100 at commit 9c9d9cb (`decode_parts/session31/flush_inplace.json`): bit-identical, and
the append alone with XLA's scatters at Gemma KIVI-2 32k B=64 took 92.6 us in place against 94.8 / 93.4 padded
(B=8: 34.0 against 30.1 / 32.5), i.e. no measurable gain, so `rows.flush_rows` went back to the padded buffer
(at later commits both names below compute the same thing).
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

NEW_FLUSH = rows.flush_rows
POINTS = ("gemma2_2b:kivi2:8:32768", "gemma2_2b:kivi2:64:32768", "gemma2_2b:kivi2_g128:64:32768",
          "llama3_8b:kivi2_g128:8:32768", "llama3_8b:kivi2_g128:64:32768")


def padded_flush_rows(cache, f):
  """`rows.flush_rows` as of commit aa36c1a: a (n_blocks + 1) R row buffer, the residual by dynamic slice."""
  fmt, r_len = cache.fmt, cache.fmt.residual
  k_new, count, lengths = f.new, f.count, f.lengths
  b, h, n, d = k_new.shape
  r = lengths % r_len
  n_blocks = (r_len + n) // r_len
  buf = jnp.zeros((b, h, (n_blocks + 1) * r_len, d), cache.k_res.dtype)
  buf = buf.at[:, :, :r_len].set(cache.k_res)
  j = jnp.arange(n)
  pos = jnp.where(j[None] < count[:, None], r[:, None] + j[None], buf.shape[2])
  buf = rows._scatter_tokens(buf, k_new, pos)
  m = r + count
  full = m // r_len
  blocks = buf[:, :, : n_blocks * r_len].reshape(b, h, n_blocks, r_len, d)
  if fmt.sink:
    blocks = rows._without_sinks(blocks, lengths - r, fmt.sink)
  qb = quant.quantize(blocks.astype(jnp.float32), fmt.key, block=r_len, layout=cache.k.layout)
  n_stored = cache.capacity // r_len
  blk = jnp.arange(n_blocks)
  dest = jnp.where(blk[None] < full[:, None], (lengths - r)[:, None] // r_len + blk[None], n_stored)
  writes = [rows.RowWrite(f"k.{n}", (b, h, n_stored, -1, getattr(qb, n).shape[-1]), getattr(qb, n), dest)
            for n in ("codes", "scale", "zero")]
  start = full * r_len
  res = jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, r_len, axis=1))(buf, start)
  keep = jnp.arange(r_len)[None, :] < (m - start)[:, None]
  res = jnp.where(keep[:, None, :, None], res, 0).astype(cache.k_res.dtype)
  return writes, res


def with_flush(flush, fn):
  """`fn` traced with `rows.flush_rows` set to `flush` (`lower_flushes` looks it up at trace time)."""
  def run(*a, **k):
    rows.flush_rows = flush
    try:
      return fn(*a, **k)
    finally:
      rows.flush_rows = NEW_FLUSH
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
      for tag, flush in (("old", padded_flush_rows), ("new", NEW_FLUSH)):
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
      for tag, flush in (("old", padded_flush_rows), ("new", NEW_FLUSH), ("old_again", padded_flush_rows)):
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
