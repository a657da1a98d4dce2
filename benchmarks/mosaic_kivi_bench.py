"""The experimental Mosaic GPU KIVI-2 kernel (`pallas_kernels.gpu.mosaic_kivi`) on a GPU: a check against
its jnp reference, then its time per decode call (split states + the XLA merge) against the Triton
kivi2_g128 kernel (`ops.decode_attention`) and torch SDPA bf16, same run, Llama-3-8B heads.

    python3 benchmarks/mosaic_kivi_bench.py --points 8:32768,1:32768,8:4096 --splits 4,8,16,32 \
        --out benchmarks/results/decode_parts/mosaic_kivi.json

Timing as `decode_kernels.py` (steps in one jitted fori_loop, each query from the previous output,
cache copies rotated beyond L2, median of --reps); the caches are random packed words (every uint16 is
eight valid codes) with random scales and zeros, filled to ctx - 256 tokens.
"""

from __future__ import annotations

import argparse
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
from pallas_kernels.gpu import decode, mosaic_kivi as mk  # noqa: E402


def random_packed(b, kh, s, key):
  """A packed KIVI-2 cache (the kernel's layout) of random words and scales."""
  k = jax.random.split(key, 6)
  words = lambda kk, shape: jax.random.bits(kk, shape, jnp.uint16)
  scale = lambda kk, shape: jax.random.uniform(kk, shape, jnp.float32, 0.05, 0.2).astype(jnp.float16)
  zero = lambda kk, shape: (0.2 * jax.random.normal(kk, shape)).astype(jnp.float16)
  g = s // mk.TILE
  return (words(k[0], (b, kh, s, 16)), scale(k[1], (b, kh, g, 128)), zero(k[2], (b, kh, g, 128)),
          words(k[3], (b, kh, g, 128, 16)), scale(k[4], (b, kh, s)), zero(k[5], (b, kh, s)))


def attend(q, lengths, cache, num_splits, interpret=False, stages=2):
  """q [B, N, 1, H] -> [B, N, 1, H]: scaled and transposed query, split states, XLA merge."""
  b, n, _, h = q.shape
  kh = cache[0].shape[1]
  rep = n // kh
  q_t = (q.astype(jnp.float32).reshape(b, kh, rep, h) * (h ** -0.5 * decode.LOG2E)).swapaxes(-1, -2)
  q_t = jnp.pad(q_t, ((0, 0), (0, 0), (0, 0), (0, mk.ROWS - rep)))
  o_t, m, l = mk.kivi2_states(q_t, lengths, *cache, num_splits=num_splits, interpret=interpret,
                              stages=stages)
  out = decode.combine(o_t.swapaxes(-1, -2), m, l, rep)  # [B, K, rep, H]
  return out.reshape(b, n, 1, h).astype(q.dtype)


def check(log, interpret=False):
  """Worst relative error of the GPU kernel against `reference_states` (ragged, empty, split past)."""
  worst = 0.0
  for lengths, splits in (((1024, 300), 2), ((0, 129), 4)):
    q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case(
        lengths, capacity=1024, rows=mk.ROWS, seed=len(lengths) + splits)
    o, m, l = map(np.asarray, mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz,
                                              num_splits=splits, interpret=interpret))
    ro, rm, rl = map(np.asarray, mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=splits))
    e = max(test_base.relative_error(o, ro), test_base.relative_error(l, rl),
            float(np.abs(m - rm)[rl > 0].max(initial=0.0)))
    log(f"check lengths {lengths} splits {splits}: worst {e:.2e} {'OK' if e < 1e-2 else 'FAIL'}")
    worst = max(worst, e)
  return worst


def mosaic_row(b, ctx, splits, reps, key, interpret=False, stages=2):
  length = ctx - 256
  c0 = random_packed(b, dk.SHAPE.k_heads, ctx, key)
  nbytes = sum(x.nbytes for x in c0)
  ns = dk.n_sets(nbytes)
  caches = (c0,) + tuple(random_packed(b, dk.SHAPE.k_heads, ctx, jax.random.fold_in(key, i)) for i in range(1, ns))
  q = jax.random.normal(jax.random.fold_in(key, 99), (b, dk.SHAPE.n_heads, 1, dk.SHAPE.head_dim), jnp.bfloat16)
  lengths = jnp.full((b,), length, jnp.int32)
  nb = nbytes * length / ctx

  def step(x):
    q, cs = x
    for c in cs:
      q = dk.chain(q, attend(q, lengths, c, splits, interpret, stages))
    return q, cs
  us = dk.time_loop(step, (q, caches), max(1, dk.steps_for(nb / 2e6) // ns), reps) / ns
  return us, nb


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--points", default="8:32768,1:32768,8:4096", help="batch:context,...")
  ap.add_argument("--splits", default="4,8,16,32")
  ap.add_argument("--stages", default="2", help="pipeline depths (max_concurrent_steps) to time")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--peers", default="triton,torch_sdpa", help="of triton (kvjax kivi2_g128), torch_sdpa")
  ap.add_argument("--no-check", action="store_true")
  ap.add_argument("--stream-gb", type=float, default=1.0)
  ap.add_argument("--interpret", action="store_true", help="Mosaic GPU's CPU interpreter (smoke tests)")
  ap.add_argument("--out", default="benchmarks/results/decode_parts/mosaic_kivi.json")
  args = ap.parse_args(argv)
  log = lambda s: print(s, flush=True)
  meta = {"device": str(jax.devices()[0]), "jax": jax.__version__}
  if not args.no_check:
    meta["check_worst_rel_err"] = check(log, args.interpret)
    if meta["check_worst_rel_err"] >= 1e-2:
      log("check failed: no timing")
      return meta
  stream = dk.stream_tbps(args.reps, args.stream_gb)
  meta["stream_tbps"] = stream
  log(f"stream {stream:.2f} TB/s")
  rows, key = [], jax.random.PRNGKey(0)
  peers = [p for p in args.peers.split(",") if p]
  for p in filter(None, args.points.split(",")):
    b, ctx = map(int, p.split(":"))
    for ns in map(int, filter(None, args.splits.split(","))):
      for st in map(int, filter(None, args.stages.split(","))):
        if (ctx // mk.TILE) % ns:
          continue
        us, nb = mosaic_row(b, ctx, ns, args.reps, key, args.interpret, st)
        rows.append(dict(impl="kvjax_mosaic", format="kivi2_g128", batch=b, context=ctx, us=us, bytes_read=nb,
                         tbps=nb / us / 1e6, frac_roofline=nb / us / 1e6 / stream,
                         options={"num_splits": ns, "stages": st}))
        log(f"mosaic kivi2  B={b:<3d} ctx={ctx:<6d} splits {ns:3d} stages {st} {us:9.1f} us "
            f"{nb / us / 1e6:5.2f} TB/s")
    if "triton" in peers:
      for impl, us, nb in dk.kvjax_rows("kivi2_g128", b, ctx, args.reps, key, False):
        rows.append(dict(impl=impl, format="kivi2_g128", batch=b, context=ctx, us=us, bytes_read=nb,
                         tbps=nb / us / 1e6, frac_roofline=nb / us / 1e6 / stream, options={}))
        log(f"triton kivi2  B={b:<3d} ctx={ctx:<6d}             {us:9.1f} us {nb / us / 1e6:5.2f} TB/s")
    if "torch_sdpa" in peers and (r := dk.torch_row(b, ctx, args.reps)) is not None:
      us, nb = r
      rows.append(dict(impl="torch_sdpa", format="bf16", batch=b, context=ctx, us=us, bytes_read=nb,
                       tbps=nb / us / 1e6, frac_roofline=nb / us / 1e6 / stream, options={}))
      log(f"torch sdpa    B={b:<3d} ctx={ctx:<6d}             {us:9.1f} us {nb / us / 1e6:5.2f} TB/s")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as fh:
    json.dump({"meta": meta, "rows": rows}, fh, indent=1)
  return {"meta": meta, "rows": rows}


if __name__ == "__main__":
  main()
