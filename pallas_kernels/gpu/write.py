"""In-place append for decode: every row an append stores, in one Pallas kernel.

`kvjax.cache.append` computes the new tokens' codes and scales (a small
elementwise + reduction over ``[B, K, T, H]``) and a list of `RowWrite`s: for
each cache leaf, the rows to store and where. Its default writer applies
each as an XLA scatter, one kernel per leaf (codes, scales, zeros, KIVI
rings and key-block flush): at decode those kernels are a few microseconds
of launches each, not bytes (session 1: ~11 us for FP8, ~25 us for KIVI at
B = 8). `write_rows` here stores all of them from one kernel: one program
per (sequence, KV head) copies its rows into the leaves, which the kernel
aliases to its outputs (`input_output_aliases`); under
``jax.jit(..., donate_argnums=...)`` no cache byte is copied.

KIVI keys arrive as a `KeyFlush` (residual + new tokens, unquantized): the
same programs put the new keys in their residual slots and, on the step a
sequence's R-token block fills, quantize and store it (`flush.py`), so a
KIVI append is one kernel too, with no per-step XLA key quantization.

A KIVI-2 cache in the "words" layout (`QArray.layout`) is stored the same
way: its values quantized per token in the kernel and each token's codes
read-modify-written into their bit planes of the transposed tile
(`store_planes`), a flushed key block packed as token rows.

`append` is the "pallas_gpu" entry of `kvjax.dispatch.append`; `decode_step`
fuses append + attend in one jitted, donated call, the shape of a real decode
step. Interpret mode runs the same kernel on any backend (tests).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kvjax import cache as cache_lib
from kvjax import dispatch
from kvjax import quant
from kvjax.cache import KeyFlush, KVCache, QuantRows, RowWrite
from kvjax.formats import FP8Spec, KIVISpec
from pallas_kernels.gpu import flush as flush_lib

__all__ = ["write_rows", "append", "append_inplace", "decode_step"]


def _flat(w: RowWrite, leaf) -> tuple[tuple[int, int, int, int], jax.Array]:
  """The leaf's [B, K, S', X] view and the write's rows [B, K, n, X] (X = the row's elements; a
  `planes` write: the "words" leaf [B, K, S, 16] and the tokens' codes [B, K, n, 128])."""
  view = tuple(leaf.reshape(w.view).shape)
  x = math.prod(view[3:])
  b, k, n = w.new.shape[:3]
  return (view[0], view[1], view[2], x), w.new.reshape(b, k, n, -1 if w.planes else x)


def _words_rows(codes, bits: int):
  """A "words" value leaf [B, K, S, H bits / 16] as its channel rows of 128-token tiles [B, K, S H / 128, 8 bits]
  (row H (p // 128) + h: channel h of token p's tile; a free reshape)."""
  return codes.reshape(codes.shape[0], codes.shape[1], -1, 8 * bits)


_FLUSH_LEAVES = ("k.codes", "k.scale", "k.zero", "k_res")
# The in-kernel KIVI key flush is bit-identical to the XLA path in interpret mode for every KIVI
# format (tests). On the H200 the same test passed for kivi2 and kivi4 (session 6,
# benchmarks/results/decode_parts/session6_*) and for kivi2_g128 and a sink format (kivi4, sink 3;
# session 7, decode_parts/session7_flush_pytest_log.txt); a kivi2 append at B=8, 32k took 9.6 us
# instead of 25.1 (step 377.9 -> 362.9 us). Key groups not in this set (none of the presets) keep the
# XLA flush (`cache.flush_rows`, stored by this kernel) unless `flush_in_kernel=True`.
FLUSH_IN_KERNEL_GROUPS = frozenset({32, 128})


# The code widths of "words" caches the one-kernel writer stores when compiled for the GPU (elsewhere it is
# interpreted: any). 4-bit words (`store_planes` and the key flush's two word tiles, session 23): session 23's
# native pytest ran out of its time budget before them; in session 24 (H100,
# `benchmarks/results/decode_parts/session24/a_diag.txt`, `benchmarks/runs/session24_words4_diag.py`) T=1 with
# and without a key flush, G=128 and 32, is bit-identical to the XLA scatters natively.
NATIVE_WORDS_BITS = (2, 4)
# The most tokens one compiled append stores into 4-bit words: more than 16 share value words (4 codes a word,
# tokens 16 apart), and that native case (`test_pallas_append_words_planes_share_words[kivi4]`, T=20) did not
# finish within its time in session 24 (`decode_parts/session24/c_pytest.txt`); longer appends take the XLA
# scatters (`dispatch.append` falls back).
NATIVE_WORDS4_MAX_TOKENS = 16
# The key groups of head_dim-256 "words" caches the compiled writer stores, each with the largest batch it takes
# (None: any). G=128 (session 28): bit-identical to the XLA scatters natively,
# `benchmarks/results/decode_parts/session28/pytest_writer.txt`. G=32 (session 30, H100, `decode_parts/session30/`),
# with XLA quantizing its key blocks (`IN_KERNEL_FLUSH_SLOW`): bit-identical (`pytest_writer_h256.txt`); a Gemma-2-2B
# KIVI-2 32k decode step (`decode_gemma_g32_step.json`) takes 185.1 us against 192.6 with XLA's scatters at B=8
# (the append alone 25.1 against 29.0) but 1205.8 against 1182.4 at B=64 (124.6 against 96.8), and issue 7's Gemma
# KIVI-2 32k row at B=64 ran 3% slower with it: larger batches take the XLA scatters. Session 32 (H100,
# `decode_parts/session32/decode_gemma_g32_writer.json`), the step with XLA's scatters / the writer: B=16 334.3 /
# 328.2 us, B=32 616.7 / 629.6, B=64 1168.6 / 1191.7: the writer up to 16.
NATIVE_WIDE_WORDS_GROUPS = {128: None, 32: 16}
# (key group, head_dim) whose in-kernel key flush is too slow to compile (session 29: 47.2 s for an H200 on the
# CPU against 1.3 s without, `decode_parts/session29/writer_aot_cpu.txt`; session 30: no native compile in 100 s):
# XLA quantizes their key blocks by default.
IN_KERNEL_FLUSH_SLOW = frozenset({(32, 256)})


def flush_in_kernel_default(fmt, head_dim: int = 128) -> bool:
  """Whether `write_rows` quantizes `fmt`'s KIVI key blocks of `head_dim` channels in the kernel by default."""
  return (fmt.is_kivi and fmt.key.group_size in FLUSH_IN_KERNEL_GROUPS
          and (fmt.key.group_size, head_dim) not in IN_KERNEL_FLUSH_SLOW)


def _quantize_row(x, spec):
  """One token's row x [1, H] (or its column [H, 1]) f32 -> (codes, scale [1, 1] in the scale
  dtype[, zero [1, 1] for KIVI]) as `quant.quantize` computes them, bit for bit (exact steps,
  lowerable primitives). KIVI: one group of H channels (values, G = H), or, for a column, G-channel
  groups (`_kivi_groups`: scale and zero [1, H / G])."""
  sd = jnp.dtype(spec.scale_dtype)
  qmax = spec.max if isinstance(spec, FP8Spec) else spec.qmax
  over_all = lambda f, y: f(f(y, axis=0, keepdims=True), axis=1, keepdims=True)  # [1, 1]
  if isinstance(spec, KIVISpec) and spec.group_size < x.size:
    return _kivi_groups(x, spec.group_size, qmax, sd)
  if isinstance(spec, KIVISpec):  # asymmetric: `quant.compute_scale`'s min / span
    s, mn = flush_lib.kivi_scale(over_all(jnp.min, x), over_all(jnp.max, x), qmax, sd)
    c = jnp.clip(flush_lib.div_round(x - mn.astype(jnp.float32), s.astype(jnp.float32)), 0, qmax)
    return c.astype(jnp.int32), s, mn
  amax = over_all(jnp.max, jnp.abs(x))
  s = flush_lib.step_for(jnp.where(amax > 0, amax, qmax), qmax, sd)
  sf = s.astype(jnp.float32)
  if isinstance(spec, FP8Spec):
    return quant.fp8_div(x, sf, spec), s
  c = jnp.minimum(flush_lib.div_round(jnp.abs(x), sf), qmax)  # symmetric: round |x|, then the sign
  return jnp.where(x < 0, -c, c).astype(jnp.int8), s


def _kivi_groups(x, group: int, qmax: int, sd):
  """One token's column x [H, 1] f32 in groups of `group` channels -> (codes [H, 1] int32, scale, zero
  [1, H / G] in sd), `quant.quantize`'s KIVI values (per token, G-channel groups), bit for bit. Each group's
  min / max by a masked reduction over the column (no reshape: Triton tiles stay 2-D)."""
  h = x.shape[0]
  if x.shape != (h, 1) or h % group:
    raise ValueError(f"x must be a column [H, 1] with H a multiple of the group {group}, got {x.shape}")
  grp = lax.broadcasted_iota(jnp.int32, x.shape, 0) // group  # [H, 1]: each channel's group
  col = lax.broadcasted_iota(jnp.int32, (1, h // group), 1)   # [1, H / G]
  s_ch = z_ch = jnp.zeros(x.shape, jnp.float32)
  s_row = z_row = jnp.zeros((1, h // group), sd)
  for i in range(h // group):  # static: 4 groups at H=128, G=32
    mine = grp == i
    lo = jnp.min(jnp.where(mine, x, jnp.inf), axis=0, keepdims=True)  # [1, 1]
    hi = jnp.max(jnp.where(mine, x, -jnp.inf), axis=0, keepdims=True)
    s, mn = flush_lib.kivi_scale(lo, hi, qmax, sd)
    s_ch = jnp.where(mine, s.astype(jnp.float32), s_ch)
    z_ch = jnp.where(mine, mn.astype(jnp.float32), z_ch)
    s_row, z_row = jnp.where(col == i, s, s_row), jnp.where(col == i, mn, z_row)
  c = jnp.clip(flush_lib.div_round(x - z_ch, s_ch), 0, qmax)
  return c.astype(jnp.int32), s_row, z_row


def _placed_positions(length, placed):
  """`kvjax.cache.append`'s positions for a sequence of `length` tokens adding all T (num_new None), from
  placed = (capacity, residual, T, kinds): (count, pos_of(kind, j)) with kind "token" (row length + j, or
  the capacity: dropped) or "slot" (the value ring's slot (length + j) % R if the token is among the last R,
  else R: dropped)."""
  cap, r_len, t_new, _ = placed
  count = jnp.clip(jnp.minimum(t_new, cap - length), 0, t_new)

  def pos_of(kind, j):
    p = jnp.where(j < count, length + j, cap)
    if kind == "token":
      return p
    return jnp.where((j < count) & (p >= length + count - r_len), p % r_len, r_len)
  return count, pos_of


def _kernel(*refs, rows, tiles, planes, n_writes, quants, fmt, words, barrier, placed):
  nq = len(quants)
  q_first = [n_writes + sum(len(o) for *_, o in quants[:i]) for i in range(nq + 1)]  # each quant's outputs
  n_out = q_first[nq] + (len(_FLUSH_LEAVES) if fmt is not None else 0)
  b, h = pl.program_id(0), pl.program_id(1)
  if placed:  # lengths, new, qraw [, flush's new]; then the leaves, their aliased outputs and the new lengths
    n_in = 1 + n_writes + nq + (1 if fmt is not None else 0)
    new_refs, qraw_refs = refs[1:1 + n_writes], refs[1 + n_writes:1 + n_writes + nq]
    length = refs[0][b]
    count, pos_of = _placed_positions(length, placed)
    kinds = placed[3]
    pos = [lambda j, i=i: pos_of(kinds[i], j) for i in range(n_writes)]
    qpos = [lambda j: pos_of("token", j)] * nq
    flush_args = (length, count, refs[n_in - 1]) if fmt is not None else ()
    len_out = refs[n_in + 2 * n_out]

    @pl.when(h == 0)
    def _lengths():
      len_out[pl.ds(b, 1)] = jnp.full((1,), length + count, jnp.int32)
  else:  # pos, new, qpos, qraw [, flush's ends, count, new]; then the leaves and their aliased outputs
    n_in = 2 * n_writes + 2 * nq + (3 if fmt is not None else 0)
    new_refs = refs[n_writes:2 * n_writes]
    qraw_refs = refs[2 * n_writes + nq:2 * n_writes + 2 * nq]
    pos = [lambda j, r=r: r[b, j] for r in refs[:n_writes]]
    qpos = [lambda j, r=r: r[b, j] for r in refs[2 * n_writes:2 * n_writes + nq]]
    if fmt is not None:
      ends, count_ref, new_k = refs[2 * n_writes + 2 * nq:n_in]
      flush_args = (ends[b] - count_ref[b], count_ref[b], new_k)
  out_refs = refs[n_in + n_out:n_in + 2 * n_out]  # aliased to the leaves, which are read only here
  if fmt is not None:
    flush_lib.flush_keys(b, h, *flush_args, *out_refs[q_first[nq]:], fmt=fmt, barrier=barrier, words=words)

  def store(out, r, tile, val):  # val: [1, X] row (token-major) or [X, 1] column (tiled)
    n_rows = out.shape[2] * max(tile, 1)

    @pl.when((r >= 0) & (r < n_rows))
    def _store():
      if tile:  # out [B, K, S/T, X, T]: one column of a tile
        out[b, h, r // tile, :, pl.ds(r % tile, 1)] = val.astype(out.dtype)
      else:
        out[b, h, pl.ds(r, 1), :] = val.astype(out.dtype)

  def store_planes(out, p, code, shared, bits):  # out [B, K, S H / 128, 8 bits] "words" values (`_words_rows`);
    # code [H, 1]: token p's. Token e = p % 128 of its tile sits in word 16 (e // (16 n)) + e % 16 of each
    # channel row, at bits `bits` ((e // 16) % n) (n = 16 / bits codes a word: `kvjax.packing.pack_words`)
    w, n, hd = quant.WORDS_TILE, 16 // bits, code.shape[0]

    @pl.when((p >= 0) & (p < out.shape[2] * w // hd))
    def _store():
      e = p % w
      if 16 * n == w:  # 2-bit: one word tile (the fewer ops keep the kernel's IR as it was)
        word, shift = e % 16, bits * (e // 16)
      else:
        word, shift = 16 * (e // (16 * n)) + e % 16, bits * ((e // 16) % n)
      rows_, col = pl.ds(p // w * hd, hd), pl.ds(word, 1)  # channel h of tile p // w: row H (p // w) + h
      old = out[b, h, rows_, col].astype(jnp.int32)
      val = (old & ~(((1 << bits) - 1) << shift)) | (code.astype(jnp.int32) << shift)
      out[b, h, rows_, col] = val.astype(out.dtype)
      if barrier and shared:  # a later token of this write may share these words (16 tokens on)
        plgpu.debug_barrier()

  for i in range(n_writes):
    for j in range(rows[i]):  # static: T tokens (decode: 1), or the flush blocks
      new = new_refs[i]  # [B, K, X, n] for a tiled leaf or planes, else [B, K, n, X]
      val = new[b, h, :, pl.ds(j, 1)] if tiles[i] or planes[i] else new[b, h, pl.ds(j, 1), :]
      if planes[i]:
        store_planes(out_refs[i], pos[i](j), val, rows[i] > 16, planes[i])
      else:
        store(out_refs[i], pos[i](j), tiles[i], val)
  for i, (spec, tile, in_planes, outs) in enumerate(quants):
    codes_out, *scale_outs = out_refs[q_first[i]:q_first[i + 1]]  # codes, scale[, zero]
    column = tile or in_planes
    raw = qraw_refs[i]  # [B, K, H, n] for tiled or "words" codes, else [B, K, n, H]
    n_tok = raw.shape[3] if column else raw.shape[2]
    for j in range(n_tok):
      x = (raw[b, h, :, pl.ds(j, 1)] if column else raw[b, h, pl.ds(j, 1), :]).astype(jnp.float32)
      codes, *per_token = _quantize_row(x, spec)
      r = qpos[i](j)
      if in_planes:
        store_planes(codes_out, r, codes, n_tok > 16, spec.bits)
      else:
        store(codes_out, r, tile, codes)
      for out, val in zip(scale_outs, per_token):
        store(out, r, 0, val)


def write_rows(cache: KVCache, writes: Sequence[RowWrite | KeyFlush | QuantRows], *, interpret=None,
               num_warps=None, flush_in_kernel: bool | None = None,
               quantize_in_kernel: bool = True, lengths_before: jax.Array | None = None) -> KVCache:
  """`kvjax.cache.scatter_writes` as one Pallas kernel (a `write_rows` for `cache.append`).

  With `flush_in_kernel` (default: `flush_in_kernel_default`, the GPU-checked formats) a
  `KeyFlush` of ``T < R`` tokens is quantized in the kernel (`flush.py`); otherwise, and for longer
  ones (prefill), XLA quantizes it (`cache.flush_rows`) and the kernel stores the rows. `num_warps`: default 1, or 4
  with an in-kernel flush (its ``[G, H]`` f32 tiles).

  `QuantRows` (per-token FP8 / INT8 keys and values, KIVI values of a "words" cache;
  `cache.writer_quantizes`) are quantized in
  the kernel too (`_quantize_row`, bit-identical to `quant.quantize`), so a decode append is one
  kernel and no XLA fusions; `quantize_in_kernel=False` quantizes them with XLA first (the
  session-8 path: four small fusions before the kernel on the H200).

  `lengths_before` ``[B]`` (`append`'s default at decode): the cache's lengths before an append whose every
  sequence adds all its T tokens (`kvjax.cache.append` with num_new None, no sink tokens, one layer). The
  kernel then derives every row's position, the flush's count and the new lengths from them
  (`_placed_positions`), so the append is this one kernel with no XLA op before it (the writes' own `pos`,
  the same positions, go unused and XLA drops their computation). Where a key block is quantized by XLA
  (its rows' positions are blocks, not tokens) the writes' positions are used as given.

  Raises NotImplementedError where Triton cannot tile a row (its element count
  is not a power of two), so `dispatch.append` falls back to XLA scatters.
  """
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  if cache.k.layout == "words" and not interpret and cache.fmt.key.bits not in NATIVE_WORDS_BITS:
    raise NotImplementedError(f"pallas_gpu append: 'words' codes of {cache.fmt.key.bits} bits natively "
                              f"(NATIVE_WORDS_BITS: {NATIVE_WORDS_BITS}; interpreted, any)")
  if cache.k.layout == "words" and not interpret and cache.head_dim != quant.WORDS_TILE:
    g, batch = cache.fmt.key.group_size, cache.lengths.shape[0]
    if g not in NATIVE_WIDE_WORDS_GROUPS or (NATIVE_WIDE_WORDS_GROUPS[g] or batch) < batch:
      raise NotImplementedError(f"pallas_gpu append: 'words' codes of head_dim {cache.head_dim} at G={g}, batch "
                                f"{batch} natively (NATIVE_WIDE_WORDS_GROUPS, group: largest batch: "
                                f"{NATIVE_WIDE_WORDS_GROUPS})")
  if (cache.k.layout == "words" and not interpret and cache.fmt.key.bits == 4
      and max((w.new.shape[2] for w in writes), default=0) > NATIVE_WORDS4_MAX_TOKENS):
    raise NotImplementedError(f"pallas_gpu append: more than {NATIVE_WORDS4_MAX_TOKENS} tokens into 4-bit 'words' "
                              "natively (NATIVE_WORDS4_MAX_TOKENS)")
  quants = [w for w in writes if isinstance(w, QuantRows)]
  if not quantize_in_kernel or any(w.new.shape[3] & (w.new.shape[3] - 1) for w in quants):
    writes, quants = cache_lib.lower_quants(cache, writes), []  # quantized by XLA, stored as rows
  writes = [w for w in writes if not isinstance(w, QuantRows)]
  flushes = [w for w in writes if isinstance(w, KeyFlush)]
  if len(flushes) > 1:
    raise NotImplementedError(f"pallas_gpu append: {len(flushes)} key flushes in one append")
  fl = flushes[0] if flushes else None
  in_kernel = flush_in_kernel_default(cache.fmt, cache.head_dim) if flush_in_kernel is None else flush_in_kernel
  if fl is not None and (not in_kernel or
                         flush_lib.supported(cache.fmt, fl.new.shape[2], cache.head_dim) is not None):
    cache, writes = cache_lib.lower_flushes(cache, writes)  # quantized by XLA, stored as rows
    fl, lengths_before = None, None  # the flushed rows' positions are key blocks: taken as given
  writes = [w for w in writes if not isinstance(w, KeyFlush)]
  placed = None
  if lengths_before is not None:
    if jnp.shape(lengths_before) != (cache.batch,):
      raise ValueError(f"lengths_before must have shape [B={cache.batch}], got {jnp.shape(lengths_before)}")
    if any(w.leaf in ("k_sink", "v_sink") for w in writes):
      raise NotImplementedError("write_rows: lengths_before with sink tokens (their slots are not placed)")
    t_new = {w.new.shape[2] for w in [*writes, *quants] + ([fl] if fl is not None else [])}
    if len(t_new) != 1:
      raise ValueError(f"lengths_before: the writes add different token counts {sorted(t_new)}")
    kinds = tuple("slot" if w.leaf == "v_res" else "token" for w in writes)
    placed = (cache.capacity, cache.fmt.residual, t_new.pop(), kinds)
  if not writes and not quants and fl is None:
    return cache
  names = [w.leaf for w in writes]
  if len(set(names)) != len(names):
    raise NotImplementedError(f"pallas_gpu append: two writes to one leaf ({names})")
  leaves = [cache_lib.get_leaf(cache, n) for n in names]
  views, news = zip(*(_flat(w, a) for w, a in zip(writes, leaves))) if writes else ((), ())
  for name, v in zip(names, views):
    if v[3] & (v[3] - 1):
      raise NotImplementedError(f"pallas_gpu append: {name} rows of {v[3]} elements (needs a power of two)")
  b, k = cache.batch, cache.num_kv_heads
  tiles = tuple(w.tile for w in writes)
  planes = tuple(w.planes for w in writes)
  rows = tuple(x.shape[2] for x in news)
  # Tiled leaves (`RowWrite.tile`): [B, K, S'/T, X, T] with the new rows as columns [B, K, X, n].
  dsts = [a.reshape(v[:2] + (v[2] // t, v[3], t)) if t else _words_rows(a, p) if p else a.reshape(v)
          for a, v, t, p in zip(leaves, views, tiles, planes)]
  news = [jnp.swapaxes(x, 2, 3) if t or p else x for x, t, p in zip(news, tiles, planes)]
  pos = [jnp.asarray(w.pos, jnp.int32) for w in writes]
  n = len(writes)
  q_leaves = [getattr(cache, w.role) for w in quants]
  q_outs = [("codes", "scale") + (("zero",) if qa.zero is not None else ()) for qa in q_leaves]
  q_specs = tuple((qa.spec, qa.tile, qa.layout == "words", o) for qa, o in zip(q_leaves, q_outs))
  q_pos = [jnp.asarray(w.pos, jnp.int32) for w in quants]
  q_raw = [jnp.swapaxes(w.new, 2, 3) if qa.tile or qa.layout else w.new for w, qa in zip(quants, q_leaves)]
  for w, qa, outs in zip(quants, q_leaves, q_outs):
    bq, kq, sq, hq = qa.codes.shape
    names += [f"{w.role}.{o}" for o in outs]
    leaves += [getattr(qa, o) for o in outs]
    dsts += [qa.codes.reshape(bq, kq, sq // qa.tile, hq, qa.tile) if qa.tile else
             _words_rows(qa.codes, qa.spec.bits) if qa.layout == "words" else qa.codes]
    dsts += [getattr(qa, o).reshape(bq, kq, sq, -1) for o in outs[1:]]  # per-token scale[, zero] [.., 1 or H / G]
  flush_in = []
  words = cache.k.layout == "words"
  if fl is not None:
    spec, s_cap = cache.fmt.key, cache.capacity
    per_byte = 8 // spec.bits
    names += list(_FLUSH_LEAVES)
    leaves += [cache_lib.get_leaf(cache, nm) for nm in _FLUSH_LEAVES]
    codes = cache.k.codes if words else cache.k.codes.reshape(b, k, s_cap // per_byte, -1)  # planar blocks
    dsts += [codes, cache.k.scale, cache.k.zero, cache.k_res]  # [B, K, S / G, H] twice, [B, K, R, H]
    count = jnp.asarray(fl.count, jnp.int32)
    flush_in = [jnp.asarray(fl.lengths, jnp.int32) + count, count, fl.new]  # `flush_keys`' ends, count
  if num_warps is None:
    num_warps = 1 if fl is None else 4
  statics = dict(rows=rows, tiles=tiles, planes=planes, n_writes=n, quants=q_specs,
                 fmt=cache.fmt if fl is not None else None, words=words, barrier=not interpret, placed=placed)
  if placed:  # the lengths alone: the kernel places the rows and counts the tokens
    ins = [jnp.asarray(lengths_before, jnp.int32), *news, *q_raw, *flush_in[2:]]
  else:
    ins = [*pos, *news, *q_pos, *q_raw, *flush_in]
  out = _launch(tuple(statics.items()), (b, k), len(dsts), num_warps, interpret, *ins, *dsts)
  new = {nm: o.reshape(a.shape) for nm, o, a in zip(names, out, leaves)}
  if placed:
    new["lengths"] = out[-1]
  return cache_lib.set_leaves(cache, new)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _launch(statics, grid, n_out, num_warps, interpret, *arrays):
  """The writer's `pallas_call` over `arrays` (its inputs, then the `n_out` leaves it updates in place), under
  `jax.jit` so a program appending to many layers' caches traces and lowers the kernel once per distinct
  configuration (`statics`: `_kernel`'s keyword arguments), not once per layer: session 29 measured 0.64 s a call
  tracing it, 27 s of a 32-layer Llama generate program's trace (`decode_parts/session29/compile_llama_4k.txt`)."""
  n_in = len(arrays) - n_out
  dsts = arrays[n_in:]
  lengths = [jax.ShapeDtypeStruct((grid[0],), jnp.int32)] if dict(statics)["placed"] else []  # the new lengths
  return pl.pallas_call(
      functools.partial(_kernel, **dict(statics)), grid=grid,
      out_shape=[jax.ShapeDtypeStruct(d.shape, d.dtype) for d in dsts] + lengths,
      input_output_aliases={n_in + i: i for i in range(n_out)},
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="kvjax_append_rows",
  )(*arrays)


def append(cache: KVCache, k, v, num_new=None, *, interpret=None, flush_in_kernel=None,
           positions_in_kernel: bool | None = None) -> KVCache:
  """`kvjax.cache.append` with its rows stored by one Pallas kernel (same result, bit for bit).

  positions_in_kernel (default: where it applies, i.e. num_new None, no sink tokens, one layer's cache): the
  kernel derives the rows' positions and the new lengths from the lengths (`write_rows`' lengths_before), so a
  decode append is one launch with no XLA fusion before it."""
  can = num_new is None and not cache.fmt.sink and cache.num_layers is None
  if positions_in_kernel and not can:
    raise ValueError(f"positions_in_kernel=True needs num_new=None, a format without sink tokens and one layer's "
                     f"cache; got num_new={'None' if num_new is None else 'an array'}, sink={cache.fmt.sink}, "
                     f"num_layers={cache.num_layers}")
  placed = can if positions_in_kernel is None else positions_in_kernel
  return cache_lib.append(cache, k, v, num_new, write_rows=functools.partial(
      write_rows, interpret=interpret, flush_in_kernel=flush_in_kernel,
      lengths_before=cache.lengths if placed else None))


@functools.partial(jax.jit, donate_argnums=(0,), static_argnames=("implementation",))
def append_inplace(cache, k, v, num_new=None, implementation=None):
  """`kvjax.dispatch.append` with the cache donated: codes/scales/residuals updated in place."""
  return dispatch.append(cache, k, v, num_new, implementation=implementation)


@functools.partial(jax.jit, donate_argnums=(3,), static_argnames=("implementation",))
def decode_step(q, k, v, cache, implementation="pallas_gpu"):
  """Appends k, v [B, K, T, H] in place, then attends q [B, N, T, H]; returns (out, cache)."""
  cache = dispatch.append(cache, k, v, implementation=implementation)
  out = dispatch.decode_attention(q, cache, implementation=implementation)
  return out, cache
