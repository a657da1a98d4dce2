"""The KIVI-2 key product of one 128-token tile, fp16 against e4m3 WGMMAs, alone (session 37).

"fp16" builds A as the kernel does (`Options(unpack="denorm")`: each word's plane masked as an fp16
subnormal, times its k column's scale plus its zero, one HFMA2 a pair of codes; 8 planes of k = 16, 16
WGMMAs over the tile's two m64 halves); "e4m3" reads the same words as bytes and masks each byte's 4 planes
as e4m3 codes (`pallas_kernels.gpu.mosaic_fp8_planes`: 4 planes of k = 32, 8 WGMMAs), the scales left to B
(the query times the scales, as a kernel would store it per tile) given; "e4m3_kb" builds that B each
iteration as a kernel would each tile (the query times the tile's bf16 scales, rounded to e4m3 hi + lo,
stored as 16-bit words, `mosaic_fp8_planes.e4m3_words`), then sums the hi and lo column blocks. Each program
loads its word tile from shared memory and runs the step `--iters` times; the time per step per SM is what
the tile's key half would cost on the tensor cores and in building A (and B).

    python3 benchmarks/fp8_products.py --out products.json [--programs 4] [--n 16]

`--check` first compares each build's product with the codes' (iters = 1; e4m3 accumulates in fewer bits
than f32, so only one product is compared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu import mosaic_fp8_planes as f8
from pallas_kernels.gpu import mosaic_planes as planes
from pallas_kernels.gpu.mosaic_common import _Transposed, store_kmajor, wgmma_sum

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wgmma_rate import median_seconds  # noqa: E402

ROWS, WORDS, K = 128, 16, 128  # a tile: 128 tokens x 16 words (8 two-bit planes) = 128 channels
KINDS = ("fp16", "e4m3", "e4m3_kb")
B_SCALE_LOG2 = -2  # e4m3_kb: B = q s 2^9 / f_p 2^this (below e4m3's 448 for |q| <= 1, s <= 2)


def b_shape(kind: str, n: int):
  """B as the kernel's input: fp16 [K, n]; e4m3 [n, K] (K-major, as 8-bit WGMMA needs); e4m3_kb: the query
  [K, 8] f32, B built from it and the scales each iteration (`mosaic_fp8_planes.e4m3_words`)."""
  return {"fp16": (K, n), "e4m3": (n, K), "e4m3_kb": (K, 8)}[kind]


def product_kernel(kind: str, n: int, grid: int, iters: int, lag: int | None = 1, interpret: bool = False):
  """f(words [ROWS, 16] uint16, scales [K] f16, zeros [K] f16, b) -> [grid, ROWS, n] f32."""
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  if kind == "fp16" and n < 16:
    raise ValueError(f"n must be >= 16 for kind 'fp16' (N = 8 needs a K-major B: `Options.narrow_mma`), got {n}")
  fp8 = kind != "fp16"
  kb = kind == "e4m3_kb"
  if kb and n != 16:
    raise ValueError(f"n must be 16 for kind 'e4m3_kb' (8 query columns, hi and lo), got {n}")
  code_tiles = (plgpu.TilingTransform((8, 16)), plgpu.SwizzleTransform(32))
  if fp8:
    b_tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(32))
  else:
    swz = plgpu.find_swizzle(n * 16, "rhs")
    b_tiles = (plgpu.TilingTransform((8, swz * 8 // 16)), plgpu.SwizzleTransform(swz))

  def body(w_g, s_g, z_g, b_g, o_g, w_s, s_s, z_s, b_s, *rest):
    *q_s, bar = rest
    if kb:  # b_s: the B operand as uint16 words [16, 64] and as e4m3 [16, 128] (one buffer, two views)
      b_words, b_s = b_s
    for src, dst in ((w_g, w_s), (s_g, s_s), (z_g, z_s), (b_g, q_s[0] if kb else b_s)):
      plgpu.copy_gmem_to_smem(src, dst, bar)
      plgpu.barrier_wait(bar)
    if kb:  # the query's channels w and 64 + w, [64, 8] each, for the whole program
      half = lambda ref, i: ref.at[pl.ds(64 * i, 64)]
      load = lambda ref, layout: ref[...] if interpret else plgpu.load(ref, (), layout=layout)
      q_lo, q_hi = (load(half(q_s[0], i), plgpu.Layout.WGMMA) for i in range(2))
      row = plgpu.Layout.WGMMA.reduce(1)

    def pairs():
      words = w_s[...] if interpret else plgpu.load(w_s, (), layout=plgpu.Layout.WGMMA)
      if fp8:
        by = f8.words_as_bytes(words, interpret=interpret)
        slab = lambda p: (_Transposed(b_s.at[:, pl.ds(32 * p, 32)]) if interpret
                          else b_s.at[:, pl.ds(32 * p, 32)].transpose((1, 0)))
        return [(lambda p=p: f8.fp8_plane(by, p, interpret=interpret), slab(p)) for p in range(f8.PLANES)]
      hi = planes.shr_pairs(words, planes.hi_shift(2), interpret)
      col = lambda ref, m: jnp.broadcast_to(ref[pl.ds(16 * m, 16)][None, :], (ROWS, 16))
      return [(lambda m=m: planes.plane_denorm(words, hi, m) * col(s_s, m) + col(z_s, m), b_s.at[pl.ds(16 * m, 16)])
              for m in range(8)]

    def it(_, acc):
      if not kb:
        return wgmma_sum(acc, pairs(), lag=lag, interpret=interpret)
      fac = f8.word_factors() * 2.0 ** B_SCALE_LOG2
      s_lo, s_hi = (load(half(s_s, i), row).astype(jnp.float32) * fac for i in range(2))
      words = f8.e4m3_words(q_lo * s_lo[:, None], q_hi * s_hi[:, None])  # [64, 16]
      store_kmajor(b_words, words, interpret=interpret)
      if interpret:  # the interpreter's two views are two buffers: the e4m3 one written from the words
        b_s[...] = lax.bitcast_convert_type(b_words[...], jnp.float8_e4m3fn).reshape(16, 128)
      plgpu.commit_smem()
      sc = wgmma_sum(jnp.zeros((ROWS, 16), jnp.float32), pairs(), lag=lag, interpret=interpret)
      return acc + (sc[:, :8] + sc[:, 8:]) * 2.0 ** -B_SCALE_LOG2
    o_g[lax.axis_index("p")] = lax.fori_loop(0, iters, it, jnp.zeros((ROWS, 8 if kb else n), jnp.float32))

  kw = {"interpret": plgpu.InterpretGPUParams()} if interpret else {}
  scale_dt = jnp.bfloat16 if kb else jnp.float16  # e4m3_kb: the cache's bf16 scales, as the kernel reads them
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((grid, ROWS, 8 if kb else n), jnp.float32), grid=(grid,),
      grid_names=("p",),
      scratch_types=[plgpu.SMEM((ROWS, WORDS), jnp.uint16, transforms=code_tiles), plgpu.SMEM((K,), scale_dt),
                     plgpu.SMEM((K,), scale_dt),
                     plgpu.RefUnion(plgpu.SMEM((n, K // 2), jnp.uint16, transforms=code_tiles),
                                    plgpu.SMEM((n, K), jnp.float8_e4m3fn, transforms=b_tiles)) if kb and not interpret
                     else (plgpu.SMEM((n, K // 2), jnp.uint16, transforms=code_tiles),
                           plgpu.SMEM((n, K), jnp.float8_e4m3fn, transforms=b_tiles)) if kb
                     else plgpu.SMEM((n, K) if fp8 else b_shape(kind, n), jnp.float8_e4m3fn if fp8 else jnp.float16,
                                     transforms=b_tiles),
                     *([plgpu.SMEM((K, 8), jnp.float32)] if kb else []),
                     plgpu.Barrier(num_arrivals=1)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      kernel_name=f"kvjax_product_{kind}_n{n}", **kw)


def codes_of(words):
  """[ROWS, 128] int: the code at fp16 k column 16 m + w (plane m of word w)."""
  w = np.asarray(words).astype(np.int64)
  return np.concatenate([(w >> (2 * m)) & 3 for m in range(8)], axis=1)


def inputs(kind: str, n: int, key):
  """Random words, fp16 scales / zeros (as the fp16 build's per-k-column factors) and B."""
  kw, ks, kz, kb = jax.random.split(key, 4)
  words = jax.random.randint(kw, (ROWS, WORDS), 0, 1 << 16, jnp.int32).astype(jnp.uint16)
  sdt = jnp.bfloat16 if kind == "e4m3_kb" else jnp.float16
  s = jax.random.uniform(ks, (K,), jnp.float32, 0.5, 2).astype(sdt)
  z = jax.random.uniform(kz, (K,), jnp.float32, -1, 1).astype(sdt)
  if kind == "e4m3_kb":  # the query [channels, 8] (4 live columns)
    return words, s, z, jax.random.uniform(kb, (K, 8), jnp.float32, -1, 1).at[:, 4:].set(0.0)
  b = jax.random.uniform(kb, b_shape(kind, n), jnp.float32, -1, 1).astype(
      jnp.float8_e4m3fn if kind == "e4m3" else jnp.float16)
  return words, s, z, b


def reference(kind, words, s, z, b):
  """One product from the codes: fp16 (c 4^j 2^-24 s + z per k column) . B; e4m3 (c f_p 2^-9) . B, B's row
  32 p + k meeting the code at fp16 k column `plane_k_index(p)[k]`."""
  c = codes_of(words).astype(np.float64)
  bf = np.asarray(b.astype(jnp.float32), np.float64)
  if kind == "fp16":
    j = np.array([m if m < 5 else m - 5 for m in range(8)]).repeat(16)  # the plane's field in its source
    a = c * 4.0 ** j * 2.0 ** -24 * np.asarray(s, np.float64) + np.asarray(z, np.float64)
    return a @ bf
  if kind == "e4m3_kb":  # the keys' logits without the zeros' term: sum_c code s_c q_c
    return (c * np.asarray(s.astype(jnp.float32), np.float64)) @ bf
  idx = np.concatenate([f8.plane_k_index(p) for p in range(f8.PLANES)])
  fac = np.repeat(np.array(f8.PLANE_FACTORS, np.float64), 32) * 2.0 ** f8.A_SCALE_LOG2
  return (c[:, idx] * fac) @ bf.T


def check(kind, n, interpret=False):
  """Max |product - reference| / max |reference| of one product (one program, iters = 1)."""
  words, s, z, b = inputs(kind, n, jax.random.PRNGKey(5))
  got = np.asarray(product_kernel(kind, n, 1, 1, interpret=interpret)(words, s, z, b))[0]
  ref = reference(kind, words, s, z, b)
  return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=16)
  ap.add_argument("--programs", default="4,1", help="programs per SM, comma-separated")
  ap.add_argument("--iters", type=int, default=2048)
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--check", action="store_true")
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  dev = jax.devices()[0]
  rows = []
  for kind in KINDS if args.n >= 16 else ("e4m3",):
    err = check(kind, args.n) if args.check else None
    words, s, z, b = inputs(kind, args.n, jax.random.PRNGKey(0))
    for p in map(int, args.programs.split(",")):
      grid = dev.core_count * p
      f = jax.jit(product_kernel(kind, args.n, grid, args.iters))
      ns = median_seconds(f, (words, s, z, b), args.reps) / (args.iters * p) * 1e9
      rows.append({"kind": kind, "n": args.n, "programs_per_sm": p, "iters": args.iters,
                   "ns_per_product_per_sm": round(ns, 3), "check_rel_err": err, "device_kind": dev.device_kind})
      print(json.dumps(rows[-1]), flush=True)
  with open(args.out, "w") as fh:
    json.dump(rows, fh, indent=1)
  return rows


if __name__ == "__main__":
  main()
