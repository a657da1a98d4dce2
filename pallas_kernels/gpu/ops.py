"""kvjax cache -> Pallas GPU decode kernels: format checks, tiling choice, pre/post scaling.

`decode_attention(q, cache, **options)` is the "pallas_gpu" implementation
registered with `kvjax.dispatch`. It raises `NotImplementedError` for
configurations the kernels do not tile, so dispatch falls back to XLA.
`backend_call` is the single seam a Mosaic GPU backend would replace.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from kvjax.cache import KVCache
from kvjax.formats import FP8Spec, IntSpec, Passthrough
from pallas_kernels.gpu import decode, kivi, merge, mosaic_decode, mosaic_kivi
from pallas_kernels.gpu import mosaic_fp8 as mfp8

__all__ = ["decode_attention", "plan_for", "default_splits", "quant_target", "tiled_splits", "default_warps"]

NUM_SMS = 132  # H200; only steers the split heuristic
MAX_ROWS = 64
# Sweep on the H200 (B=8, 32k, benchmarks/NOTES_gpu.md): quantized formats gain from more
# splits (32 at B=8: fp8 253 -> 212 us, kivi2 808 -> 675 us) and 3 pipeline stages.
QUANT_TARGET = 16 * NUM_SMS
QUANT_STAGES = 3
# Session-7 num_splits sweep at short contexts (H200, fp8 e4m3, block 64, decode_parts/decode_s7_splits.json):
# the QUANT_TARGET split count leaves 1-2 blocks per program there, and the merge and per-program setup
# dominate. B=8 1k: 16 splits 18.5 us, 8: 15.3, 4: 14.7; B=8 4k: 33 splits 43.6, 8: 33.6; B=1 32k:
# 264 splits 45.0, 64: 33.9; B=1 4k: 64 splits 13.5, 16: 16.5 (there parallelism wins). So the target
# drops to total blocks / SHORT_BLOCKS programs, not below 4 per SM (`quant_target`); from B=8 at 32k
# up (>= 16896 blocks) nothing changes. KIVI (128-token blocks) was near its optimum everywhere swept.
SHORT_BLOCKS = 8
# Values in tiles (4 warps, 112 registers: 4 programs per SM, one wave = TILED_WAVE programs). Session-9
# num_splits sweep (H200, decode_parts/decode_s9_splits.json, decode_s9_short.json): at B=8, 32k one wave
# (8 splits, 512 programs) 136.7 us against 146.0 for QUANT_TARGET's 33 splits and 139.7 for 16; B=8 128k
# 514 vs 508 (33); B=64 32k 4 splits 1005 vs 1017 (5), 1027 (8); B=1 32k 66 splits (one wave) best. Where
# the whole cache is under TILED_SHORT blocks, half a wave (about 2 programs per SM, fewer programs with
# more blocks each) wins: B=8 1k 4 splits 12.2 us vs 13.9 (8) and 14.6 (9, the old rule); B=8 2k 4 splits
# 17.2 vs 19.0 (8); B=16 1k 3 splits 16.1, 2: 16.6, 4: 16.7. `tiled_splits` is that rule, and at most
# TILED_SHORT_SPLITS splits in that regime: B=1 4k 16 splits 13.0 us vs 14.5 for half a wave's 33,
# B=1 8k 16.7 vs 17.1 (call 2, decode_s9_short2.json; the merge's cost grows with the splits).
TILED_WAVE = 4 * NUM_SMS
TILED_SHORT = 16 * NUM_SMS
TILED_SHORT_SPLITS = 16
# The split merge: the one-kernel `merge.merge_states` or XLA's (`decode.combine`, 3-4 small fusions).
# Session 9's kernel (one program per (b, k) walking the splits) lost at B=1 (4k 14.5 vs 13.4 us). Session
# 10's (one program per (b, k, column block), every split loaded at once) against XLA, same run, fp8 / int8
# (decode_parts/decode_s10_merge.json): B=1 1k 6.4 / 7.7 vs 7.8 / 7.8 us, 4k 11.5 / 12.2 vs 11.8 / 12.6,
# 8k 15.0 / 15.9 vs 15.5 / 17.0, 32k 27.6 / 30.0 vs 29.0 / 31.2; B=8 4k 26.4 / 28.6 vs 26.8 / 29.2, 32k
# 137.8 / 161.3 vs 140.5 / 159.9; but B=8 1k (4 splits) 12.4 / 13.1 vs 11.6 / 12.0. Call 3
# (decode_s10_sweep3.json): B=8 1k again 12.5 vs 11.6; B=64 4k (1 split) 135.0 vs 133.9 (even), B=64 32k
# (1 split) 1046.9 vs 1129.9 (session 9: 997.7 vs 1017.3). So XLA merges only where there are many (b, k)
# pairs (>= XLA_MERGE_MIN_PROGRAMS) with 2 to XLA_MERGE_MAX_SPLITS splits each.
XLA_MERGE_MIN_PROGRAMS = 64
XLA_MERGE_MAX_SPLITS = 4


def merge_in_kernel(batch: int, kv_heads: int, splits: int) -> bool:
  """Default merge on a GPU: the kernel, but XLA's for many (b, k) pairs with 2-4 splits each."""
  return not (batch * kv_heads >= XLA_MERGE_MIN_PROGRAMS and 2 <= splits <= XLA_MERGE_MAX_SPLITS)


# Variant sweep on the H200 (B=8, 32k, session 3, benchmarks/results/decode_parts/decode_s3.json):
# 8-bit tensor-core q.k pays off for INT8 codes (241 -> 207 us) but not for FP8 e4m3, whose
# fp8 -> fp16 upcast is native (208 -> 216 us); narrow p.v loses for both (222 / 268 us).
NARROW_QK_KINDS = frozenset({"i8"})  # key kinds whose q.k runs as 8-bit dots by default
NARROW_PV = False
# KIVI: looping over key tiles beats unrolling each R-block everywhere (kivi2 615 -> 429 us,
# kivi2 G128 445 -> 355, kivi4 624 -> 439) and shrinks the Triton program 2.7x. Joined value
# tiles: noise with the loop for G32 (429 -> 426 us), slower for G128 (355 -> 407): off.
JOIN_VALUES = False
TILE_LOOP = True
# Triton pipelines (cp.async) only the code tiles: a [block] bf16 scale vector is 2 bytes per
# thread, below cp.async's 4, so it stays a synchronous load in the loop (checked in the TTGIR of
# the kernels compiled for sm_90 on the CPU). `prefetch` = d issues scale loads d blocks ahead.
# Session-4 sweep (H200, B=8, 32k, decode_parts/decode_s4.json): one block ahead wins for every
# per-token format (fp8 e4m3 232 -> 203 us, int8 215 -> 194, int4 202 -> 188), two ahead loses
# (cause not analysed); with 64-token blocks (136 instead of 190 registers per thread for fp8, 3 programs per
# SM instead of 2) fp8 e4m3 reaches 183 us, e5m2 183, int8 188. KIVI: one tile ahead for G=32
# (kivi2 426 -> 404 us, kivi4 436 -> 404), none for G=128 (351 -> 385).
PREFETCH = 1
KIVI_PREFETCH = {32: 1}  # KIVI key group -> tiles ahead (others: 0)
QUANT_BLOCK = 64  # tokens per block for quantized per-token formats
FLAT_BLOCK = 128  # bf16
# 2/4-bit codes unpacked 4 bytes per inline-PTX sequence (shift, lop3 into fp16 pairs, prmt) instead
# of byte by byte (PRMT/LOP3/SHF were 277 of KIVI-2's 749 loop instructions, sm_90 SASS compiled on
# the CPU). GPU only (no interpret mode).
PACKED_UNPACK = True
# Session-5 sweep (H200, B=8, 32k, decode_parts/decode_s5.json; all variants GPU-checked first):
# packed unpacking int4 187 -> 161 us, kivi2_g128 357 -> 344, kivi4 407 -> 381; two warps per
# program fp8 e4m3 182 -> 172, int8 189 -> 181, kivi4 407 -> 366, kivi2 409 -> 364 (356 with packed
# unpacking); G=128 loses with two warps (373). Interpret mode turns packed unpacking off.
# Confirmed in the second call (decode_s5b.json): fp8 172 us (183 with 4 warps), int8 182 (189),
# kivi2 356 (365), kivi4 362 (380); int4 with two warps as well 161 -> 155 us.
FLAT_WARPS = {"f8": 2, "i8": 2, "i4": 2}  # key kind of the per-token kernels -> warps (others: 4)
# Value codes in tiles (`QArray.tile`, the GPU default layout; H200, B=8, 32k): fp8 e4m3 157.1 us
# with two warps, 147.8 with four, 226.1 with eight; int8 179.6 / 172.1 / 223.3 (session 8,
# decode_parts/decode_s8_b8.json; session 7's decode_s7_value_t_tiled.json agrees). So four warps.
TILED_WARPS = 4
KIVI_WARPS = {32: 2}  # KIVI key group -> warps (others: 4)
# KIVI values with the per-token scale folded into p and the zero into one row sum per group
# (`KiviPlan.fold_value_scales`): no per-element scale FMA or offset subtraction in the p.v path.
# Timed in session 10 (H200, B=8 32k, decode_parts/decode_s10_check.json): kivi2_g128 321.5 us folded vs
# 342.7 (session 9's CPU-compiled loop 675 -> 628 instructions). For G=32 (four value groups per token)
# the compiled loop grows (1032 -> 1342), so it stays off there. Value group -> fold.
FOLD_VALUE_SCALES = {128: True}
# The two-warp entries above were measured at head_dim 128. A program's registers per thread grow
# with head_dim / warps: at head_dim 256 (Gemma-2-2B heads, B=24, 32k; session 6,
# decode_parts/decode_gemma_s6.json) two warps ran FP8 at 874 us and four at 544 us (int8 637 -> 601),
# so below four warps the count scales with head_dim / 128.
WARPS_HEAD_DIM = 128


def default_splits(batch, kv_heads, num_blocks, target=4 * NUM_SMS):
  """Enough (b, k, split) programs to fill the GPU a few times over."""
  return int(max(1, min(num_blocks, -(-target // (batch * kv_heads)))))


def quant_target(batch, kv_heads, num_blocks):
  """Programs to aim for with the per-token quantized kernels: QUANT_TARGET, but where that would
  leave under SHORT_BLOCKS blocks per program (short contexts, small batches), fewer programs, down
  to 4 per SM."""
  return min(QUANT_TARGET, max(4 * NUM_SMS, batch * kv_heads * num_blocks // SHORT_BLOCKS))


def tiled_splits(batch, kv_heads, num_blocks):
  """Splits for the tiled-value kernels: one wave of programs (TILED_WAVE); where the cache has under
  TILED_SHORT blocks in all, half a wave and at most TILED_SHORT_SPLITS; at least one split, at most
  one per block."""
  if batch * kv_heads * num_blocks >= TILED_SHORT:
    return int(max(1, min(num_blocks, TILED_WAVE // (batch * kv_heads))))
  return int(max(1, min(num_blocks, TILED_SHORT_SPLITS, TILED_WAVE // 2 // (batch * kv_heads))))


def _kind(spec, role):
  if isinstance(spec, Passthrough):
    if spec.dtype != "bfloat16":
      raise NotImplementedError(f"pallas_gpu: {role} passthrough dtype {spec.dtype} (only bfloat16)")
    return "bf16"
  if isinstance(spec, FP8Spec):
    return "f8"
  if isinstance(spec, IntSpec):
    return "i8" if spec.bits == 8 else "i4"
  raise NotImplementedError(f"pallas_gpu: {role} spec {type(spec).__name__}")


def _value_c(spec):
  if isinstance(spec, FP8Spec):
    return float(spec.max)
  if isinstance(spec, IntSpec):
    return float(spec.qmax)
  return 1.0


def _narrow_ok(spec):
  """8-bit x 8-bit tensor-core dots exist for e4m3 and int8 codes (not e5m2: 2 mantissa bits)."""
  return ((isinstance(spec, FP8Spec) and spec.dtype == "e4m3")
          or (isinstance(spec, IntSpec) and spec.bits == 8))


def plan_for(cache: KVCache, num_queries: int, rows: int, *, num_splits=None, block=None,
             softcap=None, window=None, narrow_qk=None, narrow_pv=None, join_values=None,
             tile_loop=None, prefetch=None, packed_unpack=None, fold_value_scales=None):
  """The static kernel plan for `cache`, or NotImplementedError.

  narrow_qk / narrow_pv: run q.k / p.v as 8-bit tensor-core dots on the stored e4m3 or int8
  codes (the other operand split in two 8-bit terms). join_values: KIVI value planes interleaved
  into one tile per key tile (needs a value group covering a whole plane). tile_loop: KIVI's loop
  steps one key tile instead of one unrolled R-block. prefetch: scales loaded this many blocks
  (KIVI: tiles, with tile_loop) ahead. packed_unpack: 2/4-bit codes unpacked by inline PTX (GPU
  only). block: tokens per block of the per-token kernels (a power of two dividing the capacity).
  None = the module default (NARROW_QK_KINDS, NARROW_PV, JOIN_VALUES, TILE_LOOP, PREFETCH /
  KIVI_PREFETCH, QUANT_BLOCK, PACKED_UNPACK: the measured winners). Value codes stored in tiles
  (``cache.v.tile``, the GPU default for FP8 / INT8) are read a tile per block: the block is the
  tile (an explicit different `block` is an error).
  """
  fmt = cache.fmt
  window = None if window is None else int(window)
  if fmt.sink:
    raise NotImplementedError(f"pallas_gpu: full-precision sink tokens (sink={fmt.sink})")
  b, kh, s, h = cache.batch, cache.num_kv_heads, cache.capacity, cache.head_dim
  if h % 32 or h > 256 or h & (h - 1):
    raise NotImplementedError(f"pallas_gpu: head_dim {h} (needs a power of two in [32, 256])")
  tile = cache.v.tile
  if fmt.is_kivi:
    ks, vs = fmt.key, fmt.value
    r = fmt.residual
    if fmt.residual_dtype != "bfloat16":
      raise NotImplementedError("pallas_gpu: KIVI residual_dtype must be bfloat16")
    if num_queries > r:
      raise NotImplementedError(f"pallas_gpu: {num_queries} query tokens > residual {r}")
    plan = kivi.KiviPlan(key_bits=ks.bits, key_group=ks.group_size, value_bits=vs.bits,
                           value_group=vs.group_size, residual=r, num_queries=num_queries,
                           rows=rows, num_splits=1, softcap=softcap,
                           window=window)
    ku, vu = plan.key_unit, plan.value_unit(h)
    if ku < 16 or ku & (ku - 1) or vu < 16 or vu & (vu - 1) or r > 256:
      raise NotImplementedError(
          f"pallas_gpu: KIVI tiles of {ku} tokens x {vu} channels (need powers of two >= 16, "
          f"R <= 256); group sizes {ks.group_size}/{vs.group_size}, R {r}")
    if cache.k.block != r or (cache.v.block not in (0, h)):
      raise NotImplementedError("pallas_gpu: unexpected KIVI packing blocks")
    ns = num_splits or default_splits(b, kh, s // r, QUANT_TARGET)
    if fold_value_scales is None:  # the default yields to joined values asked for
      fold = FOLD_VALUE_SCALES.get(vs.group_size, False) and not join_values
    else:
      fold = fold_value_scales
    if fold and join_values:
      raise ValueError("fold_value_scales and join_values are exclusive (folding keeps one value "
                       "tile per channel group)")
    join = ((JOIN_VALUES if join_values is None else join_values) and not fold
            and plan.value_unit(h) == h * vs.bits // 8)
    loop = TILE_LOOP if tile_loop is None else tile_loop
    return plan.__class__(**{**plan.__dict__, "num_splits": ns, "join_values": bool(join),
                             "tile_loop": bool(loop),
                             "prefetch": (int(KIVI_PREFETCH.get(ks.group_size, 0) if prefetch is None
                                              else prefetch) if loop else 0),
                             "packed_unpack": bool(PACKED_UNPACK if packed_unpack is None else packed_unpack),
                             "fold_value_scales": bool(fold)})
  kk, vk = _kind(fmt.key, "key"), _kind(fmt.value, "value")
  if tile and (vk not in ("f8", "i8") or tile < 16 or tile & (tile - 1)):
    raise NotImplementedError(f"pallas_gpu: value codes in tiles of {tile} tokens ({fmt.value}; "
                              "needs FP8 / INT8 and a power-of-two tile >= 16)")
  if tile and block not in (None, tile):
    raise ValueError(f"block must equal the cache's value tile ({tile} tokens: the kernel reads one "
                     f"tile per block), got {block}")
  block = tile or block
  for spec, role in ((fmt.key, "key"), (fmt.value, "value")):
    if isinstance(spec, IntSpec) and spec.bits == 4 and cache.__getattribute__(role[0]).block != h:
      raise NotImplementedError("pallas_gpu: int4 must be packed in blocks of head_dim")
  if block is None:
    pref = FLAT_BLOCK if kk == vk == "bf16" else QUANT_BLOCK
    block = next((c for c in (pref, 128, 64, 32, 16) if c <= s and s % c == 0), None)
    if block is None:
      raise NotImplementedError(f"pallas_gpu: capacity {s} not a multiple of 16")
  elif block < 16 or block & (block - 1) or s % block:
    raise ValueError(f"block must be a power of two >= 16 dividing the cache capacity {s}, got {block}")
  if num_splits:
    ns = num_splits
  elif tile:
    ns = tiled_splits(b, kh, s // block)
  else:
    ns = default_splits(b, kh, s // block, 4 * NUM_SMS if kk == vk == "bf16" else quant_target(b, kh, s // block))
  narrow_qk = (kk in NARROW_QK_KINDS) if narrow_qk is None else narrow_qk
  narrow_pv = NARROW_PV if narrow_pv is None else narrow_pv
  return decode.FlatPlan(
      key_kind=kk, value_kind=vk,
      key_scaled=isinstance(fmt.key, (FP8Spec, IntSpec)) and not getattr(fmt.key, "static", False),
      value_scaled=isinstance(fmt.value, (FP8Spec, IntSpec)) and not getattr(fmt.value, "static", False),
      value_c=_value_c(fmt.value), num_queries=num_queries, rows=rows, block=block,
      num_splits=ns, softcap=softcap, window=window,
      narrow_qk=bool(narrow_qk) and _narrow_ok(fmt.key),
      narrow_pv=bool(narrow_pv) and _narrow_ok(fmt.value),
      prefetch=int((0 if kk == vk == "bf16" else PREFETCH) if prefetch is None else prefetch),
      packed_unpack=bool(PACKED_UNPACK if packed_unpack is None else packed_unpack) and "i4" in (kk, vk),
      value_t=bool(tile))


def default_warps(plan, head_dim: int = WARPS_HEAD_DIM) -> int:
  """Warps per program for `plan` at `head_dim` (FLAT_WARPS / KIVI_WARPS, measured at
  WARPS_HEAD_DIM; fewer than four warps scale up with head_dim, to at most four)."""
  if isinstance(plan, kivi.KiviPlan):
    w = KIVI_WARPS.get(plan.key_group, 4)
  elif plan.value_t:
    w = TILED_WARPS
  else:
    w = FLAT_WARPS.get(plan.key_kind, 4) if plan.key_kind == plan.value_kind else 4
  return w if w >= 4 else min(4, w * max(1, head_dim // WARPS_HEAD_DIM))


def _per_token(scale, b, kh, s):
  return scale.reshape(b, kh, s)  # [B, K, S, 1] -> [B, K, S]: a bitcast, no copy


def backend_call(q, cache: KVCache, plan, *, interpret=False, num_warps=4, num_stages=2):
  """Runs the kernel for `plan`; returns per-split (o, m, l). The Mosaic-replaceable seam."""
  b, kh, s = cache.batch, cache.num_kv_heads, cache.capacity
  if isinstance(plan, kivi.KiviPlan):
    o, m, l = kivi.kivi_decode(
        q, cache.lengths, cache.k.codes, cache.k.scale, cache.k.zero, cache.v.codes,
        cache.v.scale, cache.v.zero, cache.k_res, cache.v_res, plan=plan,
        num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    if plan.join_values:  # quantized splits hold joined columns; the residual split is in order
      order = np.argsort(plan.joined_channel_order(cache.head_dim))  # static inverse permutation
      o = jnp.concatenate([o[:, :, :-1][..., order], o[:, :, -1:]], axis=2)
    return o, m, l
  ksc = _per_token(cache.k.scale, b, kh, s) if plan.key_scaled else None
  vsc = _per_token(cache.v.scale, b, kh, s) if plan.value_scaled else None
  vcodes = cache.v.codes
  if plan.value_t:  # tiles of `block` tokens: [B, K, S, H] bytes as [B, K, S / block * H, block]
    vcodes = vcodes.reshape(b, kh, s // plan.block * cache.head_dim, plan.block)
  return decode.flat_decode(q, cache.lengths, cache.k.codes, vcodes, ksc, vsc, plan=plan,
                            num_warps=num_warps, num_stages=num_stages, interpret=interpret)


# FP8 through the Mosaic GPU kernel (`mosaic_fp8`, session 18; timed in session 19): at parity with the Triton
# kernel, not past it (B=8 32k 148.1 us over the cache's 64-token value tiles, 138.6 over 128-token tiles,
# Triton 138.7-140.5), so the Triton kernel stays the default (`mosaic_fp8=True` asks for it).
MOSAIC_FP8 = False
# FP8 caches that go to the Mosaic kernel by default (MOSAIC_FP8 aside): head_dim -> the least capacity. Session 32
# gave it Gemma-2's 256 with the soft-cap and sliding window; on an H100 (`decode_parts/session32/`), the attention
# alone, us, Triton's kernel -> Mosaic's 64-token build: B=24 32k 688.3 -> 596.8 (4096-token window 95.7 -> 87.1),
# B=1 32k 60.8 -> 36.0; but B=195 4k 517.7 -> 545.4 and B=1 4k 14.3 -> 19.6 (Triton's at 0.99 of the stream).
MOSAIC_FP8_MIN_CAPACITY: dict[int, int] = {256: 16384}
# INT8 caches (per-token scales, tiled values) through the same Mosaic kernel by default, as the two above (codes
# converted by `Fp8Options.int8_prmt`). Session 34 on an H100 (`decode_parts/session34/`), the attention alone, us,
# Triton's INT8 kernel -> Mosaic's 64-token build: Gemma-2 heads B=24 32k 703.3 -> 572.1, B=1 32k 65.7 -> 37.5;
# Llama-3-8B heads B=8 32k 193.6 -> 200.3 (Triton's stays at head_dim 128).
MOSAIC_INT8 = False
MOSAIC_INT8_MIN_CAPACITY: dict[int, int] = {256: 16384}


def _mosaic_8bit_by_default(cache) -> bool:
  """Whether the cache's format and capacity send it to the Mosaic FP8 kernel when no kernel is named."""
  key = cache.fmt.key
  if isinstance(key, FP8Spec):
    on, least = MOSAIC_FP8, MOSAIC_FP8_MIN_CAPACITY
  elif isinstance(key, IntSpec) and key.bits == 8:
    on, least = MOSAIC_INT8, MOSAIC_INT8_MIN_CAPACITY
  else:
    return False
  return on or cache.capacity >= least.get(cache.head_dim, 1 << 62)


def _mosaic_refusals(q, cache, triton_options, kernel):
  """NotImplementedError (so `dispatch` falls back) for what neither Mosaic kernel takes: Triton-kernel
  options, more than 16 query rows (heads per KV head x tokens)."""
  set_opts = sorted(k for k, v in triton_options.items() if v is not None)
  if set_opts:
    raise NotImplementedError(f"pallas_gpu: options {set_opts} tune the Triton kernels, not {kernel}")
  b, n, t, h = q.shape
  if n // cache.num_kv_heads * t > mosaic_kivi.ROWS:
    raise NotImplementedError(f"pallas_gpu: {kernel} takes at most {mosaic_kivi.ROWS} query rows (heads per KV "
                              f"head x tokens) per KV head, got q {q.shape}")


def _mosaic_fp8_attention(q, cache, sm_scale, softcap, window, interpret, num_splits, triton_options, options):
  """An FP8 cache (per-token scales, tiled values) through `mosaic_fp8` (its `Fp8Options`);
  NotImplementedError otherwise."""
  if (why := mfp8.supports(cache)) is not None:
    raise NotImplementedError(f"pallas_gpu: mosaic_fp8: {why}")
  _mosaic_refusals(q, cache, triton_options, "the Mosaic FP8 kernel")
  if options.tile % cache.v.tile:
    raise NotImplementedError(f"pallas_gpu: Fp8Options(tile={options.tile}) steps over whole value tiles; the "
                              f"cache's are {cache.v.tile} tokens")
  return mfp8.decode_attention(q, cache, sm_scale=sm_scale, num_splits=num_splits, interpret=interpret,
                               options=options, logit_softcap=softcap or None, sliding_window=window)


def _mosaic_attention(q, cache, sm_scale, softcap, window, interpret, num_splits, mosaic_window,
                      triton_options, kernel_merge=None):
  """A "words" KIVI cache through `mosaic_decode` (query heads per KV head x tokens <= 16; a soft-cap or
  sliding window with the residual window in the kernel); NotImplementedError otherwise, so `dispatch` falls
  back to XLA. mosaic_window: `mosaic_decode.decode_attention`'s window (where the residual window's state is
  made)."""
  if (why := mosaic_decode.supports(cache)) is not None:
    raise NotImplementedError(f"pallas_gpu: 'words' KIVI cache: {why}")
  kernel = "the Mosaic KIVI kernel a 'words' cache goes to"
  _mosaic_refusals(q, cache, triton_options, kernel)
  if (softcap or window is not None) and mosaic_decode.resolved_window(cache, mosaic_window) != "kernel":
    raise NotImplementedError(f"pallas_gpu: {kernel} applies a soft-cap or sliding window with the residual window "
                              f"in the kernel, not {mosaic_window!r}")
  return mosaic_decode.decode_attention(q, cache, sm_scale=sm_scale, num_splits=num_splits,
                                        interpret=interpret, window=mosaic_window, kernel_merge=kernel_merge,
                                        logit_softcap=softcap or None, sliding_window=window)


def decode_attention(q, cache: KVCache, *, sm_scale=None, logit_softcap=None, window=None,
                     interpret=None, num_splits=None, block=None, num_warps=None,
                     num_stages=None, narrow_qk=None, narrow_pv=None, join_values=None,
                     tile_loop=None, prefetch=None, packed_unpack=None, pallas_merge=None,
                     fold_value_scales=None, mosaic_window=None, mosaic_fp8=None):
  """Fused decode attention of q [B, N, T, H] over a quantized cache (same contract as
  `kvjax.attention.decode_attention`).

  pallas_merge: merge the per-split states with the one-kernel `merge.merge_states` or with XLA
  (`decode.combine`, the reference). None: on a GPU `merge_in_kernel`, else XLA. On a "words" KIVI-2
  cache (the Mosaic kernel): False puts the residual window and the merge in XLA (mosaic_window "xla"),
  True the merge inside the kernel where its states are at most `mosaic_epilogue.CLUSTER_MAX`
  (`mosaic_decode`'s kernel_merge, by `mosaic_decode.MERGE_BY`; None: `mosaic_decode.KERNEL_MERGE`'s rule).
  mosaic_window: on a "words" KIVI-2 cache, where the residual window's state is computed
  (`mosaic_decode.WINDOWS`; None: `mosaic_decode.DEFAULT_WINDOW`, or "xla" with pallas_merge=False).
  mosaic_fp8: an FP8 cache (per-token scales, values in tiles) through the Mosaic GPU kernel (`mosaic_fp8`)
  instead of Triton's: True (the build `mosaic_fp8.default_options` picks for the head_dim), or a
  `mosaic_fp8.Fp8Options`; None: MOSAIC_FP8, or the cache's capacity against MOSAIC_FP8_MIN_CAPACITY (head_dim
  256 from 16k tokens); INT8 caches likewise by MOSAIC_INT8 and MOSAIC_INT8_MIN_CAPACITY (the same rule).
  False: Triton's.
  Other caches: NotImplementedError if set."""
  if window is not None and (int(window) != window or window < 1):
    raise ValueError(f"window must be a positive integer or None, got {window!r}")
  if cache.num_layers is not None:
    raise NotImplementedError("pallas_gpu: stacked cache; pass one layer")
  if interpret is None:
    interpret = jax.default_backend() != "gpu"  # off a GPU: emulate (slow, for tests)
  bq, n, t, h = q.shape
  kh = cache.num_kv_heads
  if q.ndim != 4 or bq != cache.batch or h != cache.head_dim or n % kh:
    raise ValueError(f"q must be [B={cache.batch}, N (multiple of {kh}), T, H={cache.head_dim}], "
                     f"got {q.shape}")
  rep = n // kh
  rows = rep * t
  triton_options = dict(block=block, num_warps=num_warps, num_stages=num_stages, narrow_qk=narrow_qk,
                        narrow_pv=narrow_pv, join_values=join_values, tile_loop=tile_loop, prefetch=prefetch,
                        packed_unpack=packed_unpack, fold_value_scales=fold_value_scales)
  # MOSAIC_FP8 as the default takes only what the Mosaic kernel does; the rest stays with Triton's
  by_default = (mosaic_fp8 is None and _mosaic_8bit_by_default(cache)
                and mfp8.supports(cache) is None and mfp8.default_options(cache.head_dim).tile % cache.v.tile == 0
                and rows <= mfp8.ROWS and mosaic_window is None
                and all(v is None for v in (*triton_options.values(), pallas_merge)))
  if mosaic_fp8 or by_default:
    if mosaic_window is not None:
      raise NotImplementedError(f"pallas_gpu: mosaic_window={mosaic_window!r} applies to 'words' KIVI-2 caches")
    if not isinstance(mosaic_fp8, (bool, mfp8.Fp8Options, type(None))):
      raise ValueError(f"mosaic_fp8 must be None, a bool or an Fp8Options, got {mosaic_fp8!r}")
    build = mosaic_fp8 if isinstance(mosaic_fp8, mfp8.Fp8Options) else mfp8.default_options(cache.head_dim)
    return _mosaic_fp8_attention(q, cache, sm_scale, logit_softcap, window, interpret, num_splits,
                                 {**triton_options, "pallas_merge": pallas_merge}, build)
  if cache.k.layout == "words":  # the Mosaic KIVI-2 kernel's code layout (cache.default_kivi_layout)
    if mosaic_window is None:
      mosaic_window = "xla" if pallas_merge is False else mosaic_decode.DEFAULT_WINDOW
    return _mosaic_attention(q, cache, sm_scale, logit_softcap, window, interpret, num_splits, mosaic_window,
                             triton_options, kernel_merge=True if pallas_merge else None)
  if mosaic_window is not None:
    raise NotImplementedError(f"pallas_gpu: mosaic_window={mosaic_window!r} applies to 'words' KIVI-2 caches "
                              f"(the Mosaic kernel), not {cache.fmt}")
  if rows > MAX_ROWS:
    raise NotImplementedError(f"pallas_gpu: {rows} query rows per KV head > {MAX_ROWS}")
  if interpret and packed_unpack:
    raise ValueError("packed_unpack=True runs inline PTX, which has no interpret mode (needs a GPU)")
  if interpret:
    packed_unpack = False
  plan = plan_for(cache, t, rows, num_splits=num_splits, block=block, softcap=logit_softcap,
                  window=window, narrow_qk=narrow_qk, narrow_pv=narrow_pv, join_values=join_values,
                  tile_loop=tile_loop, prefetch=prefetch, packed_unpack=packed_unpack,
                  fold_value_scales=fold_value_scales)
  fmt = cache.fmt
  sm = h ** -0.5 if sm_scale is None else sm_scale
  q_scale = sm if logit_softcap else sm * decode.LOG2E
  qs = q.reshape(bq, kh, rows, h)  # free: [B, N, T, H] with N = K * rep
  static_k = isinstance(fmt.key, FP8Spec) and fmt.key.static
  if static_k or not isinstance(q_scale, numbers.Real):  # an array scale: applied by XLA
    qs = qs.astype(jnp.float32) * q_scale
    if static_k:
      qs = qs * jnp.asarray(cache.k.scale, jnp.float32)  # [1|B, K|1, 1, H|1] broadcasts
    q_scale = 1.0
  plan = dataclasses.replace(plan, q_scale=float(q_scale))  # else the kernel scales (and pads) q
  kw = {"num_warps": default_warps(plan, h) if num_warps is None else num_warps}
  if num_stages is not None:
    kw["num_stages"] = num_stages
  elif not isinstance(fmt.key, Passthrough):
    kw["num_stages"] = QUANT_STAGES
  o, m, l = backend_call(qs, cache, plan, interpret=interpret, **kw)
  v_static = isinstance(fmt.value, FP8Spec) and fmt.value.static
  if pallas_merge is None:
    pallas_merge = not interpret and merge_in_kernel(bq, kh, o.shape[2])
  if pallas_merge:
    out = merge.merge_states(o, m, l, rows, jnp.float32 if v_static else q.dtype, interpret=interpret)
    out = out[:, :, :rows]  # [B, K, R, H] -> [B, K, rows, H]; no copy where rows is a power of two
  else:
    out = decode.combine(o, m, l, rows)  # [B, K, rows, H]
  if v_static:
    out = out * jnp.asarray(cache.v.scale, jnp.float32)
  return out.reshape(bq, n, t, h).astype(q.dtype)

