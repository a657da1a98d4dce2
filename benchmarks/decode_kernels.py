"""Decode-attention speed: kvjax fused Pallas kernels vs peers, on one GPU.

    python3 benchmarks/decode_kernels.py --out benchmarks/results/decode_h200.json

Llama-3-8B head shape (32 query heads, 8 KV heads, head_dim 128) by default;
`--shape gemma2_2b` times Gemma-2-2B's (8 query heads, 4 KV heads, head_dim
256, logit soft-cap 50 in the kvjax kernels; the bf16 peers have no soft-cap). One query
token. Timing is on the device: `steps` decode steps run inside one jitted
`fori_loop` (warm-up call first, median of `--reps` calls); each step's query
depends on the previous output, and several cache copies (together > 3x the
60 MB L2) are visited in turn. Paths through plain XLA also append the new
token to their cache every step, so XLA cannot hoist a per-call layout change
or dequantization out of the loop (DESIGN.md section 6); kvjax is timed both
as the kernel alone ("kvjax") and as the full step with the in-place append
("kvjax_step"), and the append alone ("kvjax_append"); "_pallas" rows store the append's rows
with the one-kernel writer (`pallas_kernels.gpu.write`) instead of XLA scatters, "_pallas_flush"
(KIVI) with the key block quantized inside that kernel too.
Also: `--check` runs the test-base cases and a large ragged case on the GPU
against the XLA reference for every format.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import jax.numpy as jnp

from kvjax import attention, cache as cache_lib, formats
import pallas_kernels.gpu  # noqa: F401  (registers pallas_gpu)
from pallas_kernels.gpu import mosaic_fp8, ops, write

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_variants import SHAPES, check_all, opts_name, split_layout, sweep_grid  # noqa: E402
from decode_report import BF16_PEERS, KV_FORMATS, merge_and_plot, plot, save, summary  # noqa: E402
from torch_peer import torch_sdpa_row  # noqa: E402

SHAPE = SHAPES["llama3_8b"]  # the timed head shape; main() sets it from --shape
WINDOW = None  # sliding window of the kvjax kernels (Gemma local layers); main() sets it from --window
STEP_WRITERS = None  # the step rows' writers by suffix ("" XLA, "_pallas", ...; None: all); from --step-writers
# The appended tokens' dtype: a bf16 model's k / v (`kvjax.module`'s projections, the bf16 peer's rows). Until
# session 24 the steps appended float32 tokens, which a KIVI append first rounds to its bf16 residual: two
# more XLA fusions before the writer. main() sets it from --token-dtype.
TOKEN_DTYPE = jnp.bfloat16
L2_BYTES = 60e6


# ----------------------------------------------------------------------------- inputs


def random_cache(fmt_name, b, s, length, key):
  """A full-capacity cache with random (never zero) contents and lengths `length`."""
  fmt = formats.preset(fmt_name)
  c = cache_lib.init_cache(fmt, b, SHAPE.k_heads, s, SHAPE.head_dim)
  leaves, tree = jax.tree_util.tree_flatten(c)
  keys = jax.random.split(key, len(leaves))
  out = []
  for lf, kk in zip(leaves, keys):
    if lf.dtype == jnp.int32 and lf.shape == (b,):
      out.append(jnp.full((b,), length, jnp.int32))
    elif lf.dtype in (jnp.uint8, jnp.uint16):  # packed codes (uint16: the "words" KIVI-2 layout)
      out.append(jax.random.bits(kk, lf.shape, lf.dtype))
    elif lf.dtype == jnp.int8:
      out.append(jax.random.randint(kk, lf.shape, -127, 128, jnp.int32).astype(jnp.int8))
    elif jnp.issubdtype(lf.dtype, jnp.floating) and lf.dtype.itemsize == 1:
      out.append((jax.random.normal(kk, lf.shape, jnp.float32) * 8).astype(lf.dtype))
    else:
      out.append(jax.random.uniform(kk, lf.shape, jnp.float32, 0.5, 1.5).astype(lf.dtype))
  return jax.tree_util.tree_unflatten(tree, out)


def cache_bytes_read(c, length):
  """Bytes a fused kernel reads: codes + scales (+ zero) for `length` tokens, + residual windows."""
  s = c.capacity
  total = 0
  for q in (c.k, c.v):
    for a in (q.codes, q.scale, q.zero):
      if a is None:
        continue
      if a.ndim == 4 and a.shape[2] > 1:  # per-token / per-group along tokens: scales with length
        total += a.nbytes * length / s
      else:
        total += a.nbytes
  for a in (c.k_res, c.v_res):
    if a is not None:
      total += a.nbytes
  return total


def n_sets(nbytes):
  return int(min(MAX_SETS, max(1, math.ceil(3 * L2_BYTES / max(nbytes, 1)))))


# ----------------------------------------------------------------------------- timing


def time_loop(step, carry, steps, reps):
  """Median microseconds per step of `step` run `steps` times inside one jit."""
  @functools.partial(jax.jit, donate_argnums=0)
  def run(c):
    return jax.lax.fori_loop(0, steps, lambda i, x: step(x), c)
  out = run(jax.tree_util.tree_map(jnp.copy, carry))  # the caller keeps its carry
  jax.block_until_ready(out)
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    out = run(out)
    jax.block_until_ready(out)
    ts.append((time.perf_counter() - t0) / steps * 1e6)
  return statistics.median(ts)


def chain(q, out):
  """Next query from this step's output, so no step can be skipped or hoisted."""
  return (q.astype(jnp.float32) + 1e-3 * out.astype(jnp.float32)).astype(q.dtype)


def new_token(out, b):
  """A fresh [B, K, 1, H] key/value derived from the output (the step's data dependence), in TOKEN_DTYPE."""
  return out.reshape(b, SHAPE.k_heads, SHAPE.rep, 1, SHAPE.head_dim)[:, :, 0].astype(TOKEN_DTYPE)


def steps_for(us_guess):
  return int(max(STEPS_MIN, min(400, 30000 / max(us_guess, 1))))


MAX_SETS = int(os.environ.get("KVJAX_BENCH_MAX_SETS", 16))
STEPS_MIN = int(os.environ.get("KVJAX_BENCH_STEPS_MIN", 20))


# ----------------------------------------------------------------------------- impls


def cache_sets(fmt_name, b, ctx, key):
  """Enough random caches (filled to ctx - 256, room for the timed appends) to rotate beyond L2,
  the bytes one step reads, and a query."""
  length = ctx - 256
  c0 = random_cache(fmt_name, b, ctx, length, key)
  nb = cache_bytes_read(c0, length if WINDOW is None else min(length, WINDOW))
  ns = n_sets(c0.nbytes)
  caches = tuple([c0] + [random_cache(fmt_name, b, ctx, length, jax.random.fold_in(key, i))
                         for i in range(1, ns)])
  q = jax.random.normal(jax.random.fold_in(key, 99), (b, SHAPE.n_heads, 1, SHAPE.head_dim), jnp.bfloat16)
  return length, nb, ns, caches, q


def kernel_options(opts=None):
  """Keyword arguments of the kvjax kernel: the shape's logit soft-cap and the kernel options."""
  return {"logit_softcap": SHAPE.softcap, "window": WINDOW, **(opts or {})}


def kvjax_rows(fmt_name, b, ctx, reps, key, do_step, opts=None):
  """Times the fused kernel, and (do_step) the full step with append and the append alone."""
  length, nb, ns, caches, q = cache_sets(fmt_name, b, ctx, key)
  steps = max(1, steps_for(nb / 3.5e6) // ns)
  rows = []
  layout, opts = split_layout(opts)  # `value_tile`: the cache's value layout (default: the backend's)
  caches = tuple(layout(c) for c in caches)

  def attend(x):
    q, cs = x
    for c in cs:
      q = chain(q, ops.decode_attention(q, c, **kernel_options(opts)))
    return q, cs
  us = time_loop(attend, (q, caches), steps, reps) / ns
  rows.append(("kvjax", us, nb))
  if do_step:  # the step and the append alone, with each cache writer (suffix "_pallas": one kernel)
    # "_pallas": the writer placing the rows from the lengths (its default at decode); "_pallas_xla_pos": the
    # positions computed by XLA first (one fusion before the kernel, the default until session 39)
    writers = [("", cache_lib.append), ("_pallas", write.append),
               ("_pallas_xla_pos", functools.partial(write.append, positions_in_kernel=False))]
    fmt = formats.preset(fmt_name)
    if fmt.is_kivi and (fmt.key.group_size, SHAPE.head_dim) not in write.IN_KERNEL_FLUSH_SLOW:
      # the KIVI key block quantized inside the write kernel (not where that kernel is too slow to compile)
      writers.append(("_pallas_flush", functools.partial(write.append, flush_in_kernel=True)))
    for suffix, append_fn in writers:
      if STEP_WRITERS is not None and suffix not in STEP_WRITERS:
        continue
      full = decode_step(functools.partial(ops.decode_attention, **kernel_options(opts)), b, ctx,
                         length, append_fn)
      try:
        rows.append(("kvjax_step" + suffix, time_loop(full, (q, caches), steps, reps) / ns, nb))
      except NotImplementedError as e:  # a writer that declines this cache (e.g. `write.NATIVE_WORDS_BITS`)
        print(f"kvjax_step{suffix} {fmt_name}: skipped, {e}", flush=True)
        continue
      app = append_only(append_fn, b, ctx, length)
      rows.append(("kvjax_append" + suffix, time_loop(app, (q, caches), steps, reps) / ns, 0))
  return rows


def wrapped(cs, ctx, length):
  """The cache sets with their lengths wrapped back to `length` before the capacity (so every timed step writes
  a new position), all sets in one small op a loop step (a real decode loop has none; until session 39 each
  set's wrap fused with its append's position arithmetic)."""
  lens = jnp.stack([c.lengths for c in cs])
  lens = jnp.where(lens >= ctx - 1, length, lens)
  return [c.replace(lengths=lens[i]) for i, c in enumerate(cs)]


def decode_step(attend_fn, b, ctx, length, append_fn=None):
  """A real decode step over each cache set: attend, append a token derived from the output (the
  cache changes every step, nothing is hoisted), and chain the next query on the output."""
  append_fn = append_fn or cache_lib.append

  def full(x):
    q, cs = x
    new = []
    for c in wrapped(cs, ctx, length):
      o = attend_fn(q, c)
      t = new_token(o, b)
      new.append(append_fn(c, t, t))
      q = chain(q, o)
    return q, tuple(new)
  return full


def append_only(append_fn, b, ctx, length):
  """The append alone over each cache set: a token derived from the query, lengths wrapped back to
  `length` before the capacity (`wrapped`: every step writes a new position)."""
  def app(x):
    q, cs = x
    new = []
    for c in wrapped(cs, ctx, length):
      t = new_token(q, b)
      new.append(append_fn(c, t, t))
    return q, tuple(new)
  return app


def xla_dequant_row(fmt_name, b, ctx, reps, key):
  """kvjax's XLA reference (dequantize, then attend), cache appended every step."""
  length, nb, ns, caches, q = cache_sets(fmt_name, b, ctx, key)

  full = decode_step(functools.partial(attention.decode_attention, logit_softcap=SHAPE.softcap,
                                       window=WINDOW), b, ctx, length)
  steps = max(1, steps_for(nb / 1.5e6) // ns)
  return time_loop(full, (q, caches), steps, reps) / ns, nb


def bf16_peer_row(impl, b, ctx, reps, key):
  """bf16 peers. Token-major [B, S, K, H] for jax.nn.dot_product_attention, head-major otherwise.

  The peers have no logit soft-cap (Gemma-2 shape): they do a little less work than kvjax."""
  length = ctx - 256
  per = b * ctx * SHAPE.k_heads * SHAPE.head_dim * 2
  nb = 2 * per * length / ctx
  ns = n_sets(2 * per)
  head_major = impl in ("jax_pallas_mqa", "xla_einsum")
  shape = (b, SHAPE.k_heads, ctx, SHAPE.head_dim) if head_major else (b, ctx, SHAPE.k_heads, SHAPE.head_dim)
  kvs = tuple((jax.random.normal(jax.random.fold_in(key, 2 * i), shape, jnp.bfloat16),
               jax.random.normal(jax.random.fold_in(key, 2 * i + 1), shape, jnp.bfloat16))
              for i in range(ns))
  lens = jnp.full((b,), length, jnp.int32)
  q = jax.random.normal(jax.random.fold_in(key, 99), (b, SHAPE.n_heads, 1, SHAPE.head_dim), jnp.bfloat16)
  rep = SHAPE.rep

  if impl in ("cudnn", "xla_dpa"):
    def attn(q, k, v):
      o = jax.nn.dot_product_attention(q.transpose(0, 2, 1, 3), k, v, key_value_seq_lengths=lens,
                                       implementation="cudnn" if impl == "cudnn" else "xla")
      return o.transpose(0, 2, 1, 3)
  elif impl == "jax_pallas_mqa":
    import warnings
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      from jax.experimental.pallas.ops.gpu import decode_attention as jdec

    def attn(q, k, v):
      bk, d = b * SHAPE.k_heads, SHAPE.head_dim
      o = jdec.mqa(q.reshape(bk, rep, d), k.reshape(bk, ctx, d), v.reshape(bk, ctx, d),
                   kv_seq_len=jnp.repeat(lens, SHAPE.k_heads), k_splits=16)
      return o.reshape(b, SHAPE.n_heads, 1, SHAPE.head_dim)
  else:  # xla_einsum, head-major
    def attn(q, k, v):
      qg = q.reshape(b, SHAPE.k_heads, rep, SHAPE.head_dim)
      s = jnp.einsum("bkrh,bksh->bkrs", qg, k, preferred_element_type=jnp.float32) * SHAPE.head_dim ** -0.5
      s = jnp.where(jnp.arange(ctx)[None, None, None] < lens[:, None, None, None], s, -1e30)
      p = jax.nn.softmax(s, axis=-1)
      o = jnp.einsum("bkrs,bksh->bkrh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
      return o.reshape(b, SHAPE.n_heads, 1, SHAPE.head_dim).astype(q.dtype)

  # Custom calls (cudnn, Pallas) cannot be hoisted; plain XLA paths append every step.
  append = impl in ("xla_dpa", "xla_einsum")

  def step(x):
    q, kv, i = x
    new = []
    for k, v in kv:
      o = attn(q, k, v)
      if append:
        t = new_token(o, b).astype(jnp.bfloat16)
        pos = length + i % 200
        if head_major:
          k = jax.lax.dynamic_update_slice(k, t, (0, 0, pos, 0))
          v = jax.lax.dynamic_update_slice(v, t, (0, 0, pos, 0))
        else:
          t = t.transpose(0, 2, 1, 3)
          k = jax.lax.dynamic_update_slice(k, t, (0, pos, 0, 0))
          v = jax.lax.dynamic_update_slice(v, t, (0, pos, 0, 0))
      new.append((k, v))
      q = chain(q, o)
    return q, tuple(new), i + 1
  steps = max(1, steps_for(nb / 3e6) // ns)
  return time_loop(step, (q, kvs, jnp.int32(0)), steps, reps) / ns, nb


def stream_tbps(reps, gb=4.0):
  """Read-only stream: a reduction over `gb` GB of bf16 that depends on the loop carry."""
  n = int(gb * 1e9 / 2) // 1024 * 1024
  x = jax.random.normal(jax.random.PRNGKey(7), (n // 1024, 1024), jnp.bfloat16)

  def step(c):
    s, x = c
    return s + jnp.sum((x * s.astype(x.dtype)).astype(jnp.float32)) * 1e-9, x
  us = time_loop(step, (jnp.float32(1.0), x), 20, reps)
  return n * 2 / us / 1e6


def torch_row(b, ctx, reps):
  """`torch_peer.torch_sdpa_row` at the timed head shape."""
  return torch_sdpa_row(b, ctx, reps, SHAPE.k_heads, SHAPE.n_heads, SHAPE.head_dim)


# ----------------------------------------------------------------------------- main


def sweep_options(o):
  """A --sweep-options entry as `ops.decode_attention` options: a dict under "mosaic_fp8" is the Mosaic FP8
  kernel's build (`mosaic_fp8.Fp8Options`)."""
  o = dict(o)
  if isinstance(o.get("mosaic_fp8"), dict):
    o["mosaic_fp8"] = mosaic_fp8.Fp8Options(**o["mosaic_fp8"])
  return o


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="benchmarks/results/decode_h200.json")
  ap.add_argument("--shape", default="llama3_8b", choices=sorted(SHAPES),
                  help="head shape (gemma2_2b: 8 query / 4 KV heads, head_dim 256, soft-cap 50)")
  ap.add_argument("--window", type=int, help="sliding window of the kvjax kernels (peers: none)")
  ap.add_argument("--step-batches", default="8", help="batches whose full step and append are timed")
  ap.add_argument("--step-writers", default=None,
                  help="comma-separated writers of the step rows: xla,pallas,pallas_xla_pos,pallas_flush (default all)")
  ap.add_argument("--token-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                  help="dtype of the tokens the timed steps append (a bf16 model's k / v by default)")
  ap.add_argument("--batches", default="1,8,64")
  ap.add_argument("--contexts", default="1024,4096,32768,131072")
  ap.add_argument("--formats", default=",".join(KV_FORMATS))
  ap.add_argument("--peers", default=",".join(BF16_PEERS + ("xla_dequant",)))
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--check", action="store_true")
  ap.add_argument("--check-formats", default="", help="formats to --check (default: all)")
  ap.add_argument("--check-quick", action="store_true", help="--check on 2 kernel shapes per variant")
  ap.add_argument("--stream-gb", type=float, default=4.0)
  ap.add_argument("--max-bf16-gb", type=float, default=20.0, help="skip configs whose bf16 cache is larger")
  ap.add_argument("--sweep", default="", help="formats to sweep kernel options for (B=8, 32k)")
  ap.add_argument("--sweep-variants-only", action="store_true",
                  help="sweep only the kernel variants (default tiling), not stages/splits")
  ap.add_argument("--sweep-batch", type=int, default=8)
  ap.add_argument("--sweep-context", type=int, default=32768)
  ap.add_argument("--sweep-points", default="",
                  help="B:context,... to sweep at instead of --sweep-batch/--sweep-context")
  ap.add_argument("--sweep-splits", default="",
                  help="sweep only num_splits over these values (beside the default), e.g. 2,4,8,16")
  ap.add_argument("--sweep-options", default="",
                  help='sweep these option sets (a JSON list of dicts, beside the default), e.g. '
                       '\'[{"pallas_merge": false}, {"num_splits": 4}]\'')
  ap.add_argument("--tune", action="store_true",
                  help="time the table's kvjax rows with each swept format's fastest options")
  ap.add_argument("--tuned-from", help="a result file whose meta.tuned options the kvjax rows use")
  ap.add_argument("--merge", nargs="*", help="merge these result files into --out and plot; no timing")
  args = ap.parse_args()
  rows, t_start = [], time.time()
  if args.merge is not None:
    return merge_and_plot(args.merge, args.out)
  global SHAPE, WINDOW, TOKEN_DTYPE, STEP_WRITERS
  SHAPE, WINDOW, TOKEN_DTYPE = SHAPES[args.shape], args.window, jnp.dtype(args.token_dtype)
  STEP_WRITERS = None if args.step_writers is None else {
      "" if w == "xla" else "_" + w for w in args.step_writers.split(",")}

  def log(msg):
    print(f"[{time.time() - t_start:6.0f}s] {msg}", flush=True)

  meta = {"device": str(jax.devices()[0]), "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
          "shape": args.shape, "head_shape": dataclasses.asdict(SHAPE), "window": WINDOW,
          "token_dtype": args.token_dtype}
  if args.check:
    meta["check_worst_rel_err"] = check_all(log, [f for f in args.check_formats.split(",") if f],
                                            args.check_quick, SHAPE)
  tb = stream_tbps(args.reps, args.stream_gb)
  meta["stream_tbps"] = tb
  log(f"stream {tb:.2f} TB/s")

  def add(impl, fmt, b, ctx, us, nb):
    rows.append(dict(impl=impl, format=fmt, batch=b, context=ctx, us=round(us, 2),
                     bytes_read=int(nb), tbps=round(nb / us / 1e6, 3) if nb else None,
                     frac_roofline=round(nb / us / 1e6 / tb, 3) if nb else None))
    log(f"{impl:16s} {fmt:12s} B={b:<3d} ctx={ctx:<7d} {us:9.1f} us" +
        (f" {nb / us / 1e6:5.2f} TB/s" if nb else ""))

  key = jax.random.PRNGKey(0)
  tuned = {}
  points = ([tuple(map(int, p.split(":"))) for p in args.sweep_points.split(",")] if args.sweep_points
            else [(args.sweep_batch, args.sweep_context)])
  for f, (sb, sc) in [(f, p) for f in filter(None, args.sweep.split(",")) for p in points]:
    best = None
    if args.sweep_options:
      grid = [{}] + [sweep_options(o) for o in json.loads(args.sweep_options)]
    elif args.sweep_splits:
      grid = [{}] + [dict(num_splits=int(x)) for x in args.sweep_splits.split(",")]
    else:
      grid = sweep_grid(f, args.sweep_variants_only)
    for o in grid:
      variant = opts_name(f, o)
      if meta.get("check_worst_rel_err", {}).get(variant, 0.0) >= 1e-2:
        log(f"sweep {o}: skipped, {variant} failed the check")
        continue
      try:
        (_, us, nb), = kvjax_rows(f, sb, sc, args.reps, key, False, o)
      except Exception as e:  # e.g. shared memory exceeded, an unsupported 8-bit dot
        log(f"sweep {f} {o} failed: {repr(e)[:300]}")
        continue
      add("sweep:" + ",".join(f"{k}={v}" for k, v in o.items()), f, sb, sc, us, nb)
      if best is None or us < best[0]:
        best = (us, o)
    if args.tune and best is not None:
      tuned[f] = {k: v for k, v in best[1].items() if v is not None}
      log(f"tuned {f}: {tuned[f]} ({best[0]:.1f} us)")
  if args.tuned_from:  # options picked by an earlier --tune run
    with open(args.tuned_from) as fh:
      tuned = {**json.load(fh)["meta"].get("tuned", {}), **tuned}
  meta["tuned"] = tuned
  save(args.out, meta, rows)
  for b in map(int, filter(None, args.batches.split(","))):
    for ctx in map(int, args.contexts.split(",")):
      if b * ctx * SHAPE.k_heads * SHAPE.head_dim * 4 / 1e9 > args.max_bf16_gb:
        log(f"skip B={b} ctx={ctx}: bf16 cache over {args.max_bf16_gb} GB")
        continue
      for f in args.formats.split(","):
        do_step = str(b) in args.step_batches.split(",")
        for impl, us, nb in kvjax_rows(f, b, ctx, args.reps, key, do_step, tuned.get(f)):
          add(impl, f, b, ctx, us, nb)
      for p in filter(None, args.peers.split(",")):
        if p == "torch_sdpa":
          r = torch_row(b, ctx, args.reps)
          if r:
            add(p, "bf16", b, ctx, *r)
        elif p == "xla_dequant":
          for f in ("fp8_e4m3", "kivi2"):
            add("xla_dequant", f, b, ctx, *xla_dequant_row(f, b, ctx, args.reps, key))
        else:
          add(p, "bf16", b, ctx, *bf16_peer_row(p, b, ctx, args.reps, key))
      save(args.out, meta, rows)
  summary(rows, tb, log)
  plot(rows, os.path.splitext(args.out)[0] + ".png", meta["head_shape"], meta["device_kind"])


if __name__ == "__main__":
  main()
