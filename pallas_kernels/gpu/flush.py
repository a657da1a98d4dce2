"""KIVI key flush inside the append kernel: quantize a full R-token block where it lands.

`kvjax.cache.append` hands the writer a `KeyFlush` (the residual ring plus
the new keys) instead of pre-quantized rows; its XLA reference
(`kvjax.cache.flush_rows`) builds a ``[B, K, 2R, H]`` buffer and quantizes
it on every step, several kernels' worth of launches at decode. Here the
append kernel's (sequence, KV head) program does it: new tokens go to their
residual slots, and only when a block fills (``r + count >= R``, once per R
steps) does the program read the residual back, compute each G-token
group's min / scale per channel, and store the planar-packed codes, the
scales and zeros, then the residual's remainder.

Bit-identical to `quant.quantize`: the same exact-by-construction steps
(`quant.round_down`, `quant.step_for`, `quant.div_round`) in f32, with the
primitives Triton cannot lower replaced by equivalents: ``nextafter`` on 16-bit
floats by integer steps of the bit pattern, ``round`` by ``floor(x + 0.5)``
(div_round's exact remainder correction makes the first guess irrelevant
within one). Only ``T < R`` (at most one block per append) is done here;
longer appends (prefill) take `flush_rows`.

Tiles are sliced, never reshaped: a group is rows ``[gG, (g + 1)G)`` and a
packing plane rows ``[iP, (i + 1)P)`` (``P = R / codes per byte``) of the
block, each loaded from the residual on its own. In the "words" layout
(`kvjax.packing.pack_words`: word j of a token row holds channels j + 16 m at
bits 2m) each group is quantized per 16-channel slab ``[G, 16]`` instead
(per-channel statistics, so slab by slab is the same arithmetic).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kvjax.formats import KVFormat

__all__ = ["supported", "flush_keys", "round_down", "step_for", "kivi_scale", "div_round"]

_UINT = {2: jnp.uint16, 4: jnp.uint32}


def _pow2(x: int) -> bool:
  return x > 0 and not x & (x - 1)


def supported(fmt: KVFormat, num_new: int, head_dim: int) -> str | None:
  """None when `flush_keys` handles this append, else why not (then the caller uses `flush_rows`)."""
  r, g = fmt.residual, fmt.key.group_size
  if num_new == 0:
    return "no new tokens"
  if num_new >= r:
    return f"appends of T={num_new} >= R={r} tokens can fill several blocks"
  p = r // (8 // fmt.key.bits)
  for name, v in (("R", r), ("G", g), ("R / codes per byte", p), ("head_dim", head_dim)):
    if not _pow2(v):
      return f"{name} = {v} is not a power of two (a Triton tile)"
  return None


def _next(x: jax.Array, up: bool) -> jax.Array:
  """``jnp.nextafter(x, +-inf)`` for finite `x` of a float dtype, via its bit pattern (integer
  tests only: XLA on CPU compares subnormals as zero, its nextafter does not)."""
  ut = _UINT[x.dtype.itemsize]
  sign, mag = ut(1 << (8 * x.dtype.itemsize - 1)), ut((1 << (8 * x.dtype.itemsize - 1)) - 1)
  u = lax.bitcast_convert_type(x, ut)
  neg = (u & sign) != 0
  grows = ~neg if up else neg  # magnitude grows: bits + 1; shrinks: bits - 1
  step = jnp.where(grows, u + ut(1), u - ut(1))
  tiny = ut(1) if up else sign | ut(1)  # +- the smallest subnormal
  return lax.bitcast_convert_type(jnp.where((u & mag) == 0, tiny, step), x.dtype)


def _round_up(x: jax.Array, dtype) -> jax.Array:
  """`quant.round_up`."""
  r = x.astype(dtype)
  r = jnp.where(r.astype(jnp.float32) < x, _next(r, True), r)
  return jnp.maximum(r, jnp.array(jnp.finfo(dtype).tiny, dtype))


def round_down(x: jax.Array, dtype) -> jax.Array:
  """`quant.round_down`."""
  r = x.astype(dtype)
  return jnp.where(r.astype(jnp.float32) > x, _next(r, False), r)


def step_for(span: jax.Array, qmax: int, dtype) -> jax.Array:
  """`quant.step_for`: the smallest `dtype` s >= tiny with ``s * qmax >= span``."""
  s = _round_up(span / qmax, dtype)
  down = _next(s, False)
  s = jnp.where((down > 0) & (down.astype(jnp.float32) * qmax >= span), down, s)
  s = jnp.where(s.astype(jnp.float32) * qmax < span, _next(s, True), s)
  return jnp.maximum(s, jnp.array(jnp.finfo(dtype).tiny, dtype))


def kivi_scale(lo: jax.Array, hi: jax.Array, qmax: int, dtype) -> tuple[jax.Array, jax.Array]:
  """`quant.compute_scale` for KIVI from a group's f32 min `lo` and max `hi`: (scale, zero) in
  `dtype`, the zero rounded down, a unit scale for a constant group."""
  mn = round_down(lo, dtype)
  span = hi - mn.astype(jnp.float32)
  return jnp.where(span > 0, step_for(span, qmax, dtype), jnp.ones_like(span, dtype)), mn


def div_round(t: jax.Array, s: jax.Array) -> jax.Array:
  """`quant.div_round` (``round_half_even(t / s)``, exact) for ``t >= 0``."""
  c = jnp.floor(t / s + 0.5)
  r = t - c * s
  half = s * 0.5
  c = jnp.where(r > half, c + 1, jnp.where(r < -half, c - 1, c))
  r = t - c * s
  odd = (c.astype(jnp.int32) & 1) != 0
  c = jnp.where((r == half) & odd, c + 1, c)
  c = jnp.where((r == -half) & odd, c - 1, c)
  return c


def flush_keys(b, h, length, count, new_ref, codes_ref, scale_ref, zero_ref, res_ref, *,
               fmt: KVFormat, barrier: bool, words: bool = False):
  """One (sequence b, KV head h) program's part of a `KeyFlush` (``T < R``).

  length, count: int32 scalars, sequence b's length before the append and the tokens it adds (the writer
  reads them from its inputs or derives them from the lengths, `write.write_rows`' lengths_before).
  Refs: new ``[B, K, T, H]`` keys;
  the aliased leaves codes ``[B, K, S / n, H]`` uint8 (n codes per byte; `words`: the "words"
  layout's ``[B, K, S, 8 bits]`` uint16, `kvjax.packing.pack_words` per token row), scale and zero
  ``[B, K, S / G, H]``, res ``[B, K, R, H]`` (read before it is rewritten).
  `barrier`: a CTA barrier between reading the residual and rewriting it (GPU).
  """
  spec, r_len, sink = fmt.key, fmt.residual, fmt.sink
  g_len, qmax, bits = spec.group_size, spec.qmax, spec.bits
  p_len = r_len // (8 // bits)  # rows of one packing plane
  n_new, hd = new_ref.shape[2], new_ref.shape[3]
  sd = jnp.dtype(spec.scale_dtype)
  f32 = jnp.float32
  blk = lax.div(length, r_len)  # block index of the residual's first slot (lengths >= 0)
  r = length - blk * r_len  # tokens in the residual
  lq = blk * r_len
  flush = r + count >= r_len

  for j in range(n_new):  # no flush: token j goes to residual slot r + j

    @pl.when(~flush & (j < count))
    def _store(j=j):
      res_ref[b, h, pl.ds(r + j, 1), :] = new_ref[b, h, pl.ds(j, 1), :].astype(res_ref.dtype)

  @pl.when(flush)
  def _flush():
    memo = {}  # per channel slab: the new rows and the sink replacement, loaded once

    def slab(c0, nc):  # (new rows [1, nc] each, sink replacement row or None) of channels [c0, c0 + nc)
      if (c0, nc) not in memo:
        cols = pl.ds(c0, nc)
        news = [new_ref[b, h, pl.ds(j, 1), cols].astype(f32) for j in range(n_new)]
        repl = None
        if sink:  # tokens before `sink` read as the block's first later token (cache._without_sinks)
          src = jnp.clip(sink - lq, 0, r_len - 1)
          repl = with_new(res_ref[b, h, pl.ds(src, 1), cols].astype(f32), src, news)
        memo[c0, nc] = news, repl
      return memo[c0, nc]

    def with_new(x, row, news):  # residual rows [n, C] at block rows `row` [n, 1], new tokens placed
      for j in range(n_new):
        x = jnp.where((row == r + j) & (j < count), news[j], x)
      return x

    def block_rows(start, n, c0=0, nc=hd):  # rows [start, start + n) of the block, channels [c0, c0 + nc)
      news, repl = slab(c0, nc)
      row = start + lax.broadcasted_iota(jnp.int32, (n, 1), 0)
      x = with_new(res_ref[b, h, pl.ds(start, n), pl.ds(c0, nc)].astype(f32), row, news)
      if sink:
        x = jnp.where(lq + row < sink, repl, x)
      return x, row

    def group_stats(x, row, cols):  # x [G, C] one group's rows: (scale, zero) [1, C] f32, stored
      lo, hi = jnp.min(x, axis=0, keepdims=True), jnp.max(x, axis=0, keepdims=True)  # [1, C]
      s, mn = kivi_scale(lo, hi, qmax, sd)
      scale_ref[b, h, pl.ds(row, 1), cols] = s.astype(scale_ref.dtype)
      zero_ref[b, h, pl.ds(row, 1), cols] = mn.astype(zero_ref.dtype)
      return s.astype(f32), mn.astype(f32)

    code_of = lambda x, sf, zf: jnp.clip(div_round(x - zf, sf), 0, qmax).astype(jnp.int32)
    if words:  # per group: H / 16 slabs of 16 channels; slab m at bits `bits` (m % n) of word tile m // n of the
      # group's [G, H bits / 16] words (n = 16 / bits codes a word)
      width, n, slabs = 16, 16 // bits, hd // 16
      for g in range(r_len // g_len):
        packed = [None] * (slabs // n)
        for m in range(slabs):
          x, _ = block_rows(g * g_len, g_len, m * width, width)
          sf, zf = group_stats(x, blk * (r_len // g_len) + g, pl.ds(m * width, width))
          code = code_of(x, sf, zf) << (bits * (m % n))
          packed[m // n] = code if packed[m // n] is None else packed[m // n] | code
        for t, words_t in enumerate(packed):
          codes_ref[b, h, pl.ds(lq + g * g_len, g_len), pl.ds(16 * t, 16)] = words_t.astype(codes_ref.dtype)
    else:
      cols = pl.ds(0, hd)
      stats = [group_stats(block_rows(g * g_len, g_len)[0], blk * (r_len // g_len) + g, cols)
               for g in range(r_len // g_len)]
      packed = None
      for i in range(8 // bits):
        x, row = block_rows(i * p_len, p_len)
        first, last = i * p_len // g_len, ((i + 1) * p_len - 1) // g_len  # groups in this plane
        sf, zf = stats[first]
        for g in range(first + 1, last + 1):
          sf = jnp.where(row >= g * g_len, stats[g][0], sf)
          zf = jnp.where(row >= g * g_len, stats[g][1], zf)
        code = code_of(x, sf, zf) << (i * bits)
        packed = code if packed is None else packed | code
      codes_ref[b, h, pl.ds(blk * p_len, p_len), :] = packed.astype(codes_ref.dtype)

    if barrier:  # every thread's residual reads are done before any thread rewrites it
      plgpu.debug_barrier()
    row = lax.broadcasted_iota(jnp.int32, (r_len, 1), 0)
    rest = jnp.zeros((r_len, hd), f32)
    news = slab(0, hd)[0]
    for j in range(n_new):  # tokens past the block start the next residual
      rest = jnp.where((row == r + j - r_len) & (j < count), news[j], rest)
    res_ref[b, h, :, :] = rest.astype(res_ref.dtype)
