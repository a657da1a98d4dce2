"""KIVI decode states on Mosaic GPU (Pallas `plgpu`), dequantized codes as WGMMA's register A operand:
KIVI-2 G=128, since session 22 G=32 (`mosaic_groups`) and 4-bit codes (KIVI-4), since session 28 head_dim
256 (Gemma 2: 16 key k-slabs, one [128, N] value accumulator per 128 channels). `mosaic_decode` runs
it over a cache in the "words" layout (`QArray.layout`; the GPU default where this kernel reads it), which
`ops.decode_attention` dispatches there. H200, B=8 32k, Llama-3-8B heads, KIVI-2 G=128: 105.3 us alone
(session 17; torch SDPA bf16 ~245 us a call; history in benchmarks/NOTES_gpu.md). The planes are unpacked
by `mosaic_planes`.

Why: Triton's kernels reach the tensor cores only through shared-memory round trips of each dequantized
tile (benchmarks/NOTES_gpu.md). Here one warpgroup per (sequence, KV head, split) computes the transposed
problem, tokens on WGMMA's M axis (the "folded" presets):

  S^T [128 tok, N] = (C_K + z_g / s_g) [128 tok, H] . (q * s_g)^T [H, N]
  O^T [H, N]      += (C_V + z_t / s_t)^T [H, 128 tok] . (p * s_t)^T [128 tok, N]

with the code planes C unpacked in registers: codes are stored as uint16 words of 8 two-bit codes, and
plane m of a word tile (bits 2m, 2m + 1) is one [rows, 16] k-slab of WGMMA; ``(w >> 2m) & 3 | 0x6400``
is the fp16 1024 + code (exact), minus 1024 (exact), plus the zero over the scale (one fp16 rounding).
The only cross-warp reduction per tile is the softmax max. `Options` holds the other ways (the 1024
offset or the zeros as per-column sums, lazy per-thread sums, shift-free unpacking) that session 11
timed. N = 16 query rows (padded; the B operand's SMEM tiling needs 16). The layouts (`pack_keys`,
`pack_values`) and the jnp reference (`reference_states`) are in `mosaic_kivi_ref`.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu import mosaic_epilogue as epilogue, mosaic_groups as groups, mosaic_kivi_checks as checks
from pallas_kernels.gpu import mosaic_kivi_fp8 as kivi_fp8, mosaic_pipeline as pipeline
from pallas_kernels.gpu import mosaic_kivi_window as window_lib, mosaic_planes as planes
from pallas_kernels.gpu.mosaic_common import (balanced_range, kmajor_slab, soft_capped, softmax_columns, store_kmajor,
                                              wgmma_sum, widened)
from pallas_kernels.gpu.mosaic_kivi_ref import NEG, TILE, pack_keys, pack_values, reference_states, unpack_keys
from pallas_kernels.gpu.mosaic_options import DENORM_LOG2, VARIANTS, Options

__all__ = ["TILE", "ROWS", "Options", "VARIANTS", "pack_keys", "unpack_keys", "pack_values", "kivi2_states", "reference_states"]

ROWS = checks.ROWS  # query rows (N of WGMMA), padded; TILE (128) tokens a pipeline step
NARROW_ROWS = ROWS // 2  # `Options.narrow_softmax`: the softmax's columns where at most this many rows hold queries
HEAD_DIMS = checks.HEAD_DIMS
SLABS = 8     # [rows, 16] k-slabs of a 128-wide operand
PLANES = 8    # 2-bit codes per uint16 word (4-bit: 4, two word tiles a row)


def kivi2_states(q_t, lengths, kc, ks, kz, vc, vs, vz, *, num_splits: int, interpret: bool = False,
                 stages: int = 2, variant: str | Options = "folded_lazy", profile_dir: str = "",
                 profile_space: int = 0, window=None, merged=None, q_scale=None, merge_by: str = "count",
                 softcap: float | None = None, sliding: int | None = None, live_rows: int | None = None):
  """Per-split flash-decoding states of KIVI-2 / KIVI-4 (G=128 or 32) attention.

  q_t [B, K, H, 16] f32 (queries transposed, scaled by softmax scale x log2 e, rows padded to 16);
  lengths [B] int32; kc [B, K, S, H bits / 16] uint16, ks / kz [B, K, S/G, H]; vc [B, K, S/128, H, 8 bits];
  vs / vz [B, K, S] (G = H = 128) or [B, K, S, H/G]; scales and zeros fp16 or bf16 (layouts: `mosaic_kivi_ref`).
  H, G and the code width are read from the shapes (G=32, 4-bit and H=256 need a `dequant_in_a` variant).
  Returns (o_t [B, K, NS, H, 16], m, l [B, K, NS, 16]) in f32, m and l in the log2 domain; tokens >=
  lengths[b] are masked.

  variant: a name in VARIANTS or an `Options`. profile_dir / profile_space: Mosaic GPU's in-kernel
  profiler (a trace per call under profile_dir; regions kprep, kmma, softmax, vprep, vmma).
  window: None, or (full lengths [B] int32, k_res, v_res [B, K, 128, H] bf16 / fp16, T) for a cache's
  residual window as one more split state (index NS of the outputs, which then hold NS + 1): program
  (b, k, NS) scores the window's 128 ring slots (`window_merge`'s slot rule) against the T query tokens
  of the rows, causally, while the others walk the quantized tiles; `lengths` is then max(L - 128, 0), or
  None: computed so in the kernel from the window's (no XLA op before the call).
  Needs a `dequant_in_a` variant.
  merged: None, or (rows, dtype): the states (NS, or NS + 1 with the window; 2 to
  `mosaic_epilogue.CLUSTER_MAX`) merged inside the kernel as merge_by says (`mosaic_epilogue.MERGES`:
  "count", the last program of a (b, k) to count itself merges; "cluster", the programs of a (b, k) one
  cluster, merged by the first): returns the attention [B, K, rows, H] in dtype instead. Natively only
  ("count": the interpreter has no global semaphores; "cluster": it deadlocks on the window program's
  scoped allocations).
  q_scale: None, or the softmax scale x log2 e (f32 scalar): q_t is then the query rows as the caller holds
  them, [B, K, rows, H] in any float dtype, scaled, transposed and padded inside the kernel
  (`mosaic_epilogue.load_query_t`: no XLA op before the call).
  softcap: None, or the attention logits' soft-cap (`cap tanh(s / cap)` of the natural-log logits, Gemma 2),
  applied to every score before the softmax. sliding: None, or a sliding window W (needs `window`): the row of
  query token t (at L - T + t) sees keys in (L - T + t - W, L - T + t]; the balanced splits share the steps
  from the first visible one (`Options.balance`), the others mask.
  live_rows: how many of the 16 rows hold queries (the rest padding; None: the rows given with q_scale, else
  16). At most NARROW_ROWS with `Options.narrow_softmax` (a `dequant_in_a` variant): the tiles' softmax runs
  over the first NARROW_ROWS columns only, and the other rows' states are those of no token (m = NEG, l = 0,
  o = 0; the window program's are computed in full).
  """
  if q_scale is not None:
    q_rows, q_t = q_t, jax.ShapeDtypeStruct(q_t.shape[:2] + (q_t.shape[3], ROWS), jnp.float32)  # the checks' shape
  opt = checks.options(variant)
  b, kh, h, s, bits, group, n_states = checks.check(q_t, q_rows if q_scale is not None else None, lengths, kc, ks,
                                                    kz, vc, vs, vz, opt=opt, variant=variant, num_splits=num_splits,
                                                    window=window, merged=merged, merge_by=merge_by,
                                                    softcap=softcap, sliding=sliding)
  if live_rows is None:
    live_rows = q_rows.shape[2] if q_scale is not None else ROWS
  narrow, width = softmax_columns(live_rows, ROWS, opt.narrow_softmax and opt.dequant_in_a)  # the softmax's columns
  nmma = narrow and opt.narrow_mma  # N = 8 products: the query and probabilities K-major [8, K] in shared memory
  wn = width if nmma else ROWS  # the products' N
  kwpr, vwpr, per_word = h * bits // 16, 8 * bits, 16 // bits  # words a row (keys' h channels, values' 128 tokens)
  vh = h // TILE  # value halves: 128-channel value accumulators; h = 256: value scales [S, 2] a token
  grouped = group != TILE
  f8mma = opt.fp8_mma and bits == 2 and not grouped and h == TILE and narrow  # where it applies, else fp16
  o_cols = width if nmma or f8mma else ROWS  # o's columns through the loop (widened to ROWS at the end)
  if window is not None:
    w_len, k_res, v_res, w_queries = window
  per = s // TILE // num_splits
  # a tile's scale entries (n_: h for keys, TILE vh for values): G=128 [n_]; G=32 [4, h] for keys, [4 vh, 128]
  # for values (TMA's boxes take at most 256 a dimension: `mosaic_groups`)
  sblock = ((lambda nt_, n_, key: (nt_ * groups.GROUPS, h) if key else (nt_ * groups.GROUPS * vh, TILE)) if grouped
            else (lambda nt_, n_, key: (nt_ * n_,)))
  scale_ns = ((h, True), (h, True), (TILE * vh, False), (TILE * vh, False))  # ks, kz, vs, vz
  swz = plgpu.find_swizzle(ROWS * 16, "rhs")
  b_tiles = (plgpu.TilingTransform((8, swz * 8 // 16)), plgpu.SwizzleTransform(swz))
  code_tiles = (plgpu.TilingTransform((8, 16)), plgpu.SwizzleTransform(32))  # [rows, 16] uint16

  mma = functools.partial(wgmma_sum, lag=opt.lag, interpret=interpret)

  def col(ref, m, rows, factor=None, glayout="rows", half=0):
    """ref[16 m: 16 m + 16] (one value per k column of plane m) as fp16 (times `factor`), broadcast over
    `rows` rows; grouped (G=32): the tile's entries for (row // 32, column), ref in `mosaic_groups`' layout
    glayout (h = 256: keys' k-slab m of the 128-channel window m // 8, values' groups of 128-channel half)."""
    if grouped:
      v = groups.group_fragment(ref, m % 8, layout=glayout, interpret=interpret,
                                offset=(groups.GROUPS * half, TILE * (m // 8)))
      return v if factor is None else v * factor
    v = ref[pl.ds(16 * m, 16)].astype(jnp.float16)
    return jnp.broadcast_to((v if factor is None else v * factor)[None, :], (rows, 16))

  def l_update(l_prev, alpha, p):
    """l rescaled and grown by this step's p: per-thread [TILE, N] sums (`lazy_sums`) or per column."""
    return l_prev * alpha[None, :] + p if opt.lazy_sums else l_prev * alpha + jnp.sum(p, axis=0)

  def plane_pairs(words, b_ref, add_ref=None, scale_ref=None, magic=None, prescaled=False, glayout="rows", half=0,
                  kmajor=False):
    """(A builder, B slab) per k-slab; words: the [rows, 16] word tiles of the operand (1, or 2 for 4-bit:
    slab 4 t + m is plane m of tile t). Slab i is code (* scale_ref[16 i: 16 i + 16]) (+ add_ref[16 i:
    16 i + 16]), those [16] vectors per k column, broadcast over the rows. unpack="denorm": the planes
    are subnormals, the scales and zeros carry the factors (`planes.denorm_factors`), already there when
    `prescaled` (converted once per tile), else applied to each [16] vector here. kmajor: b_ref is [8, K]
    (`Options.narrow_mma`), its slabs read through transposed views."""
    bslab = ((lambda i: kmajor_slab(b_ref, i, interpret=interpret)) if kmajor else
             (lambda i: b_ref.at[pl.ds(16 * i, 16)]))
    hi = [None] * len(words)
    if opt.timing_only == "unpack":  # diagnostic (`Options.timing_only`): the words as fp16, states wrong
      return [(functools.partial(lax.bitcast_convert_type, words[i // per_word], jnp.float16),
               bslab(i)) for i in range(len(words) * per_word)]
    if opt.unpack in ("mask", "denorm"):
      sh = planes.hi_shift(bits)
      hi = [planes.shr_pairs(w, sh, interpret) if opt.shift32 else lax.shift_right_logical(w, jnp.uint16(sh))
            for w in words]

    def a(i):
      t, m = divmod(i, per_word)
      w, hw = words[t], hi[t]
      rows = w.shape[0]
      if opt.timing_only == "scale":  # diagnostic: the masked plane without its scale and zero
        return planes.plane_denorm(w, hw, m, bits)
      if opt.unpack == "denorm":
        f = lambda ref, e: col(ref, i, rows, None if prescaled else jnp.float16(2.0 ** e), glayout, half)
        return (planes.plane_denorm(w, hw, m, bits) * f(scale_ref, planes.denorm_scale_log2(m, bits))
                + f(add_ref, -DENORM_LOG2))
      x = planes.plane_masked(w, hw, m, magic, bits) if opt.unpack == "mask" else planes.plane(w, m, opt.exact)
      if scale_ref is not None:
        x = x * col(scale_ref, i, rows, glayout=glayout, half=half)
      return x if add_ref is None else x + col(add_ref, i, rows, glayout=glayout, half=half)
    return [(functools.partial(a, i), bslab(i)) for i in range(len(words) * per_word)]

  wgmma_load = functools.partial(plgpu.load, layout=plgpu.Layout.WGMMA)

  def word_tiles(ref, load):
    """The [rows, 16] word tiles of a [rows, 16 n] ref, each through load."""
    n = ref.shape[1] // 16
    return [load(ref)] if n == 1 else [load(ref.at[:, pl.ds(16 * t, 16)]) for t in range(n)]

  denorm = opt.unpack == "denorm" and not f8mma  # fp8_mma: the logits and probabilities in natural units

  def softmax(scs, first_tile, m_prev, length, lo0=None, col_max=None):
    """Masked online softmax over consecutive tiles' [TILE, N] logits (one cross-warp max for all).
    unpack="denorm": the logits come in / 2^DENORM_LOG2 (scaled back here, exactly) and the
    probabilities go out x 2^DENORM_LOG2 (the values' A holds v / 2^DENORM_LOG2; l is divided at the end).
    softcap: the logits capped first (in their own scale); lo0 (sliding): row n sees tokens > lo0 + n % T.
    col_max: [TILE, N] -> [N], the max over the tokens (default `jnp.max`; `mosaic_xwarp`'s in the e4m3 step).
    `Options.full_tiles` (no sliding window): the mask only where a tile holds a token at or past the length,
    through a warp-uniform branch (`lax.cond`); full tiles take the branch without it (length None)."""
    if opt.full_tiles and lo0 is None and length is not None:
      full = (first_tile + len(scs)) * TILE <= length
      return lax.cond(full, lambda *a: masked(*a, None, None, col_max), lambda *a: masked(*a, length, None, col_max),
                      scs, first_tile, m_prev)
    return masked(scs, first_tile, m_prev, length, lo0, col_max)

  def masked(scs, first_tile, m_prev, length, lo0, col_max):
    """`softmax` with the mask where length is given."""
    rows = lax.broadcasted_iota(jnp.int32, scs[0].shape, 0)
    if softcap is not None:
      scs = [soft_capped(sc, softcap, 2.0 ** DENORM_LOG2 if denorm else 1.0) for sc in scs]
    assert length is not None or lo0 is None, "a sliding window masks every tile"
    oks = None if length is None else [(first_tile + j) * TILE + rows < length for j in range(len(scs))]
    if lo0 is not None:
      lo = lo0 + lax.broadcasted_iota(jnp.int32, scs[0].shape, 1) % w_queries
      oks = [ok & ((first_tile + j) * TILE + rows > lo) for j, ok in enumerate(oks)]
    if length is not None:
      scs = [jnp.where(ok, sc, NEG) for ok, sc in zip(oks, scs)]
    top = (col_max or functools.partial(jnp.max, axis=0))(functools.reduce(jnp.maximum, scs))
    k = 2.0 ** DENORM_LOG2 if denorm else 1.0
    m_new = jnp.maximum(m_prev, top * k if denorm else top)
    alpha = jnp.exp2(m_prev - m_new)
    if denorm:  # a masked logit gives sc k - m_new <= NEG 2^DENORM_LOG2 - NEG < -1e34 (m_new >= NEG): exp2 is 0
      return [jnp.exp2(sc * k - (m_new - DENORM_LOG2)[None, :]) for sc in scs], m_new, alpha
    if length is None:
      return [jnp.exp2(sc - m_new[None, :]) for sc in scs], m_new, alpha
    return [jnp.where(ok, jnp.exp2(sc - m_new[None, :]), 0.0) for ok, sc in zip(oks, scs)], m_new, alpha

  once = opt.scales_once and (ks.dtype != jnp.float16 or vh > 1)
  # the f32 query, the scaled fp16 query and the zero rows in shared memory for the whole program (steps without
  # `dequant_in_a`); the dequant steps read only the fp16 query (12.5 KB less: KIVI-4 fits 4 programs per SM)
  resident = not opt.dequant_in_a

  def dequant_step(length, first, pt_smem, q16_smem, s16, magic, lo0=None):
    """The step of `dequant_in_a` over `tiles_per_step` tiles: codes * scale + zero in the A registers,
    against the fp16 query (stored once) and the fp16 probabilities: one shared-memory store and one
    commit per step (two with `once`: the scales converted to fp16 in s16 first, with unpack="denorm"
    times their factors). first: the split's first step (in steps of `tiles_per_step` tiles)."""
    nt = opt.tiles_per_step
    rows = lambda ref, j, size: ref.at[pl.ds(size * j, size)]
    p_rows = lambda j: pt_smem.at[:, pl.ds(TILE * j, TILE)] if nmma else rows(pt_smem, j, TILE)  # tile j's p
    scales = lambda ref, j, size: rows(ref, j, ref.shape[0] // nt if grouped else size)
    # per-plane factors (`mosaic_groups.regroup`, `split_halves`), else per k column of the scales (keys: h a tile)
    slab_factors = ((tuple(2.0 ** planes.denorm_scale_log2(i % per_word, bits) for i in range(SLABS)),
                     (2.0 ** -DENORM_LOG2,) * SLABS) if denorm else (None, None))
    column_factors = lambda n: planes.denorm_factors(n, bits) if denorm else (None, None)
    # grouped: the scales regrouped ("packed") when converted once, else as the cache holds them
    k_layout, v_layout = ("packed", "packed") if once else ("rows", "tokens")

    def to_fp16(srcs, dsts, size, layout):  # `once`: the scales (and zeros) in fp16, with their factors
      factors = slab_factors if grouped or (vh > 1 and layout == "tokens") else column_factors(nt * size)
      for src, dst, f in zip(srcs, dsts, factors):
        if grouped:  # h = 256: per 128-channel half (keys' columns, values' groups 4 u ..)
          for j, u in itertools.product(range(nt), range(vh)):
            groups.regroup(scales(src, j, size), scales(dst, j, size), f, interpret=interpret,
                           layout=layout + "8" if vh > 1 and layout == "tokens" else layout,
                           offset=(groups.GROUPS * u, 0) if layout == "tokens" else (0, TILE * u))
        elif vh > 1 and layout == "tokens":  # value scales per token and 128 channels: made half-major
          groups.split_halves(src, dst, f, interpret=interpret)
        else:
          dst[...] = (src[...] if f is None else src[...].astype(jnp.float32) * f).astype(jnp.float16)

    def step(idx, kc_s, vc_s, ks_s, kz_s, vs_s, vz_s, carry):
      o, m_prev, l_prev, cv = carry
      if once:
        with jax.named_scope("kprep"):
          to_fp16((ks_s, kz_s), s16[:2], h, "rows")
          plgpu.commit_smem()
        ks_s, kz_s = s16[:2]
      with jax.named_scope("kmma"):
        scs = [mma(jnp.zeros((TILE, wn), jnp.float32),
                   plane_pairs(word_tiles(rows(kc_s, j, TILE), wgmma_load), q16_smem,
                               scales(kz_s, j, h), scales(ks_s, j, h), magic, once, k_layout, kmajor=nmma))
               for j in range(nt)]
      with jax.named_scope("softmax"):
        if narrow and not nmma:  # the rows past NARROW_ROWS hold no query: their probabilities stay 0
          scs = [sc[:, :width] for sc in scs]
        ps, m_new, alpha = softmax(scs, (first + idx[0]) * nt, m_prev, length, lo0)
      with jax.named_scope("vprep"):
        for j, p in enumerate(ps):
          if nmma:  # [8, nt TILE]: the tokens along K
            store_kmajor(p_rows(j), p, interpret=interpret)
          else:
            p_rows(j)[...] = (widened(p, 0.0) if narrow else p).astype(jnp.float16)
        if once:
          to_fp16((vs_s, vz_s), s16[2:], TILE * vh, "tokens")
          vs_s, vz_s = s16[2:]
        l_new = l_update(l_prev, alpha, functools.reduce(jnp.add, ps))
        plgpu.commit_smem()
      with jax.named_scope("vmma"):  # o: one [128, N] accumulator per 128 channels (M = 128 A operands)
        half = lambda ref, u: ref if vh == 1 else ref.at[pl.ds(TILE * u, TILE)]
        shalf = (lambda ref, u: ref) if grouped else half  # grouped: the half's groups by `col`'s offset
        o_alpha = widened(alpha, 1.0) if narrow and not nmma else alpha
        o = tuple(mma(o_u * o_alpha[None, :], [
            pair for j in range(nt) for pair in plane_pairs(
                word_tiles(half(rows(vc_s, j, h), u), wgmma_load), p_rows(j),
                shalf(scales(vz_s, j, TILE * vh), u), shalf(scales(vs_s, j, TILE * vh), u), magic, once, v_layout,
                half=u, kmajor=nmma)]) for u, o_u in enumerate(o))
      if opt.manual_barriers:  # every thread is done with this slot before the pipeline refetches into it
        plgpu.commit_smem()
      return o, m_new, l_new, cv
    return step

  fp8_step = kivi_fp8.make_step(mma=mma, softmax=softmax, l_update=l_update, width=width, interpret=interpret,
                                manual_barriers=opt.manual_barriers, xwarp=opt.xwarp_split,
                                ptx_words=opt.ptx_words, redux_max=opt.redux_max,
                                f16_rest=opt.f16_rest) if f8mma else None

  if window is not None:  # the residual window's program (`mosaic_kivi_window`)
    wparts = window_lib.WindowParts(h, vh, bits, per_word, grouped, w_queries, softcap, sliding, interpret,
                                    k_res.dtype, v_res.dtype, code_tiles, b_tiles, col, word_tiles, mma,
                                    key_part=32 if nmma else TILE // 2)  # nmma: a program of <= 44 KB (5 an SM)

  def body(*refs):
    n_in = 9 + 3 * (window is not None) + (q_scale is not None)
    (q_g, len_g, magic_g, kc_g, vc_g, ks_g, kz_g, vs_g, vz_g), win_refs = refs[:9], refs[9:9 + 3 * (window is not None)]
    lw_g, kres_g, vres_g = win_refs if window is not None else (None,) * 3
    outs = refs[n_in:n_in + 3 + (merged is not None)]
    pt_smem, q16_smem, s16, bar, *rest = refs[n_in + len(outs):len(refs) - bool(opt.smem_pad_kb)]  # pad: unused
    nf8 = 2 + 2 * opt.xwarp_split if f8mma else 0  # fp8_mma: B_K's and B_V's views (and the reductions')
    f8_bufs, rest = tuple(rest[:nf8]), rest[nf8:]
    qs_smem, q_smem, zsk_smem, zsv_smem, *sync = rest if resident else [None] * 4 + rest
    counters = None if merged is None else epilogue.merge_counters(merge_by, b, kh)  # once: both branches' count

    def emit(o, m, l):  # this program's state: to the outputs, or into the in-kernel merge
      if merged is None:
        o_g, m_g, l_g = outs
        if isinstance(o, tuple):  # 128 channels an accumulator
          for u, o_u in enumerate(o):
            o_g[bi, ki, si, pl.ds(TILE * u, TILE)] = o_u
        else:
          o_g[bi, ki, si] = o
        m_g[bi, ki, si], l_g[bi, ki, si] = m, l
      else:
        epilogue.merge_states(o[0] if isinstance(o, tuple) else o, m, l, outs[:3], outs[3], sync, counters,
                              merge_by=merge_by,
                              num_splits=n_states, interpret=interpret)
    bi, ki, si = lax.axis_index("b"), lax.axis_index("k"), lax.axis_index("s")
    def fetch_query(dst, k_major=False):  # the query [H, N] (x the scale), in dst's dtype; k_major: [8, H]
      if q_scale is not None:  # the caller's rows; the scale is the last input
        epilogue.load_query_t(q_g.at[bi, ki], refs[n_in - 1][0], dst, bar, interpret=interpret, k_major=k_major)
      elif dst.dtype == jnp.float32:
        plgpu.copy_gmem_to_smem(q_g.at[bi, ki], dst, bar)
        plgpu.barrier_wait(bar)
      else:
        pl.run_scoped(via_f32, plgpu.SMEM((h, ROWS), jnp.float32))

    def via_f32(q32):
      fetch_query(q32)
      store_fp16(q32)

    def store_fp16(q32):
      if nmma:
        store_kmajor(q16_smem, q32[...][:, :NARROW_ROWS], interpret=interpret)
      else:
        q16_smem[...] = q32[...].astype(jnp.float16)
      plgpu.commit_smem()
    if resident:
      fetch_query(q_smem)
      if opt.zero_mma:
        store_fp16(q_smem)
    else:  # the fp16 query alone lives through the loop (the f32 one in a scope the pipeline reuses)
      fetch_query(q16_smem, k_major=nmma)
    q_reg = None if opt.q_in_smem or not resident else q_smem[...]  # [H, N]
    length = len_g[bi] if lengths is not None else jnp.maximum(len_g[bi] - TILE, 0)  # None: the window's L
    magic = magic_g[0].astype(jnp.uint16) if opt.opaque_magic else None
    lo0 = None  # sliding: row n sees tokens > lo0 + n % T (lo0 = L - T - W, L the full length)
    if sliding is not None:
      lo0 = (len_g[bi] if lengths is None else lw_g[bi]) - w_queries - sliding

    def step(idx, kc_s, vc_s, ks_s, kz_s, vs_s, vz_s, carry):
      o, m_prev, l_prev, cv = carry
      (t,) = idx
      with jax.named_scope("kprep"):
        qt = q_smem[...] if opt.q_in_smem else q_reg
        qs16 = (qt * ks_s[...].astype(jnp.float32)[:, None]).astype(jnp.float16)
        qs_smem[...] = qs16
        ck = 0.0
        extra = []
        if opt.fold_zeros:
          zsk_smem[...] = planes.zero_over_scale(kz_s[...], ks_s[...])
        elif opt.zero_mma:  # 16 channels of the zero row, broadcast over the tile's tokens
          extra = [(functools.partial(col, kz_s, m, TILE), q16_smem.at[pl.ds(16 * m, 16)]) for m in range(SLABS)]
        else:
          cz = qt * kz_s[...].astype(jnp.float32)[:, None]
          if not opt.exact:
            cz = cz - 1024.0 * qs16.astype(jnp.float32)
          ck = jnp.sum(cz, axis=0)[None, :]  # [1, N]
        plgpu.commit_smem()
      with jax.named_scope("kmma"):
        words = [plgpu.load(kc_s, layout=plgpu.Layout.WGMMA)]
        sc = mma(jnp.zeros((TILE, ROWS), jnp.float32),
                 extra + plane_pairs(words, qs_smem, zsk_smem if opt.fold_zeros else None, magic=magic)) + ck
      with jax.named_scope("softmax"):
        (p,), m_new, alpha = softmax([sc], first + t, m_prev, length)
      with jax.named_scope("vprep"):
        vsc, vzr = vs_s[...].astype(jnp.float32), vz_s[...].astype(jnp.float32)  # [TILE]
        pt16 = (p * vsc[:, None]).astype(jnp.float16)
        pt_smem[...] = pt16
        if opt.fold_zeros:
          zsv_smem[...] = planes.zero_over_scale(vzr, vsc)
        elif opt.lazy_sums:  # per-thread [TILE, N] sums, reduced over the tokens once at the end
          cv = cv * alpha[None, :] + p * vzr[:, None]
        else:
          cz = p * vzr[:, None]
          if not opt.exact:
            cz = cz - 1024.0 * pt16.astype(jnp.float32)
          cv = cv * alpha + jnp.sum(cz, axis=0)
        l_new = l_update(l_prev, alpha, p)
        plgpu.commit_smem()
      with jax.named_scope("vmma"):
        words = [plgpu.load(vc_s, layout=plgpu.Layout.WGMMA)]
        o = mma(o * alpha[None, :], plane_pairs(words, pt_smem, zsv_smem if opt.fold_zeros else None, magic=magic))
      return o, m_new, l_new, cv

    acc_shape = (TILE, width) if opt.lazy_sums else (width,)
    cv_shape = ((TILE, width) if f8mma else (1,) if opt.fold_zeros or opt.dequant_in_a
                else acc_shape)  # zeros in A: no value zero term; fp8_mma: lazy per-thread sums
    o0 = (jnp.zeros((TILE, o_cols), jnp.float32),) * vh if opt.dequant_in_a else jnp.zeros((h, ROWS), jnp.float32)
    init = (o0, jnp.full((width,), NEG, jnp.float32),
            jnp.zeros(acc_shape, jnp.float32), jnp.zeros(cv_shape, jnp.float32))
    nt = opt.tiles_per_step
    steps = per // nt  # steps of nt tiles per split
    first = si * steps  # this split's first step
    if opt.stop_at_length and opt.balance:  # the live steps shared evenly, at least min_share a split
      first, steps = balanced_range(length, si, num_splits=num_splits, tile=nt * TILE,
                                    capacity_steps=s // TILE // nt, min_share=opt.min_share,
                                    start=None if lo0 is None else lax.div(jnp.maximum(lo0 + 1, 0), nt * TILE))
    elif opt.stop_at_length:  # only steps holding a token below the length (none past it)
      live = jnp.minimum(lax.div(length + (nt * TILE - 1), nt * TILE), num_splits * steps)
      steps = jnp.clip(live - first, 0, steps)
    pipe = lambda step_fn: pipeline.emit(
        step_fn, steps=steps, stages=stages, init_carry=init, warp_fetch=opt.warp_fetch, interpret=interpret,
        in_specs=[plgpu.BlockSpec((nt * TILE, kwpr), lambda t: (first + t, 0), transforms=code_tiles),
                  plgpu.BlockSpec((nt * h, vwpr), lambda t: (first + t, 0), transforms=code_tiles),
                  *[plgpu.BlockSpec(sblock(nt, n_, key), lambda t: (first + t,) + (0,) * grouped)
                    for n_, key in scale_ns]])

    def tiles():
      src = (0, 0) if opt.timing_only == "l2" else (bi, ki)  # diagnostic: one (b, k)'s bytes for every program
      if f8mma:  # the query's halves for B_K, loaded once (in this branch: the window program needs none)
        step_fn = fp8_step(length, first, f8_bufs, kivi_fp8.query_halves(q16_smem, width, interpret=interpret), lo0)
      else:
        step_fn = dequant_step(length, first, pt_smem, q16_smem, s16, magic, lo0) if opt.dequant_in_a else step
      o, m_f, l_f, cv = pipe(step_fn)(*(x.at[src] for x in (kc_g, vc_g, ks_g, kz_g, vs_g, vz_g)))
      if f8mma:  # the values' zero term
        o = (kivi_fp8.finish(o[0], cv),)
      if opt.lazy_sums:
        l_f = jnp.sum(l_f, axis=0)
        if not (opt.fold_zeros or opt.dequant_in_a):
          cv = jnp.sum(cv, axis=0)
      if denorm:  # the probabilities were stored x 2^DENORM_LOG2
        l_f = l_f * 2.0 ** -DENORM_LOG2
      if narrow:  # the rows past NARROW_ROWS: no token's state
        m_f, l_f = widened(m_f, NEG), widened(l_f, 0.0)
      if nmma or f8mma:
        o = tuple(widened(o_u, 0.0) for o_u in o)
      emit(o if opt.fold_zeros or opt.dequant_in_a else o + cv[None, :], m_f, l_f)

    def window_program():
      emit(*window_lib.window_state(wparts, bi, ki, lw_g, kc_g, ks_g, kz_g, kres_g, vres_g, q_smem, fetch_query,
                                    None if nmma else q16_smem, bar, magic))  # nmma: its own [H, 16] copy

    if window is None:
      tiles()
    else:  # one branch or the other: with two `pl.when`s the window's code follows the tile loop in the
      # control flow, and what it reads from the kernel's entry stays live through the loop (session 16:
      # 141 registers against 127, 3 programs per SM instead of 4; B=8 32k 173.0 us against 134.0)
      lax.cond(si < num_splits, tiles, window_program)

  kw = {"interpret": plgpu.InterpretGPUParams()} if interpret else {}
  prof = dict(profile_space=profile_space, profile_dir=profile_dir) if profile_dir else {}
  out_type = (jax.ShapeDtypeStruct((b, kh, n_states, h, ROWS), jnp.float32),
              jax.ShapeDtypeStruct((b, kh, n_states, ROWS), jnp.float32),
              jax.ShapeDtypeStruct((b, kh, n_states, ROWS), jnp.float32))
  mesh = epilogue.merge_mesh(b, kh, n_states, None if merged is None else merge_by)
  if merged is not None:
    out_type += (jax.ShapeDtypeStruct((b, kh, merged[0], h), merged[1]),)
  f = plgpu.kernel(
      body,
      out_type=out_type, **mesh,
      scratch_types=[plgpu.SMEM((NARROW_ROWS, opt.tiles_per_step * TILE), jnp.float16, transforms=code_tiles) if nmma
                     else plgpu.SMEM((opt.tiles_per_step * TILE, ROWS), jnp.float16, transforms=b_tiles),
                     plgpu.SMEM((NARROW_ROWS, h), jnp.float16, transforms=code_tiles) if nmma
                     else plgpu.SMEM((h, ROWS), jnp.float16, transforms=b_tiles),
                     [plgpu.SMEM(sblock(opt.tiles_per_step, n_, key), jnp.float16) for n_, key in scale_ns]
                     if once else [],
                     plgpu.Barrier(num_arrivals=1),
                     *(kivi_fp8.scratch(ROWS, width, xwarp=opt.xwarp_split, interpret=interpret) if f8mma else ()),
                     *((plgpu.SMEM((h, ROWS), jnp.float16, transforms=b_tiles), plgpu.SMEM((h, ROWS), jnp.float32),
                        plgpu.SMEM((h,), jnp.float16), plgpu.SMEM((TILE,), jnp.float16)) if resident else ()),
                     *(() if merged is None else epilogue.merge_scratch(merge_by)),
                     *((plgpu.SMEM((opt.smem_pad_kb * 512,), jnp.float16),) if opt.smem_pad_kb else ())],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
                                           approx_math=opt.approx_math,
                                           unsafe_no_auto_barriers=opt.manual_barriers, **prof),
      kernel_name="kvjax_mosaic_kivi2", **kw)
  tiles = s // TILE
  extra = () if window is None else (w_len, k_res, v_res)
  magic = jnp.full((1,), 0x6400, jnp.int32)  # `Options.opaque_magic`: a constant ptxas cannot see
  if q_scale is not None:
    q_t, extra = q_rows, extra + (jnp.reshape(jnp.asarray(q_scale, jnp.float32), (1,)),)  # a free reshape
  flat = lambda x, n_, key: x.reshape(b, kh, *sblock(tiles, n_, key))  # free reshapes
  res = f(q_t, lengths if lengths is not None else w_len, magic, kc, vc.reshape(b, kh, tiles * h, vwpr),
          *(flat(x, n_, key) for x, (n_, key) in zip((ks, kz, vs, vz), scale_ns)), *extra)
  return res if merged is None else res[-1]
