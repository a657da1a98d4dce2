"""The experimental Mosaic GPU KIVI-2 kernel (`pallas_kernels.gpu.mosaic_kivi`) on a GPU: a check against
its jnp reference, then its time per decode call (split states + the XLA merge) against the Triton
kivi2_g128 kernel (`ops.decode_attention`) and torch SDPA bf16, same run, Llama-3-8B heads.

    python3 benchmarks/mosaic_kivi_bench.py --points 8:32768,1:32768,8:4096 --splits 4,8,16,32 \
        --variants offset,exact --profile 8:8192:4 \
        --out benchmarks/results/decode_parts/mosaic_kivi.json

Timing as `decode_kernels.py` (steps in one jitted fori_loop, each query from the previous output,
cache copies rotated beyond L2, median of --reps); the caches are random packed words (every uint16 is
eight valid codes) with random scales and zeros, filled to ctx - 256 tokens (`--fill F`: F x ctx tokens,
a long cache holding few tokens; bytes counted for the tokens held).
"""

from __future__ import annotations

import argparse
import collections
import glob
import itertools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import decode_kernels as dk  # noqa: E402
from pallas_kernels import test_base  # noqa: E402
from kvjax import attention, cache as kvcache, formats  # noqa: E402
from pallas_kernels.gpu import decode, mosaic_decode, mosaic_kivi as mk  # noqa: E402


def random_packed(b, kh, s, key, scale_dtype=jnp.float16, group=128, bits=2):
  """A packed KIVI cache (the kernel's layout) of random words and scales (`scale_dtype`: the
  scales' and zeros'; a kvjax cache holds bf16) for group size `group` (128 or 32) and `bits` (2 or 4)."""
  k = jax.random.split(key, 6)
  words = lambda kk, shape: jax.random.bits(kk, shape, jnp.uint16)
  scale = lambda kk, shape: jax.random.uniform(kk, shape, jnp.float32, 0.05, 0.2).astype(scale_dtype)
  zero = lambda kk, shape: (0.2 * jax.random.normal(kk, shape)).astype(scale_dtype)
  g = s // mk.TILE
  per_token = (b, kh, s) if group == 128 else (b, kh, s, 128 // group)
  w = 8 * bits  # words a 128-code row
  return (words(k[0], (b, kh, s, w)), scale(k[1], (b, kh, s // group, 128)), zero(k[2], (b, kh, s // group, 128)),
          words(k[3], (b, kh, g, 128, w)), scale(k[4], per_token), zero(k[5], per_token))


def attend(q, lengths, cache, num_splits, interpret=False, stages=2, variant="exact", **prof):
  """q [B, N, 1, H] -> [B, N, 1, H]: scaled and transposed query, split states, XLA merge."""
  b, n, _, h = q.shape
  kh = cache[0].shape[1]
  rep = n // kh
  q_t = (q.astype(jnp.float32).reshape(b, kh, rep, h) * (h ** -0.5 * decode.LOG2E)).swapaxes(-1, -2)
  q_t = jnp.pad(q_t, ((0, 0), (0, 0), (0, 0), (0, mk.ROWS - rep)))
  o_t, m, l = mk.kivi2_states(q_t, lengths, *cache, num_splits=num_splits, interpret=interpret,
                              stages=stages, variant=variant, live_rows=rep, **prof)
  out = decode.combine(o_t.swapaxes(-1, -2), m, l, rep)  # [B, K, rep, H]
  return out.reshape(b, n, 1, h).astype(q.dtype)


def check(log, interpret=False, variants=mk.VARIANTS):
  """Worst relative error of the GPU kernel against `reference_states` (ragged, empty, split past)."""
  worst = 0.0
  for variant, (lengths, splits) in itertools.product(variants, (((1024, 300), 2), ((0, 129), 4))):
    q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case(
        lengths, capacity=1024, rows=mk.ROWS, seed=len(lengths) + splits)
    o, m, l = map(np.asarray, mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz,
                                              num_splits=splits, interpret=interpret,
                                              variant=variant))
    ro, rm, rl = map(np.asarray, mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=splits))
    if (variant if isinstance(variant, mk.Options) else mk.VARIANTS[variant]).balance:
      merged = lambda o, m, l: decode.combine(np.swapaxes(o, -1, -2), m, l, mk.ROWS)  # splits cover other tokens
      e = test_base.relative_error(merged(o, m, l), merged(ro, rm, rl))
    else:
      e = max(test_base.relative_error(o, ro), test_base.relative_error(l, rl),
              float(np.abs(m - rm)[rl > 0].max(initial=0.0)))
    log(f"check {variant} lengths {lengths} splits {splits}: worst {e:.2e} {'OK' if e < 1e-2 else 'FAIL'}")
    worst = max(worst, e)
  return worst


def caches_for(b, ctx, key, scale_dtype=jnp.float16, fill=None, group=128, bits=2):
  """Enough random packed caches to rotate beyond L2, their bytes read at the lengths (ctx - 256 tokens,
  or fill x ctx), lengths."""
  c0 = random_packed(b, dk.SHAPE.k_heads, ctx, key, scale_dtype, group, bits)
  nbytes = sum(x.nbytes for x in c0)
  ns = dk.n_sets(nbytes)
  caches = (c0,) + tuple(random_packed(b, dk.SHAPE.k_heads, ctx, jax.random.fold_in(key, i), scale_dtype, group, bits)
                         for i in range(1, ns))
  n = ctx - 256 if fill is None else max(1, int(fill * ctx))
  return caches, nbytes * n / ctx, jnp.full((b,), n, jnp.int32)


def check_cache(log, interpret=False, variant="folded_lazy"):
  """`mosaic_decode.decode_attention` over a real KIVI-2 G=128 cache (prefill then appends: residual
  window, a flushed key group) against `kvjax.attention.decode_attention`: its relative error."""
  fmt = formats.preset("kivi2_g128")
  lengths = jnp.asarray([300, 0], jnp.int32)
  key = jax.random.PRNGKey(5)
  kv = lambda i, t: jax.random.normal(jax.random.fold_in(key, i), (2, 1, t, 128), jnp.float32)
  c = kvcache.prefill(kvcache.init_cache(fmt, 2, 1, 512, 128), kv(0, 300), kv(1, 300), lengths)
  for i in range(2):
    c = kvcache.append(c, kv(2 + 2 * i, 1), kv(3 + 2 * i, 1))
  q = jax.random.normal(jax.random.fold_in(key, 9), (2, 4, 1, 128), jnp.float32)
  out = np.asarray(mosaic_decode.decode_attention(q, c, num_splits=2, variant=variant, interpret=interpret))
  ref = np.asarray(attention.decode_attention(q, c))
  e = test_base.relative_error(out, ref)
  log(f"check cache {variant} lengths {np.asarray(c.lengths).tolist()}: {e:.2e} {'OK' if e < 1e-2 else 'FAIL'}")
  return e


def mosaic_row(b, caches, nb, lengths, splits, reps, key, interpret=False, stages=2, variant="exact"):
  q = jax.random.normal(jax.random.fold_in(key, 99), (b, dk.SHAPE.n_heads, 1, dk.SHAPE.head_dim), jnp.bfloat16)
  ns = len(caches)

  def step(x):
    q, cs = x
    for c in cs:
      q = dk.chain(q, attend(q, lengths, c, splits, interpret, stages, variant))
    return q, cs
  return dk.time_loop(step, (q, caches), max(1, dk.steps_for(nb / 2e6) // ns), reps) / ns


def profile(b, ctx, splits, variant, prof_dir, log):
  """One profiled call (Mosaic GPU's in-kernel profiler): mean cycles-as-ns per tile of each named
  region and of the whole program, from the trace it writes under prof_dir/variant."""
  d = os.path.join(prof_dir, variant)
  os.makedirs(d, exist_ok=True)
  caches, _, lengths = caches_for(b, ctx, jax.random.PRNGKey(1))
  q = jax.random.normal(jax.random.PRNGKey(2), (b, dk.SHAPE.n_heads, 1, dk.SHAPE.head_dim), jnp.bfloat16)
  tiles = ctx // mk.TILE // splits
  fn = jax.jit(lambda q, c: attend(q, lengths, c, splits, False, 2, variant, profile_dir=d,
                                   profile_space=16 * tiles + 64))
  jax.block_until_ready(fn(q, caches[0]))
  jax.effects_barrier()
  traces = sorted(glob.glob(os.path.join(d, "*.json")))
  if not traces:
    log(f"profile {variant}: no trace written")
    return {}
  with open(traces[-1]) as fh:
    events = json.load(fh)["traceEvents"]
  total, count, opened, span = collections.Counter(), collections.Counter(), {}, {}
  for e in events:
    k = (e["tid"], e["name"])
    if e["ph"] == "B":
      opened[k] = e["ts"]
    else:
      total[e["name"]] += e["ts"] - opened.pop(k)
      count[e["name"]] += 1
    lo, hi = span.get(e["tid"], (e["ts"], e["ts"]))
    span[e["tid"]] = (min(lo, e["ts"]), max(hi, e["ts"]))
  programs = len(span)
  out = {name: 1e3 * total[name] / count[name] for name in total}  # ns per region per tile
  out["program_ns_per_tile"] = 1e3 * sum(h - l for l, h in span.values()) / programs / tiles
  log(f"profile {variant} B={b} ctx={ctx} splits {splits}: ns per tile " +
      " ".join(f"{k} {v:.0f}" for k, v in out.items()))
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--points", default="8:32768,1:32768,8:4096", help="batch:context,...")
  ap.add_argument("--splits", default="4,8,16,32")
  ap.add_argument("--stages", default="2", help="pipeline depths (max_concurrent_steps) to time")
  ap.add_argument("--variants", default=",".join(mk.VARIANTS), help=f"of {mk.VARIANTS}")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--peers", default="triton,torch_sdpa", help="of triton (kvjax kivi2_g128), torch_sdpa")
  ap.add_argument("--no-check", action="store_true")
  ap.add_argument("--fill", type=float, default=None, help="lengths = fill x context (default: context - 256)")
  ap.add_argument("--scale-dtype", default="float16", choices=("float16", "bfloat16"),
                  help="of the timed caches' scales and zeros (kvjax caches hold bfloat16)")
  ap.add_argument("--stream-gb", type=float, default=1.0)
  ap.add_argument("--interpret", action="store_true", help="Mosaic GPU's CPU interpreter (smoke tests)")
  ap.add_argument("--profile", default="", help="B:ctx:splits: one profiled call per variant first (GPU)")
  ap.add_argument("--profile-dir", default="/tmp/mosaic_kivi_profile")
  ap.add_argument("--out", default="benchmarks/results/decode_parts/mosaic_kivi.json")
  args = ap.parse_args(argv)
  log = lambda s: print(s, flush=True)
  variants = [v for v in args.variants.split(",") if v]
  meta = {"device": str(jax.devices()[0]), "jax": jax.__version__}
  rows = []

  def save():  # after every row: a call that runs out of time keeps what it measured
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
      json.dump({"meta": meta, "rows": rows}, fh, indent=1)

  if not args.no_check:
    meta["check_worst_rel_err"] = max(check(log, args.interpret, variants),
                                      check_cache(log, args.interpret, variants[0]))
    if meta["check_worst_rel_err"] >= 1e-2:
      log("check failed: no timing")
      save()
      return meta
  if args.profile:
    pb, pctx, psplits = map(int, args.profile.split(":"))
    meta["profile"] = {"batch": pb, "context": pctx, "num_splits": psplits,
                       **{v: profile(pb, pctx, psplits, v, args.profile_dir, log) for v in variants}}
    save()
  stream = dk.stream_tbps(args.reps, args.stream_gb)
  meta["stream_tbps"] = stream
  log(f"stream {stream:.2f} TB/s")
  key = jax.random.PRNGKey(0)
  peers = [p for p in args.peers.split(",") if p]

  def add(impl, fmt, b, ctx, us, nb, options, label):
    rows.append(dict(impl=impl, format=fmt, batch=b, context=ctx, us=us, bytes_read=nb, tbps=nb / us / 1e6,
                     frac_roofline=nb / us / 1e6 / stream, options=options))
    log(f"{label:<30s} B={b:<3d} ctx={ctx:<6d} {us:9.1f} us {nb / us / 1e6:5.2f} TB/s")
    save()

  for p in filter(None, args.points.split(",")):
    b, ctx = map(int, p.split(":"))
    caches, nb, lengths = caches_for(b, ctx, key, jnp.dtype(args.scale_dtype), args.fill)
    for v, ns, st in itertools.product(variants, map(int, filter(None, args.splits.split(","))),
                                       map(int, filter(None, args.stages.split(",")))):
      if (ctx // mk.TILE) % ns or (ctx // mk.TILE // ns) % mk.VARIANTS[v].tiles_per_step:
        continue
      us = mosaic_row(b, caches, nb, lengths, ns, args.reps, key, args.interpret, st, v)
      add("kvjax_mosaic", "kivi2_g128", b, ctx, us, nb, {"num_splits": ns, "stages": st, "variant": v,
                                                         "scale_dtype": args.scale_dtype, "fill": args.fill},
          f"mosaic {v} splits {ns} stages {st} {args.scale_dtype}")
    del caches
    if "triton" in peers:
      for impl, us, nb_t in dk.kvjax_rows("kivi2_g128", b, ctx, args.reps, key, False):
        add(impl, "kivi2_g128", b, ctx, us, nb_t, {}, "triton kivi2")
    if "torch_sdpa" in peers and (r := dk.torch_row(b, ctx, args.reps)) is not None:
      add("torch_sdpa", "bf16", b, ctx, r[0], r[1], {}, "torch sdpa")
  save()
  return {"meta": meta, "rows": rows}


if __name__ == "__main__":
  main()
