"""FP8 (e4m3 / e5m2, one scale per token) decode on Mosaic GPU (Pallas `plgpu`), the codes upcast to fp16 as
WGMMA's register A operand: `fp8_states` (per-split states, merged in XLA) and `fp8_attention` (the query's prep
and the merge in the kernel, `mosaic_epilogue`; session 20, not yet run on a device). Timed on the H200 in
session 19 (`benchmarks/NOTES_gpu.md`): at parity with the Triton FP8 kernel, so `ops` takes it only when asked
(``mosaic_fp8=True``). B=8 32k through ops: 148.1 us over 64-token value tiles, 138.6 over 128-token tiles,
against Triton's 138.7-140.5 and torch SDPA's 244.4; B=8 128k 555.8 / 515.5 against 516.3-544.4.

Why: the Triton FP8 kernel is 129.5 us alone at B=8 32k (0.935 of the stream, session 10's profile) and
the call 142.4 (1.72x torch SDPA; its merge kernel 2.6 us): 1.85x needs ~132.7 through `ops`, so a kernel
nearer the stream (session 18's first build, the codes in [8, 16]-byte TMA tiles, ran 271 us: now swizzled
whole rows, `Fp8Options.swizzle`). This is the Mosaic KIVI-2 kernel's structure for FP8 (TMA-filled pipeline, few
instructions per byte): one warpgroup per (sequence, KV head, split), the transposed problem with tokens on
WGMMA's M axis,

  S^T [128 tok, N] = K [128 tok, H] . q^T [H, N]          (then x the keys' per-token scale, per row)
  O^T [H, N]      += V^T [H, 128 tok] . (p * s_v)^T [128 tok, N]

with K and V^T read from TMA-filled shared memory, loaded whole and converted e4m3 / e5m2 -> fp16 a
16-column slab at a time (one cvt per pair of codes) right before each WGMMA; q and p * s_v are the fp16 B
operands, as in the Triton kernels (fp16 logits, not the 8-bit dots those kernels measured slower; p s_v
times a power of two near the FP8 maximum, `VALUE_FOLD`, out of fp16's subnormals). The cache's layouts as
stored: keys [B, K, S, H] (token rows, the A operand's K-major rows), values in tiles of `value_tile`
tokens each stored as its [H, T] transpose (`kvjax.cache.VALUE_TILE`, the GPU default), scales [B, K, S].
The splits share the live steps as `mosaic_kivi`'s balanced presets do (`mosaic_decode`'s rule).
Per 128-token step (32 KB of codes) a thread converts 256 codes and issues 32 WGMMAs: 719 SASS instructions
(657 with `key_perm`), ~22 per KB against the KIVI-2 kernel's 96 (`benchmarks/mosaic_sass.py --kernel fp8`,
compiled for an H200 on the CPU).

Gemma 2 (session 32): head_dim 256 (the key tile loaded 128 channels at a time, one [128, N] value accumulator
per 128 channels), its logit soft-cap (on the log2-domain logits, `mosaic_common.soft_capped`) and sliding
window (the splits share the steps from the first visible token, `balanced_range(start=...)`). At head_dim 256
a 64-token step (`default_options`) keeps two programs per SM: 684 loop SASS instructions per 32 KB of codes,
123 registers, 78 KB of shared memory (a 128-token step: 1163, 214, 144 KB, one program).

INT8 caches (symmetric codes, per-token scales: the same layout) run the same kernel, the codes converted exactly
to fp16 by three instructions a pair (`mosaic_registers.int8_as_f16`; session 32: 1102 loop instructions a
128-token tile, 912 with key_perm, against 1485 through Mosaic's `astype` and FP8's 719 / 657;
`decode_parts/session32/sass_int8.json`). Timed in session 34 (H100): Gemma-2 heads B=24 32k 572.1 us against
Triton's INT8 kernel's 703.3, so `ops` sends INT8 caches here by FP8's rule (head_dim 256 from 16k tokens).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kvjax.formats import FP8Spec, IntSpec
from pallas_kernels.gpu import decode, mosaic_decode, mosaic_epilogue as epilogue, mosaic_kivi as mk
from pallas_kernels.gpu import mosaic_pipeline as pipeline
from pallas_kernels.gpu.mosaic_common import balanced_range, soft_capped, softmax_columns, wgmma_sum, widened
from pallas_kernels.gpu.mosaic_options import Fp8Options
from pallas_kernels.gpu.mosaic_registers import INT8_PRMT, KEY_PERM, SLAB, as_wgmma, int8_as_f16

__all__ = ["TILE", "ROWS", "HEAD_DIMS", "Fp8Options", "default_options", "fp8_states", "reference_states", "supports",
           "decode_attention", "splits_for", "TARGET_PROGRAMS", "split_e4m3", "fp8_attention", "KEY_PERM", "INT8_PRMT"]

TILE = 128          # tokens per pipeline step by default (`Fp8Options.tile`); capacities are multiples of it
ROWS = mk.ROWS      # query rows (WGMMA's N), padded
HEAD_DIMS = (128, 256)  # 256: Gemma-2's; the value accumulators and key loads are 128 channels each
HALF = 128          # channels per value accumulator (WGMMA M = 128) and per key load
FP8_TYPES = (jnp.float8_e4m3fn, jnp.float8_e5m2)
CODE_TYPES = (*FP8_TYPES, jnp.int8)  # INT8 (symmetric, per-token scales): the same kernel, codes converted exactly
NEG = mk.NEG
# p x s_v is stored fp16 times this power of two near the values' FP8 maximum (448 / 57344): a per-token
# scale is |v|max / that maximum (~1e-5 for e5m2), so p s_v alone would sit in fp16's subnormals (the
# Triton kernels fold the maximum likewise, `decode.FlatPlan.value_c`); o is divided by it at the end (exact).
VALUE_FOLD = {jnp.dtype(jnp.float8_e4m3fn): 2.0 ** 8, jnp.dtype(jnp.float8_e5m2): 2.0 ** 15,
              jnp.dtype(jnp.int8): 2.0 ** 7}


def split_e4m3(q_t, terms: int):
  """q_t [B, K, H, N] f32 -> (terms [B, K, terms, N, H] float8_e4m3fn, inverse scale [B, K] f32): the
  queries transposed back (K-major, as an 8-bit WGMMA B operand must be), times a power of two per (b, k)
  that puts their largest magnitude in [128, 256) (e4m3's largest is 448), as a sum of `terms` e4m3 values
  each rounding what the earlier ones left; q = inverse x sum(terms)."""
  top = jnp.max(jnp.abs(q_t), axis=(2, 3))
  e = jnp.where(top > 0, jnp.floor(jnp.log2(jnp.where(top > 0, top, 1.0))), 0.0)
  y = jnp.swapaxes(q_t, -1, -2) * jnp.exp2(7.0 - e)[:, :, None, None]
  out = []
  for _ in range(terms):
    x = y.astype(jnp.float8_e4m3fn)
    out.append(x)
    y = y - x.astype(jnp.float32)
  return jnp.stack(out, axis=2), jnp.exp2(e - 7.0)


def fp8_states(q_t, lengths, k, ks, v, vs, *, num_splits: int, value_tile: int = 64, num_queries: int = 1,
               interpret: bool = False, options: Fp8Options = Fp8Options(), softcap: float | None = None,
               sliding: int | None = None, live_rows: int = ROWS):
  """Per-split flash-decoding states of FP8 attention with per-token scales.

  q_t [B, K, H, 16] f32 (queries transposed, times softmax scale x log2 e, rows padded to 16; row r is
  query token r % num_queries, at position L - num_queries + r % num_queries: causal among them);
  lengths [B] int32; k [B, K, S, H] float8_e4m3fn / float8_e5m2 / int8 (INT8 caches, converted exactly to
  fp16); ks [B, K, S] (bf16, fp16 or f32); v [B, K, S, H] of those dtypes with each `value_tile`-token tile
  stored as its [H, value_tile] transpose (as the cache's tiled value layout); vs [B, K, S]. H = 128 or 256.
  softcap: None, or the logits' soft-cap (`cap tanh(s / cap)` of the natural-log logits, Gemma 2); sliding: None,
  or a window W (query row r sees the tokens after its position minus W; the splits share the steps from the
  first token any row sees). live_rows: the rows that hold queries (the rest padding); at most 8 with
  `Fp8Options.narrow_softmax`, the softmax runs over 8 columns and the other rows' states are no token's (m = NEG,
  l = 0, o = 0). Returns (o_t [B, K, NS, H, 16], m, l [B, K, NS, 16]) in f32, m and l in the log2
  domain (`decode.combine` merges them)."""
  b, kh, h, n = q_t.shape
  if h not in HEAD_DIMS or n != ROWS:
    raise ValueError(f"q_t must be [B, K, H, {ROWS}] with H in {HEAD_DIMS}, got {q_t.shape}")
  return _run(q_t, None, lengths, k, ks, v, vs, num_splits=num_splits, value_tile=value_tile,
              num_queries=num_queries, interpret=interpret, options=options, softcap=softcap, sliding=sliding,
              live_rows=live_rows)


def fp8_attention(q, scale, lengths, k, ks, v, vs, *, num_splits: int, value_tile: int = 64,
                  num_queries: int = 1, interpret: bool = False, options: Fp8Options = Fp8Options(),
                  softcap: float | None = None, sliding: int | None = None):
  """FP8 attention with the query's prep and the split merge inside the kernel (`mosaic_epilogue`).

  q [B, K, rows, H] (any float dtype; row r is query token r % num_queries, as `fp8_states`' columns);
  scale: f32 scalar (softmax scale x log2 e); the cache arrays as `fp8_states`. num_splits: 1, or at
  most `mosaic_epilogue.CLUSTER_MAX` (merged as `options.merge` says; "count" natively only). Needs key_terms=0
  and H = 128 (the epilogue's one accumulator). softcap, sliding: as `fp8_states`. Returns [B, K, rows, H] in
  q's dtype (zero for a row that saw no token)."""
  b, kh, rows, h = q.shape
  if h != 128 or not 1 <= rows <= ROWS:
    raise ValueError(f"q must be [B, K, rows <= {ROWS}, 128], got {q.shape}")
  if not (num_splits == 1 or epilogue.cluster_merge_ok(num_splits)):
    raise ValueError(f"num_splits must be 1..{epilogue.CLUSTER_MAX} to merge in the kernel, got {num_splits}")
  if options.key_terms:
    raise ValueError(f"the in-kernel query prep makes fp16 queries: key_terms must be 0, got {options.key_terms}")
  if interpret and num_splits > 1 and options.merge == "count":
    raise ValueError("merge='count' runs natively only (Mosaic GPU's interpreter has no global semaphores): "
                     f"got interpret=True with num_splits={num_splits}")
  if options.key_perm:
    q = q[..., jnp.array(_perm(h))]
  return _run(q, jnp.reshape(jnp.asarray(scale, jnp.float32), (1,)), lengths, k, ks, v, vs,
              num_splits=num_splits, value_tile=value_tile, num_queries=num_queries, interpret=interpret,
              options=options, softcap=softcap, sliding=sliding, live_rows=rows)


def _perm(h):
  return [SLAB * (c // SLAB) + KEY_PERM[c % SLAB] for c in range(h)]


def _run(q_in, scale, lengths, k, ks, v, vs, *, num_splits, value_tile, num_queries, interpret, options, softcap,
         sliding, live_rows):
  """The kernel: states of q_in = q_t (scale None), or merged attention of q_in = q rows x scale."""
  merged = scale is not None
  b, kh = q_in.shape[:2]
  h, s = q_in.shape[3 if merged else 2], k.shape[2]
  opt = options
  tile = opt.tile
  if value_tile not in (16, 32, 64, 128) or tile % value_tile:
    raise ValueError(f"value_tile must be 16, 32, 64 or 128 and divide the {tile}-token step, got {value_tile}")
  if num_splits < 1 or s % tile:
    raise ValueError(f"the capacity {s} must be a multiple of {tile} and num_splits >= 1, got {num_splits}")
  if not 1 <= num_queries <= ROWS:
    raise ValueError(f"num_queries must be in [1, {ROWS}], got {num_queries}")
  narrow, width = softmax_columns(live_rows, ROWS, opt.narrow_softmax)  # the softmax's columns
  if opt.key_terms and h != HALF:
    raise ValueError(f"key_terms (8-bit key products) take head_dim {HALF}, got {h}")
  if softcap is not None and not softcap > 0:
    raise ValueError(f"softcap must be None or positive, got {softcap!r}")
  if sliding is not None and (int(sliding) != sliding or sliding < 1):
    raise ValueError(f"sliding must be None or a positive integer, got {sliding!r}")
  vh = h // HALF  # value accumulators (and key loads) of 128 channels
  for name, arr, shape in (("k", k, (b, kh, s, h)), ("v", v, (b, kh, s, h)), ("ks", ks, (b, kh, s)),
                           ("vs", vs, (b, kh, s)), ("lengths", lengths, (b,))):
    if arr.shape != shape:
      raise ValueError(f"{name} must be {shape}, got {arr.shape}")
  for name, arr in (("k", k), ("v", v)):
    if arr.dtype not in CODE_TYPES:
      raise ValueError(f"{name} must be float8_e4m3fn, float8_e5m2 or int8, got {arr.dtype}")
  if opt.key_terms and k.dtype == jnp.int8:
    raise ValueError("key_terms (8-bit key products against e4m3 query terms) take FP8 keys, got int8")
  steps_cap = s // tile
  vt_per_step = tile // value_tile
  fold = VALUE_FOLD[jnp.dtype(v.dtype)]
  swz = plgpu.find_swizzle(ROWS * 16, "rhs")
  b_tiles = (plgpu.TilingTransform((8, swz * 8 // 16)), plgpu.SwizzleTransform(swz))
  code_tiles = (plgpu.TilingTransform((8, SLAB)),)  # 8-bit [rows, 16]: a slab is whole tiles
  wide_tiles = (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))  # 8-bit [rows, 128]: WGMMA's smem A / B
  key_tiles = wide_tiles if (opt.key_terms or opt.swizzle) else code_tiles
  value_tiles = ((plgpu.TilingTransform((8, value_tile)), plgpu.SwizzleTransform(value_tile))
                 if opt.swizzle and value_tile >= 32 else code_tiles)
  nt = opt.key_terms
  if nt:
    q8, q_inv = split_e4m3(q_in, nt)
    q8 = q8.reshape(b, kh, nt * ROWS, h)
  mma = functools.partial(wgmma_sum, lag=opt.lag, interpret=interpret)

  def to_f16(x, layout):
    """8-bit codes in registers as fp16: FP8 by `astype` (one cvt a pair), int8 natively by `int8_as_f16`."""
    if interpret or x.dtype != jnp.int8 or not opt.int8_prmt:
      return x.astype(jnp.float16)
    return int8_as_f16(x, layout)

  def slab(ref):
    """A [rows, 16] FP8 slab of shared memory as fp16 in WGMMA's A layout."""
    x = ref[...] if interpret else plgpu.load(ref, layout=plgpu.Layout.WGMMA, optimized=False)
    return to_f16(x, plgpu.Layout.WGMMA)

  load_layout = plgpu.Layout.WGMMA_UPCAST_2X if opt.upcast_layout else plgpu.Layout.WGMMA

  def slabs(ref, count, swizzled, is_key=False):
    """The [rows, 16 x count] FP8 ref as `count` thunks of fp16 [rows, 16] A operands: a swizzled ref is
    loaded whole on the first (its tiles are whole rows; a slab is no slice of them) and sliced in registers."""
    if not swizzled:
      return [functools.partial(lambda m: slab(ref.at[:, pl.ds(SLAB * m, SLAB)]), m) for m in range(count)]
    held = []
    renamed = opt.key_perm and is_key
    layout = plgpu.Layout.WGMMA_8BIT if renamed else load_layout

    def one(m):
      if not held:
        held.append(ref[...] if interpret else plgpu.load(ref, layout=layout, optimized=False))
      x = to_f16(held[0][:, SLAB * m:SLAB * (m + 1)], layout)
      if interpret:  # the same arithmetic: key_perm's columns in KEY_PERM order (byte 4c + 2h + i is 8h + 2c + i)
        return x.reshape(-1, 4, 2, 2).transpose(0, 2, 1, 3).reshape(-1, SLAB) if renamed else x
      if renamed:
        return as_wgmma(x)
      return plgpu.layout_cast(x, plgpu.Layout.WGMMA) if opt.upcast_layout else x
    return [functools.partial(one, m) for m in range(count)]

  split_merge = merged and num_splits > 1  # states through global memory, merged in the kernel

  def body(q_g, inv_g, len_g, k_g, v_g, ks_g, vs_g, *refs):
    n_out = (4 if split_merge else 1) if merged else 3
    outs, (q_smem, pt_smem, bar, *sync) = refs[:n_out], refs[n_out:]
    bi, ki, si = lax.axis_index("b"), lax.axis_index("k"), lax.axis_index("s")
    if merged:  # the caller's rows, scaled, transposed and padded here
      epilogue.load_query_t(q_g.at[bi, ki], inv_g[0], q_smem, bar, interpret=interpret)
      key_scale = None
    elif nt:  # the e4m3 terms [nt x N, H] as they are; q_smem holds them
      plgpu.copy_gmem_to_smem(q_g.at[bi, ki], q_smem, bar)
      plgpu.barrier_wait(bar)
      key_scale = inv_g[bi, ki]
    else:
      def load_q(q32_smem):  # f32, scoped: its 8 KB are the pipeline's once q_smem holds the fp16 query
        plgpu.copy_gmem_to_smem(q_g.at[bi, ki], q32_smem, bar)
        plgpu.barrier_wait(bar)
        q_smem[...] = q32_smem[...].astype(jnp.float16)
        plgpu.commit_smem()
      pl.run_scoped(load_q, plgpu.SMEM((h, ROWS), jnp.float32))
      key_scale = None
    length = len_g[bi]
    lo0 = None if sliding is None else length - num_queries - sliding  # row r sees tokens > lo0 + r % T
    first, steps = balanced_range(length, si, num_splits=num_splits, tile=tile, capacity_steps=steps_cap,
                                  min_share=opt.min_share,
                                  start=None if lo0 is None else lax.div(jnp.maximum(lo0 + 1, 0), tile))
    col = lax.broadcasted_iota(jnp.int32, (tile, width), 1)
    qpos = length - num_queries + col % num_queries  # each query row's position (causal)
    lo = None if lo0 is None else lo0 + col % num_queries

    def step(idx, k_s, v_s, ks_s, vs_s, carry):
      o, m_prev, l_prev = carry
      with jax.named_scope("kmma"):
        if nt:  # the tile as the 8-bit A operand in shared memory, one product per query term, each in
          # an accumulator of its own (Hopper's FP8 MMAs accumulate with ~14 bits: the small terms would be
          # lost in the first's), summed in f32
          rows_j = lambda j: pl.ds(ROWS * j, ROWS)
          term = lambda j: (q_smem[rows_j(j)].T if interpret  # [H, N], K-major
                            else q_smem.at[rows_j(j)].transpose((1, 0)))
          sc = functools.reduce(jnp.add, [mma(jnp.zeros((tile, ROWS), jnp.float32), [(lambda: k_s, term(j))])
                                          for j in range(nt)])
        else:  # each 128 channels loaded whole (swizzled), as their 8 slabs are needed
          chunk = lambda u: k_s if vh == 1 else k_s.at[:, pl.ds(HALF * u, HALF)]
          a_ops = [a for u in range(vh)
                   for a in slabs(chunk(u), HALF // SLAB, key_tiles is wide_tiles, is_key=True)]
          sc = mma(jnp.zeros((tile, ROWS), jnp.float32),
                   list(zip(a_ops, [q_smem.at[pl.ds(SLAB * m, SLAB)] for m in range(h // SLAB)])))
      with jax.named_scope("softmax"):
        if narrow:  # the rows past NARROW_ROWS hold no query: their probabilities stay 0
          sc = sc[:, :width]
        kscale = ks_s[...].astype(jnp.float32)
        sc = sc * (kscale if key_scale is None else kscale * key_scale)[:, None]
        if softcap is not None:
          sc = soft_capped(sc, softcap)
        tok = (first + idx[0]) * tile + lax.broadcasted_iota(jnp.int32, (tile, width), 0)
        ok = tok <= qpos if lo is None else (tok <= qpos) & (tok > lo)
        sc = jnp.where(ok, sc, NEG)
        m_new = jnp.maximum(m_prev, jnp.max(sc, axis=0))
        alpha = jnp.exp2(m_prev - m_new)
        p = jnp.where(ok, jnp.exp2(sc - m_new[None, :]), 0.0)
        l_new = l_prev * alpha[None, :] + p if opt.lazy_sums else l_prev * alpha + jnp.sum(p, axis=0)
      with jax.named_scope("vprep"):
        pv = p * (vs_s[...].astype(jnp.float32) * fold)[:, None]
        pt_smem[...] = (widened(pv, 0.0) if narrow else pv).astype(jnp.float16)
        plgpu.commit_smem()
      with jax.named_scope("vmma"):  # o: one [128, N] accumulator per 128 channels (M = 128 A operands)
        per = value_tile // SLAB
        b_ops = [pt_smem.at[pl.ds(SLAB * j, SLAB)] for j in range(tile // SLAB)]
        o_alpha = widened(alpha, 1.0) if narrow else alpha
        o = tuple(mma(o_u * o_alpha[None, :], list(zip(
            [a for t in range(vt_per_step)
             for a in slabs(v_s.at[pl.ds(t * h + HALF * u, HALF)], per, value_tiles is not code_tiles)], b_ops)))
            for u, o_u in enumerate(o))
      if opt.manual_barriers:  # every thread is done with this slot before the pipeline refetches into it
        plgpu.commit_smem()
      return o, m_new, l_new

    l_shape = (tile, width) if opt.lazy_sums else (width,)
    init = ((jnp.zeros((HALF, ROWS), jnp.float32),) * vh, jnp.full((width,), NEG, jnp.float32),
            jnp.zeros(l_shape, jnp.float32))
    pipe = pipeline.emit(
        step, steps=steps, stages=opt.stages, init_carry=init, warp_fetch=opt.warp_fetch, interpret=interpret,
        in_specs=[plgpu.BlockSpec((tile, h), lambda t: (first + t, 0), transforms=key_tiles),
                  plgpu.BlockSpec((vt_per_step * h, value_tile), lambda t: (first + t, 0), transforms=value_tiles),
                  plgpu.BlockSpec((tile,), lambda t: (first + t,)),
                  plgpu.BlockSpec((tile,), lambda t: (first + t,))])
    o, m_f, l_f = pipe(k_g.at[bi, ki], v_g.at[bi, ki], ks_g.at[bi, ki], vs_g.at[bi, ki])
    o = tuple(o_u * (1.0 / fold) for o_u in o)
    l_f = jnp.sum(l_f, axis=0) if opt.lazy_sums else l_f
    if narrow:  # the rows past NARROW_ROWS: no token's state
      m_f, l_f = widened(m_f, NEG), widened(l_f, 0.0)
    if split_merge:
      epilogue.merge_states(o[0], m_f, l_f, outs[:3], outs[3], sync, epilogue.merge_counters(opt.merge, b, kh),
                            merge_by=opt.merge, num_splits=num_splits, interpret=interpret)
    elif merged:  # one split: normalized here
      (out_g,) = outs
      pl.run_scoped(lambda out_smem: epilogue.store_rows(epilogue.normalize(o[0], l_f), out_g.at[bi, ki], out_smem,
                                                         interpret=interpret),
                    plgpu.SMEM((ROWS, h), out_g.dtype))
    else:
      o_g, m_g, l_g = outs
      for u, o_u in enumerate(o):
        o_g[bi, ki, si, pl.ds(HALF * u, HALF)] = o_u
      m_g[bi, ki, si] = m_f
      l_g[bi, ki, si] = l_f

  kw = {"interpret": plgpu.InterpretGPUParams()} if interpret else {}
  state_types = (jax.ShapeDtypeStruct((b, kh, num_splits, h, ROWS), jnp.float32),
                 jax.ShapeDtypeStruct((b, kh, num_splits, ROWS), jnp.float32),
                 jax.ShapeDtypeStruct((b, kh, num_splits, ROWS), jnp.float32))
  if merged:
    out_type = (*(state_types if split_merge else ()), jax.ShapeDtypeStruct(q_in.shape, q_in.dtype))
  else:
    out_type = state_types
  mesh = epilogue.merge_mesh(b, kh, num_splits, opt.merge if split_merge else None)
  f = plgpu.kernel(
      body,
      out_type=out_type,
      scratch_types=[plgpu.SMEM((nt * ROWS, h), jnp.float8_e4m3fn, transforms=wide_tiles) if nt else
                     plgpu.SMEM((h, ROWS), jnp.float16, transforms=b_tiles),
                     plgpu.SMEM((tile, ROWS), jnp.float16, transforms=b_tiles),
                     plgpu.Barrier(num_arrivals=1),
                     *(epilogue.merge_scratch(opt.merge) if split_merge else ())],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
                                           approx_math=opt.approx_math,
                                           unsafe_no_auto_barriers=opt.manual_barriers),
      kernel_name="kvjax_mosaic_fp8", **mesh, **kw)
  v_rows = v.reshape(b, kh, s // value_tile * h, value_tile)  # each tile's bytes as its [H, T] rows: free
  if merged:  # q rows as they are (key_perm: permuted by `fp8_attention`), the scale
    q8, q_inv = q_in, scale
  elif not nt:
    q8, q_inv = (q_in[:, :, jnp.array(_perm(h))] if opt.key_perm else q_in), jnp.ones((b, kh), jnp.float32)
  res = f(q8, q_inv, lengths, k, v_rows, ks, vs)
  return res[-1] if merged else res


@functools.partial(jax.jit, static_argnames=("num_splits", "value_tile", "num_queries", "softcap", "sliding"))
def reference_states(q_t, lengths, k, ks, v, vs, *, num_splits: int, value_tile: int = 64, num_queries: int = 1,
                     softcap: float | None = None, sliding: int | None = None):
  """jnp reference of `fp8_states` in f32 (v in the tiled layout, as the kernel takes it), each split a
  fixed slice of S / num_splits tokens: merged (`decode.combine`), equal to the kernel's balanced states."""
  f32 = lambda x: x.astype(jnp.float32)
  b, kh, s, h = k.shape
  vf = v.reshape(b, kh, s // value_tile, h, value_tile).swapaxes(-1, -2).reshape(b, kh, s, h)
  kf, vf = f32(k) * f32(ks)[..., None], f32(vf) * f32(vs)[..., None]
  sc = jnp.einsum("bksh,bkhn->bksn", kf, f32(q_t))
  if softcap is not None:  # log2-domain logits: cap log2(e) tanh(sc / (cap log2(e)))
    sc = softcap * decode.LOG2E * jnp.tanh(sc / (softcap * decode.LOG2E))
  qpos = lengths[:, None] - num_queries + jnp.arange(ROWS)[None, :] % num_queries  # [B, N]
  tok = jnp.arange(s)[None, :, None]
  ok = tok <= qpos[:, None, :]
  if sliding is not None:
    ok &= tok > qpos[:, None, :] - sliding
  ok = ok[:, None]  # [B, 1, S, N]
  sc = jnp.where(ok, sc, NEG).reshape(b, kh, num_splits, s // num_splits, -1)
  m = jnp.max(sc, axis=3)
  p = jnp.where(ok.reshape(b, 1, num_splits, -1, ROWS), jnp.exp2(sc - m[:, :, :, None]), 0.0)
  o = jnp.einsum("bkjsh,bkjsn->bkjhn", vf.reshape(b, kh, num_splits, s // num_splits, h), p)
  return o, m, jnp.sum(p, axis=3)


# Programs to aim for (`splits_for`): the kernel holds 2 programs per SM (shared memory: 2 stages of 32 KB
# codes); one wave of them on an H200. Session 19 through ops: B=8 32k, the default's 4 splits 148.1 us, 8
# splits 151.5; B=8 128k 555.8 / 580.7; B=64 4k, 1 split 146.5, 8 splits 172.6.
TARGET_PROGRAMS = 2 * 132


def splits_for(batch: int, kv_heads: int, capacity: int) -> int:
  """`mosaic_decode.default_splits` over the capacity's 128-token tiles with TARGET_PROGRAMS, the splits not
  dividing the tiles (they share the live steps, `balanced_range`)."""
  return mosaic_decode.default_splits(batch, kv_heads, capacity // TILE, target=TARGET_PROGRAMS, divides=False,
                                     large_batch=False)


def default_options(head_dim: int) -> Fp8Options:
  """The build `decode_attention` takes when given none: 128-token steps at head_dim 128; 64-token steps at 256,
  where a 128-token step's 2 stages take 144 KB of shared memory (one program per SM; 64-token steps 78 KB,
  two), compiled for an H200 on the CPU (`decode_parts/session32/sass_fp8_gemma.json`)."""
  return Fp8Options(tile=64) if head_dim == 256 else Fp8Options()


def supports(cache) -> str | None:
  """None when `decode_attention` takes this cache, else why not."""
  fmt = cache.fmt
  for role, spec in (("key", fmt.key), ("value", fmt.value)):
    if not (isinstance(spec, FP8Spec) and not spec.static or isinstance(spec, IntSpec) and spec.bits == 8):
      return f"{role}s must be FP8 with per-token scales or INT8, got {spec}"
  if fmt.sink:
    return f"full-precision sink tokens are not read by this kernel (sink={fmt.sink})"
  if cache.v.tile not in (16, 32, 64, 128):
    return f"values must be stored in tiles of 16-128 tokens (`init_cache(value_tile=...)`), got {cache.v.tile}"
  if cache.head_dim not in HEAD_DIMS or cache.capacity % TILE:
    return (f"head_dim must be one of {HEAD_DIMS} and the capacity a multiple of {TILE}, got {cache.head_dim}, "
            f"{cache.capacity}")
  if cache.num_layers is not None:
    return "one layer at a time (index the stacked cache)"
  return None


def decode_attention(q, cache, *, sm_scale: float | None = None, num_splits: int | None = None,
                     interpret: bool = False, options: Fp8Options | None = None,
                     logit_softcap: float | None = None, sliding_window: int | None = None):
  """q [B, N, T, H] -> [B, N, T, H] attention over an FP8 cache (per-token scales, tiled values): T query
  tokens at positions L - T + t (causal among them), N / K x T <= 16 rows per KV head. The semantics of
  `kvjax.attention.decode_attention`, its logit_softcap and window (Gemma 2's) as logit_softcap and
  sliding_window. options: the build (None: `default_options` for the cache's head_dim)."""
  if (why := supports(cache)) is not None:
    raise ValueError(f"cache: {why}")
  kh = cache.num_kv_heads
  if q.ndim != 4 or q.shape[0] != cache.batch or q.shape[1] % kh or q.shape[1] // kh * q.shape[2] > ROWS \
      or q.shape[3] != cache.head_dim:
    raise ValueError(f"q must be [B={cache.batch}, N, T, {cache.head_dim}] with N a multiple of the {kh} KV heads "
                     f"and N / {kh} x T <= {ROWS} query rows per KV head, got {q.shape}")
  if num_splits is None:
    num_splits = splits_for(cache.batch, kh, cache.capacity)
  options = default_options(cache.head_dim) if options is None else options
  scale = (cache.head_dim ** -0.5 if sm_scale is None else sm_scale) * decode.LOG2E
  return _decode(q, cache, jnp.asarray(scale, jnp.float32), num_splits=num_splits, interpret=interpret,
                 options=options, softcap=None if logit_softcap is None else float(logit_softcap),
                 sliding=None if sliding_window is None else int(sliding_window))


def fused_call(options: Fp8Options, num_splits: int, head_dim: int = HALF) -> bool:
  """Whether `decode_attention` runs `fp8_attention` (the glue in the kernel) for this build and splits."""
  return (options.fused and not options.key_terms and head_dim == HALF
          and (num_splits == 1 or epilogue.cluster_merge_ok(num_splits)))


@functools.partial(jax.jit, static_argnames=("num_splits", "interpret", "options", "softcap", "sliding"))
def _decode(q, cache, scale, *, num_splits, interpret, options, softcap, sliding):
  b, n, t, h = q.shape
  kh = cache.num_kv_heads
  rows = n // kh * t  # head-major, then token
  per_token = lambda x: x.reshape(b, kh, cache.capacity)  # [B, K, S, 1] -> [B, K, S]: free
  arrays = (cache.lengths, cache.k.codes, per_token(cache.k.scale), cache.v.codes, per_token(cache.v.scale))
  caps = dict(softcap=softcap, sliding=sliding)
  if fused_call(options, num_splits, h):
    out = fp8_attention(q.reshape(b, kh, rows, h), scale, *arrays, num_splits=num_splits, value_tile=cache.v.tile,
                        num_queries=t, interpret=interpret, options=options, **caps)
    return out.reshape(b, n, t, h)
  qs = q.astype(jnp.float32).reshape(b, kh, rows, h) * scale
  q_t = jnp.pad(qs.swapaxes(-1, -2), ((0, 0), (0, 0), (0, 0), (0, ROWS - rows)))
  o_t, m, l = fp8_states(q_t, *arrays, num_splits=num_splits, value_tile=cache.v.tile, num_queries=t,
                         interpret=interpret, options=options, live_rows=rows, **caps)
  out = decode.combine(o_t.swapaxes(-1, -2), m, l, rows)
  return out.reshape(b, n, t, h).astype(q.dtype)
