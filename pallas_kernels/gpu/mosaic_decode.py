"""KIVI-2 / KIVI-4 (G=128 or 32) decode attention over a `kvjax` cache through the Mosaic GPU kernel
(`mosaic_kivi.kivi2_states`): the semantics of `kvjax.attention.decode_attention`, residual window
included. `ops.decode_attention` dispatches here for caches in the "words" layout
(`QArray.layout`, `kvjax.cache.default_kivi_layout`: the GPU default for KIVI-2 G = R = H = 128; G=32
caches take it when made with `init_cache(kivi_layout="words")`),
whose codes the kernel reads as stored. A cache in the planar layout (`kvjax.packing`) is converted
by `repack` first: a pass over the whole cache per call, for tests and planar caches only.

Split of the work, with L = length, R = the residual length, Lq = L - L % R:
  * tokens [0, L - R): quantized keys and values: the kernel's splits;
  * the window [max(L - R, 0), L): values from the value ring (`v_res`), keys dequantized below Lq
    and from `k_res` from Lq on: one more split state (R tokens);
and `decode.combine` merges all of them. By default (`window="auto"`) the window's state is one more
program of the Mosaic kernel and XLA merges; `window_merge` (the window and the merge in one Pallas
kernel) and plain XLA (`window_states`) are the other ways.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kvjax import quant
from kvjax.formats import KIVISpec
from pallas_kernels.gpu import decode, merge, mosaic_epilogue as epilogue, mosaic_kivi as mk, window_merge

__all__ = ["supports", "repack", "window_states", "decode_attention", "default_splits", "DEFAULT_VARIANT",
           "FP16_VARIANT", "GROUPED_VARIANT", "WIDE_HEAD_VARIANT", "GROUPS", "BITS", "WINDOWS", "DEFAULT_WINDOW",
           "auto_window", "resolved_window", "default_variant", "GLUE_IN_KERNEL",
           "PALLAS_MERGE", "pallas_merge_default"]

# Session 12 (H200, B=8 32k Llama-3-8B heads, decode_parts/mosaic_s12a.json): dequant_mask 128.0 us at
# 8 splits (144.2 at 4), folded_lazy (session 11's default) 185.0 / 190.9, dequant2 136.3 at 4; B=1 32k
# dequant_mask 27.9 us at 32 splits. Those caches had fp16 scales; a kvjax cache holds bf16, where
# dequant_mask takes 148.6 us and dequant_mask_s16 (converted once per tile) 131.8 (session 14,
# decode_parts/mosaic_s14a.json; lag 2 / 4: 170.1 / 167.5; 16 splits 132.7; 3 stages 143.7).
# Session 15 (decode_parts/mosaic_s15a*.json, B=8 32k, 8 splits): stopping at the lengths with the splits
# sharing the live tiles (dequant_mask_s16_bal) costs 133.3 us on a full cache against 132.2 walking the
# whole capacity, and holding 1k / 8k tokens of a 32k capacity takes 15.1 / 43.6 us against 132.5 / 133.3
# (stopping without sharing: 34.5 / 108.2).
# Session 16: the same with 0x6400 read at run time (`Options.opaque_magic`): the tile loop's SASS is 988
# instructions instead of 1114 (benchmarks/mosaic_sass.py, compiled for an H200 on the CPU), 128 registers;
# B=8 32k alone 133.4 -> 122.9 us (decode_parts/mosaic_sass_s16h.json), through ops 129.1 against torch 244.4.
# Session 17: the planes as fp16 subnormals (`Options(unpack="denorm")`), the planes-5-7 shift on 32-bit pairs
# (`shift32`) and Mosaic's automatic barriers off (`manual_barriers`): the tile loop 988 -> 768 SASS
# instructions; B=8 32k alone 122.8 -> 115.4 -> 107.8 -> 107.2 us for each step in turn
# (decode_parts/mosaic_sass_s17a.json), 105.3 with the softmax's second mask dropped (mosaic_sass_s17c.json);
# through ops 112.5 against torch SDPA 245.5 (2.18x, decode_s17c_kivi.json).
# (Preset dequant_denorm_s32_mb4 adds `Options.min_share=4`, each split at least 4 of the live tiles as
# `default_splits` does with the capacity, for a short sequence in a long cache: interpreted and lowered,
# not yet run on the device; benchmarks/runs/session17_e.sh is its first call.)
# Session 38: both products as e4m3 WGMMAs on the code bytes (`Options.fp8_mma`, session 37) with its two
# cross-warp reductions split around the step's own barriers (`Options.xwarp_split`); where it does not apply
# (more than 8 query rows, G=32, head_dim 256) the fp16 step of FP16_VARIANT runs. H100, B=8 32k alone 103.7 ->
# 95.0 us (session 37's range alone 97.2); through ops 101.0 -> 93.3 against torch SDPA's 351.3 (3.77x), B=64
# 686.3 -> 596.3 against 2749.9 (4.61x) (`decode_parts/session38/call1/`). Then B's e4m3 words from one PTX block
# a register pair (`Options.ptx_words`, 652 -> 600 loop SASS): alone 95.8 -> 91.0 us; through ops B=8 89.6 against
# torch's 341.2 (3.81x), B=64 571.4 against 2661.7 (4.66x) (`session38/call4-6/`). Session 40: each refetch issued
# by one warp a tile, rotating (`Options.warp_fetch`, `mosaic_pipeline`; loop SASS 600 -> 568, 61 of them run by
# one warp of 4, compiled for an H200): H100, alone 90.95 / 90.63 -> 87.97 us; through ops B=8 89.5 -> 85.9 against
# torch's 341.2 (3.81x -> 3.97x), B=64 569.9 -> 533.1 against 2662.1 (4.67x -> 4.99x) (`session40/call1/`).
DEFAULT_VARIANT = "dequant_fp8xpw"
FP16_VARIANT = "dequant_denorm_s32_mb"  # the default through session 37: the fp16 step the default falls back to
# G=32 (session 22, `mosaic_groups`: each M-block's group scales loaded per thread, regrouped once a tile):
# compiled for an H200 on the CPU at B=8 32k (`decode_parts/mosaic_sass_aot_g32_s22.json`), the tile loop is 839
# SASS instructions against G=128's 768; lag 0 keeps it at 124 registers (4 programs per SM), lag 1 at 130 (3).
# H200, the kernel alone at B=8 32k (`decode_parts/session22/mosaic_sass_g*.json`): lag 0 124.5 us, lag 1 165.3,
# G=128's default 105.6; through ops 130.0 against torch SDPA's 238.9 (Triton's G=32 kernel: 352.0). Session 40:
# with `Options.warp_fetch` (H100, G=32 alone 120.29 -> 116.52 us; natively bit for bit the build without it at G=32
# and KIVI-4, `session40/call1-2/`); head_dim 256 (Gemma) keeps WIDE_HEAD_VARIANT until it has run natively.
GROUPED_VARIANT = "dequant_denorm_s32_mb_lag0w"
WIDE_HEAD_VARIANT = "dequant_denorm_s32_mb_lag0"
GROUPS = (mk.TILE, 32)  # the group sizes the kernel takes
BITS = (2, 4)  # and code widths (KIVI-4: session 22; natively right and timed on an H100 in session 23)
# Where the residual window's state is made (`decode_attention`'s window). "auto": the window as one more
# program of the Mosaic kernel wherever the kernel can take it (a `dequant_in_a` variant, 16-bit residual
# rings), else `window_merge`'s Pallas kernel. Session 16 (H200, same run as torch SDPA,
# decode_parts/decode_s16c_kivi.json, us, window_merge -> the kernel's window): B=8 32k 147.2 -> 140.3,
# B=1 32k 41.7 -> 34.2, B=8 4k 41.4 -> 32.3, B=1 4k 24.9 -> 18.6, B=8 1k 29.6 -> 21.5, B=1 1k 20.2 -> 14.5,
# B=64 4k 183.9 -> 163.6, B=64 1k 92.9 -> 53.3. (Session 15's kernel window was slower at B=8 32k, 171.5:
# written as two `pl.when`s, it kept the kernel at 141 registers, 3 programs per SM instead of 4.)
WINDOWS = ("auto", "pallas", "kernel", "xla")
DEFAULT_WINDOW = "auto"
# Session 20: with window "kernel", the NS + 1 states merged inside the kernel (`mosaic_epilogue`, as
# MERGE_BY) where NS + 1 <= CLUSTER_MAX, and the query read as the caller holds it
# (`kivi2_states(q_scale=...)`). It removes XLA's q prep and merge (session 17's profiles: 3.0-6.0 us of glue
# at B=1 / B=8, 1k / 4k, 2 / 4 splits, against kernels of 6-31 us). Off until `benchmarks/runs/session21_a.sh`
# has shown it right and faster on the device (natively only: see `kivi2_states`). Compiled for an H200 on the
# CPU (B=1 1k, 2 splits + the window, `decode_parts/mosaic_sass_aot_kivi_s21.json`): 128 registers against
# 121 and 56 KB of shared memory against 50, 4 programs per SM either way, but its tile loop is 758 SASS
# instructions against 739 (3% more), so it is taken by default (once on) only where all the programs fit one
# wave (KERNEL_MERGE_MAX_PROGRAMS): short contexts and small batches, where the glue is a large share of the
# call.
# Session 22 (H200): every native test of the KIVI merge failed (count and cluster, G=128 and 32; the first
# single case hung past 60 s), so it stays off. Session 23 (H100, `session22_kivi_merge_diag.py`): the query
# read in the kernel is exact; the counted merge does not finish, with or without the window.
# Session 26 (H100, `benchmarks/runs/session26_a.sh`, decode_parts/session26/): with l's TMA destination aligned
# (`mosaic_epilogue.tma_padded`) all 10 native merge tests pass, but through ops it is slower at 1k (KIVI-2 B=1
# 15.2-16.4 us against 13.1 with the separate merge, B=8 18.4-19.9 against 17.5) and at most ~1 us faster at B=1
# 4k: so it stays off.
KERNEL_MERGE = False
KERNEL_MERGE_MAX_PROGRAMS = 4 * 132
# How (`mosaic_epilogue.MERGES`). Session 21 (H100, the FP8 kernel alone at B=8 32k, 4 splits): a cluster of the
# splits 272.8 us against 200.9 without the merge, the last-to-count merge 200.8 (`decode_parts/
# mosaic_sass_fp8_s21b_*_h100.json`); so "count".
MERGE_BY = "count"
# Session 24: the glue left with the window in the kernel and the merge in XLA, for the short contexts where
# it is a large share of the call (session 23, B=1 1k compiled for an H200: 4 launches, `session23/
# hlo_kernels_b1_1k_h200.txt`): the quantized lengths max(L - 128, 0) computed in the kernel from the window's
# (`kivi2_states(lengths=None)`), and the query read as the caller holds it (`q_scale`, exact natively in
# session 23) without the in-kernel merge; and the XLA merge after the kernel (`decode.combine`: at B=8 32k three
# fusions, one at 1k) as the one-kernel Triton merge (`merge.merge_states`, the FP8 path's, reading the states'
# o^T): kernel + merge, 2 launches. H100, through ops, same run as torch SDPA
# (`benchmarks/runs/session24_glue.py`, `decode_parts/session24/b_glue.json`), us, default -> glue -> glue and the
# Triton merge, G=32 / G=128: B=1 1k 13.5 -> 13.0 -> 13.7 / 12.2 -> 11.4 -> 12.1 (torch 9.9); B=8 1k 17.8 -> 17.3
# -> 16.3 / 17.0 -> 17.1 -> 16.2 (16.9); B=1 4k 18.2 -> 17.4 -> 16.7 / 16.3 -> 15.4 -> 14.7 (13.2); B=8 4k 32.1 ->
# 31.9 -> 30.0 / 28.5 -> 28.8 -> 26.7 (50.2); B=8 32k 132.3 -> 127.8 -> 129.5 / 112.8 -> 113.7 -> 112.4 (351.7).
# Identical outputs. So the glue in the kernel everywhere, and the Triton merge except where XLA's is one fusion
# for few programs (`pallas_merge_default`: B=1 1k).
GLUE_IN_KERNEL = True
PALLAS_MERGE = True  # False: always XLA's merge
# The query is read in the kernel at any row count (1-16: heads per KV head x tokens). Session 24 limited it to 4
# rows: at 8 and more, Mosaic GPU's layout inference found no layout for `mosaic_epilogue.load_query_t`'s zero fill
# of the scoped buffer (20-400 s, then "Layout inference failed to find a solution"); since session 25 it masks
# the rows after the load above 4 rows (`mosaic_epilogue.ZERO_FILL_MAX_ROWS`), and 8 and 16 rows build in ~4 s
# (`benchmarks/runs/session24_layout_aot.py`, CPU; natively right at 16 rows).


def pallas_merge_default(batch: int, kv_heads: int, states: int) -> bool:
  """Whether the kernel's states are merged by the Triton kernel (else XLA) by default: unless PALLAS_MERGE is
  off, or there are few (b, k) programs (< 64) with at most 3 states each (B=1 1k: XLA's merge is one fusion)."""
  return PALLAS_MERGE and (batch * kv_heads >= 64 or states > 3)


def auto_window(variant: str | mk.Options, k_res_dtype, v_res_dtype) -> str:
  """The window `decode_attention(window="auto")` takes: "kernel" where the Mosaic kernel can hold it (a
  `dequant_in_a` variant; 16-bit rings, WGMMA operands), else "pallas" (`window_merge`)."""
  opt = variant if isinstance(variant, mk.Options) else mk.VARIANTS.get(variant, mk.Options())
  ok = opt.dequant_in_a and all(jnp.dtype(d) in (jnp.bfloat16, jnp.float16) for d in (k_res_dtype, v_res_dtype))
  return "kernel" if ok else "pallas"


def _grouped(cache) -> bool:
  """G=32, 4-bit codes or head_dim 256: the grouped build's caches (not the e4m3 step's)."""
  return cache.fmt.key.group_size != mk.TILE or cache.fmt.key.bits != 2 or cache.head_dim != mk.TILE


def default_variant(cache) -> str:
  """`decode_attention`'s build for `cache`: DEFAULT_VARIANT for KIVI-2 G=128 at head_dim 128, else GROUPED_VARIANT
  at head_dim 128 and WIDE_HEAD_VARIANT at 256 (lag 0; at head_dim 256 compiled for an H200 on the CPU: 167
  registers, 3 programs per SM, against DEFAULT_VARIANT's 178, 2;
  `decode_parts/session28/sass_aot_head_dim_256.json`)."""
  if not _grouped(cache):
    return DEFAULT_VARIANT
  return GROUPED_VARIANT if cache.head_dim == mk.TILE else WIDE_HEAD_VARIANT


def resolved_window(cache, window: str, variant=None) -> str:
  """The window `decode_attention` uses for `cache`: "auto" resolved by `auto_window` for the variant
  (None: `default_variant`), any other as given."""
  if window != "auto":
    return window
  return auto_window(variant or default_variant(cache), cache.k_res.dtype, cache.v_res.dtype)


TARGET_PROGRAMS = 512  # B=8 x 8 KV heads x 8 splits: the best of 4 / 8 at 32k; 1 x 8 x 32 at B=1
MAX_SPLITS = 32        # the most timed
# Session 17 (H200, profiler spans of the whole call, decode_parts/session17/call4_profile_*.txt, us, by
# splits): B=1 1k 10.9 / 12.3 / 12.3 at 2 / 4 / 8; B=8 1k 15.0 / 16.9 / 19.4; B=1 4k 29.5 / 20.1 / 15.0 /
# 16.2 / 16.7 at 2 / 4 / 8 / 16 / 32; B=8 4k 36.9 / 29.7 / 27.6 / 30.8 at 2 / 4 / 8 / 16: 4 tiles a split.
MIN_TILES_PER_SPLIT = 4
# Large batches (more than TARGET_PROGRAMS / 2 (b, k) pairs) still split a long context: session 26 (H200, 32k,
# `benchmarks/runs/session26_waves.py`, decode_parts/session26/{f,g}_waves_*.json, us by splits 1 / 2 / 4 / 8):
# G=128 B=64 1084.7 / - / 756.6 / 757.8, B=69 1089.6 / 892.6 / 820.2 / 809.0; KIVI-2 G=32 B=52 885.8 / - / 802.4 /
# 743.0. One split had been the rule above 256 pairs (target / pairs < 2), i.e. at issue 7's batches. Up to
# LARGE_BATCH_SPLITS splits of at least LARGE_BATCH_MIN_TILES tiles (4096 tokens), so 4k contexts keep 1.
LARGE_BATCH_SPLITS = 8
LARGE_BATCH_MIN_TILES = 32


def default_splits(batch: int, kv_heads: int, tiles: int, tiles_per_step: int = 1,
                   min_tiles: int = MIN_TILES_PER_SPLIT, *, target: int = TARGET_PROGRAMS, divides: bool = True,
                   large_batch: bool = True) -> int:
  """Splits of the context for `batch` x `kv_heads` programs over `tiles` 128-token tiles: the largest
  power of two <= target / programs (and MAX_SPLITS) that leaves each split at least `min_tiles` tiles
  and (divides) divides the tiles into whole steps (1 split where the tiles are fewer). With `large_batch`,
  above target / 2 programs, at least the largest power of two <= LARGE_BATCH_SPLITS that leaves each split
  LARGE_BATCH_MIN_TILES tiles (and divides them). `mosaic_fp8.splits_for` is this with its own target,
  divides=False (its splits share the live steps, whole or not) and large_batch=False (not timed)."""
  pairs = max(1, batch * kv_heads)
  cap, least = min(MAX_SPLITS, target // pairs), min_tiles
  if large_batch and 2 * pairs > target:
    cap, least = LARGE_BATCH_SPLITS, max(min_tiles, LARGE_BATCH_MIN_TILES)
  ns = 1
  while (ns * 2 <= cap and (not divides or tiles % (ns * 2 * tiles_per_step) == 0)
         and tiles // (ns * 2) >= least):
    ns *= 2
  return ns


def supports(cache) -> str | None:
  """None when the Mosaic path takes this cache, else why not."""
  fmt = cache.fmt
  if not fmt.is_kivi:
    return f"format {fmt} is not KIVI"
  k, v = fmt.key, fmt.value
  if not (isinstance(k, KIVISpec) and isinstance(v, KIVISpec) and k.bits == v.bits and k.bits in BITS):
    return f"keys and values must both be KIVI with bits in {BITS}"
  if k.group_size != v.group_size or k.group_size not in GROUPS or fmt.residual != mk.TILE:
    return (f"group sizes must be equal and in {GROUPS}, the residual {mk.TILE}, got {k.group_size}, {v.group_size}, "
            f"{fmt.residual}")
  if cache.head_dim not in mk.HEAD_DIMS:
    return f"head_dim must be in {mk.HEAD_DIMS}, got {cache.head_dim}"
  if fmt.sink:
    return "sink tokens are not supported"
  if cache.num_layers is not None:
    return "one layer at a time (index the stacked cache)"
  return None


def repack(cache):
  """The cache's KIVI-2 arrays as `kivi2_states` takes them: (kc, ks, kz, vc, vs, vz). Free for a
  "words" cache (reshapes); a full pass over the codes for a planar one."""
  if cache.k.layout == "words" and cache.v.layout == "words":
    b, kh, s, _ = cache.v.codes.shape
    kc, vc = cache.k.codes, cache.v.codes.reshape(b, kh, s // mk.TILE, cache.head_dim, -1)
  else:
    kc = mk.pack_keys(quant.unpacked_codes(cache.k), cache.fmt.key.bits)
    vc = mk.pack_values(quant.unpacked_codes(cache.v), cache.fmt.value.bits)
  one_group = cache.fmt.value.group_size == cache.head_dim
  per_token = (lambda x: x[..., 0]) if one_group else (lambda x: x)  # [B, K, S(, H / G)]
  return kc, cache.k.scale, cache.k.zero, vc, per_token(cache.v.scale), per_token(cache.v.zero)


def _window_keys(kc, ks, kz, tok):
  """Dequantized keys [B, K, R, H] at token indices tok [B, R] from the kernel's key layout."""
  words = jnp.take_along_axis(kc, tok[:, None, :, None], axis=2)  # [B, K, R, 16]
  codes = mk.unpack_keys(words, kc.shape[-1] * 16 // ks.shape[-1])  # H bits / 16 words a row
  g = (tok // (kc.shape[2] // ks.shape[2]))[:, None, :, None]  # the token's key group
  s = jnp.take_along_axis(ks, g, axis=2).astype(jnp.float32)
  z = jnp.take_along_axis(kz, g, axis=2).astype(jnp.float32)
  return codes.astype(jnp.float32) * s + z


def window_states(q, cache, kc, ks, kz, num_queries: int = 1):
  """Split state of the residual window: q [B, K, rows, H] f32 (already x scale x log2 e; row h T + t
  is query token t, at position L - T + t) -> (o [B, K, 1, rows, H], m, l [B, K, 1, rows]), m in the
  log2 domain."""
  r = cache.fmt.residual
  lengths = cache.lengths
  start = jnp.maximum(lengths - r, 0)
  tok = start[:, None] + jnp.arange(r)[None, :]  # [B, R]
  qpos = lengths[:, None] - num_queries + jnp.arange(q.shape[2])[None, :] % num_queries  # [B, rows]
  visible = (tok[:, None, :] <= qpos[:, :, None])[:, None]  # [B, 1, rows, R]
  tok = jnp.where(tok < lengths[:, None], tok, 0)
  lq = (lengths - lengths % r)[:, None]
  k_res = jnp.take_along_axis(cache.k_res.astype(jnp.float32),
                              jnp.clip(tok - lq, 0, r - 1)[:, None, :, None], axis=2)
  keys = jnp.where((tok < lq)[:, None, :, None], _window_keys(kc, ks, kz, tok), k_res)
  values = jnp.take_along_axis(cache.v_res.astype(jnp.float32), (tok % r)[:, None, :, None], axis=2)
  s = jnp.einsum("bknh,bkth->bknt", q, keys)
  s = jnp.where(visible, s, mk.NEG)
  m = jnp.max(s, axis=-1)
  p = jnp.where(visible, jnp.exp2(s - m[..., None]), 0.0)
  o = jnp.einsum("bknt,bkth->bknh", p, values)
  return o[:, :, None], m[:, :, None], jnp.sum(p, axis=-1)[:, :, None]


def decode_attention(q, cache, *, sm_scale: float | None = None, num_splits: int | None = None,
                     variant: str | mk.Options | None = None, interpret: bool = False,
                     window: str = DEFAULT_WINDOW, kernel_merge: bool | None = None,
                     glue_in_kernel: bool | None = None, pallas_merge: bool | None = None,
                     logit_softcap: float | None = None, sliding_window: int | None = None):
  """q [B, N, T, H] -> [B, N, T, H] attention over a KIVI-2 G=128 or 32 cache: T query tokens at positions
  L - T + t (the last T cached; causal among them), N / K x T <= 16 rows per KV head.
  variant: the kernel's build (`mosaic_kivi.VARIANTS` or an `Options`); None: DEFAULT_VARIANT (KIVI-2 G=128)
  or GROUPED_VARIANT (G=32, or 4-bit).
  num_splits: None picks `default_splits`. window (`WINDOWS`), where the residual window's state is
  computed and the states merged: "auto" (`auto_window`: "kernel" where it can), "pallas", the window and the merge in one Pallas kernel
  (`window_merge`); "kernel", the window as one more program of the Mosaic kernel, merged in XLA
  (`decode.combine`); "xla", the window and the merge in XLA (`window_states`).
  kernel_merge: with the window in the kernel, its NS + 1 states merged there too (as `MERGE_BY`), where they
  are at most `mosaic_epilogue.CLUSTER_MAX`; None: `KERNEL_MERGE` where the programs fit one wave
  (`KERNEL_MERGE_MAX_PROGRAMS`).
  glue_in_kernel: with the window in the kernel and the merge outside it, the quantized lengths and the query's
  scale, transpose and pad done in the kernel (no XLA op before the call); None: `GLUE_IN_KERNEL`.
  pallas_merge: with the window in the kernel and the merge outside it, the merge as one Triton kernel
  (`merge.merge_states`) rather than XLA's; None: `pallas_merge_default`.
  logit_softcap, sliding_window: `kvjax.attention.decode_attention`'s logit_softcap and window (Gemma 2's
  soft-cap, a local layer's window), both inside the kernel: they need the window "kernel" ("auto" where it
  resolves so)."""
  if (why := supports(cache)) is not None:
    raise ValueError(f"cache: {why}")
  if window not in WINDOWS:
    raise ValueError(f"window must be one of {WINDOWS}, got {window!r}")
  kh = cache.num_kv_heads
  if q.ndim != 4 or q.shape[1] % kh or q.shape[1] // kh * q.shape[2] > mk.ROWS or q.shape[3] != cache.head_dim:
    raise ValueError(f"q must be [B, N, T, {cache.head_dim}] with N a multiple of the {kh} KV heads and "
                     f"N / {kh} x T <= {mk.ROWS} query rows per KV head, got {q.shape}")
  b, n, t, h = q.shape
  grouped = _grouped(cache)  # G=32, 4-bit or head_dim 256
  if variant is None:
    variant = default_variant(cache)
  opt = variant if isinstance(variant, mk.Options) else mk.VARIANTS.get(variant, mk.Options())
  if opt.timing_only:
    raise ValueError(f"variant: Options.timing_only={opt.timing_only!r} makes wrong attention (a timing "
                     "diagnostic for benchmarks/mosaic_sass.py); decode_attention needs it ''")
  if num_splits is None:
    num_splits = default_splits(b, kh, cache.capacity // mk.TILE, opt.tiles_per_step)
  window = resolved_window(cache, window, variant)
  if logit_softcap is not None and not (isinstance(logit_softcap, (int, float)) and logit_softcap > 0):
    raise ValueError(f"logit_softcap must be a positive number or None, got {logit_softcap!r}")
  if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
    raise ValueError(f"sliding_window must be a positive integer or None, got {sliding_window!r}")
  if (logit_softcap is not None or sliding_window is not None) and window != "kernel":
    raise ValueError(f"logit_softcap / sliding_window are applied inside the kernel: they need window 'kernel' "
                     f"(or 'auto' resolving to it), got {window!r}")
  if grouped and window == "pallas":
    raise ValueError("window 'pallas' (window_merge) reads 2-bit G=128 keys of 128 channels; a G=32, 4-bit or "
                     "head_dim 256 cache takes 'kernel' or 'xla'")
  scale = (h ** -0.5 if sm_scale is None else sm_scale) * decode.LOG2E
  # The merged rows 16-bit only (session 24, compiled: f32 rows fail layout inference, `benchmarks/NOTES_gpu.md`).
  merge_here = (KERNEL_MERGE and b * kh * (num_splits + 1) <= KERNEL_MERGE_MAX_PROGRAMS
                if kernel_merge is None else kernel_merge) and window == "kernel" \
      and epilogue.cluster_merge_ok(num_splits + 1) and jnp.dtype(q.dtype).itemsize == 2 and h == 128
  glue = (GLUE_IN_KERNEL if glue_in_kernel is None else glue_in_kernel) and window == "kernel"
  if pallas_merge is None:
    pallas_merge = pallas_merge_default(b, kh, num_splits + 1)
  pallas_merge = pallas_merge and window == "kernel"
  return _decode(q, cache, jnp.asarray(scale, jnp.float32), num_splits=num_splits, variant=variant,
                 interpret=interpret, window=window, merge_by=MERGE_BY if merge_here else None, glue=glue,
                 pallas_merge=pallas_merge, softcap=None if logit_softcap is None else float(logit_softcap),
                 sliding=None if sliding_window is None else int(sliding_window))


# A jit of its own: a model calls this once per layer, and nested jits of one signature are traced and
# lowered once (Mosaic GPU's lowering takes ~2 s a call on a CPU core: 32 layers unrolled took longer
# than the 120 s a session-12 throughput row allowed).
@functools.partial(jax.jit, static_argnames=("num_splits", "variant", "interpret", "window", "merge_by", "glue",
                                             "pallas_merge", "softcap", "sliding"))
def _decode(q, cache, scale, *, num_splits, variant, interpret, window, merge_by=None, glue=False,  # noqa: PLR0913
            pallas_merge=False, softcap=None, sliding=None):
  b, n, t, h = q.shape
  kh = cache.num_kv_heads
  rep = n // kh * t  # query rows per KV head: head-major, then token
  qs = q.astype(jnp.float32).reshape(b, kh, rep, h) * scale  # [B, K, rep, H]
  kc, ks, kz, vc, vs, vz = repack(cache)
  q_t = jnp.pad(qs.swapaxes(-1, -2), ((0, 0), (0, 0), (0, 0), (0, mk.ROWS - rep)))
  in_kernel = (cache.lengths, cache.k_res, cache.v_res, t) if window == "kernel" else None
  quantized_lengths = jnp.maximum(cache.lengths - cache.fmt.residual, 0)
  if merge_by:  # q as it is, the window's state and the merge in the kernel: the attention itself
    out = mk.kivi2_states(q.reshape(b, kh, rep, h), None, kc, ks, kz, vc, vs, vz,
                          num_splits=num_splits, variant=variant, interpret=interpret, window=in_kernel,
                          merged=(rep, q.dtype), q_scale=scale, merge_by=merge_by, softcap=softcap,
                          sliding=sliding)
    return out.reshape(b, n, t, h)
  # glue: the cache's lengths (the kernel subtracts) and the query as it is (the kernel scales and pads)
  o_t, m, l = mk.kivi2_states(q.reshape(b, kh, rep, h) if glue else q_t, None if glue else quantized_lengths,
                              kc, ks, kz, vc, vs, vz, num_splits=num_splits, variant=variant, interpret=interpret,
                              window=in_kernel, q_scale=scale if glue else None, softcap=softcap, sliding=sliding,
                              live_rows=rep)
  if window == "kernel" and pallas_merge:  # NS + 1 states, the window's last, merged by one Triton kernel
    out = merge.merge_states(o_t, m, l, rep, q.dtype, interpret=interpret, transposed=True)[:, :, :rep]
    return out.reshape(b, n, t, h)
  if window == "kernel":  # NS + 1 states, the window's last
    out = decode.combine(o_t.swapaxes(-1, -2), m, l, rep)
    return out.reshape(b, n, t, h).astype(q.dtype)
  if window == "pallas":
    out = window_merge.window_merge(q_t, cache.lengths, kc, ks, kz, cache.k_res, cache.v_res, o_t, m, l,
                                    q.dtype, num_queries=t, interpret=interpret)[:, :, :rep]
    return out.reshape(b, n, t, h)
  ow, mw, lw = window_states(qs, cache, kc, ks, kz, t)
  o = jnp.concatenate([o_t.swapaxes(-1, -2)[:, :, :, :rep], ow], axis=2)
  out = decode.combine(o, jnp.concatenate([m[..., :rep], mw], axis=2),
                       jnp.concatenate([l[..., :rep], lw], axis=2), rep)
  return out.reshape(b, n, t, h).astype(q.dtype)
