"""The KIVI-2 tile step on e4m3 WGMMAs (`Options.fp8_mma`, session 37): the pieces of `mosaic_fp8_planes`
put together for `mosaic_kivi.kivi2_states` (KIVI-2 G=128 at head_dim 128, at most 8 query rows).

Per 128-token tile, with the code words as e4m3 A operands (4 planes of k = 32, 8 WGMMAs a product):

  logits [128 tok, 8] = (A_K . B_K)[:, hi] + (A_K . B_K)[:, lo], times 2^-e per column, plus q . z_K
  B_K = e4m3 words of (q 2^e) s_K        (per tile: the tile's key scales; q's exponent e once a program)
  o [128 ch, 8]      = o alpha + ((A_V . B_V)[:, hi] + (A_V . B_V)[:, lo]) 2^-VALUE_SCALE_LOG2
  B_V = e4m3 words of p s_V 2^VALUE_SCALE_LOG2, and sum_t p z_V kept as lazy per-thread sums

Each product accumulates fresh (the fp8 accumulator keeps fewer bits than f32) and is added in f32.
Ranges: e4m3 holds up to 448. B_K's largest value is below 2^-7 x 64 x 2^9 = 256 for scales below 64 (the
query's per-column exponent puts its largest magnitude in [2^-8, 2^-7)); B_V's below 64 x 2^9 x 2^-7 = 256
(p <= 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu import mosaic_fp8_planes as f8

__all__ = ["QUERY_TOP_LOG2", "VALUE_SCALE_LOG2", "query_halves", "make_step", "finish"]

QUERY_TOP_LOG2 = -8  # the query column's largest magnitude is scaled into [2^this, 2^(this + 1))
VALUE_SCALE_LOG2 = -7  # B_V = p s 2^9 / f 2^this


def query_halves(q16_ref, width: int, *, interpret: bool):
  """The program's query for B_K: (q_lo, q_hi [64, width] f32, the channels 0-63 and 64-127, each column
  times 2^e; inv [width] = 2^-e), from the fp16 query [128, 16] in shared memory."""
  q = q16_ref[...] if interpret else plgpu.load(q16_ref, (), layout=plgpu.Layout.WGMMA)
  q = q.astype(jnp.float32)[:, :width]
  top = jnp.max(jnp.abs(q), axis=0)
  # floor(log2(top)) from the exponent bits (Mosaic GPU lowers no floor); a zero column (padding) gets 1
  e = jnp.clip((lax.bitcast_convert_type(top, jnp.int32) >> 23) - 127, -100, 100)
  pow2 = lambda x: lax.bitcast_convert_type((x + 127) << 23, jnp.float32)  # 2^x, x in [-126, 127]
  q = q * pow2(QUERY_TOP_LOG2 - e)[None, :]
  return q[:64], q[64:], pow2(e - QUERY_TOP_LOG2)


def make_step(*, mma, softmax, l_update, width: int, interpret: bool, manual_barriers: bool):
  """step(length, first, bufs, query, lo0) -> the pipeline's step over one tile; bufs: (B_K's, B_V's views
  from `f8.b_buffers`), query: `query_halves`' output. mma / softmax / l_update: `kivi2_states`' own."""

  def build(length, first, bufs, query, lo0):
    bk, bv = bufs
    q_lo, q_hi, inv = query
    load = (lambda ref: ref[...]) if interpret else (
        lambda ref: plgpu.load(ref, (), layout=plgpu.Layout.WGMMA))
    row = (lambda ref: ref[...]) if interpret else (
        lambda ref: plgpu.load(ref, (), layout=plgpu.Layout.WGMMA.reduce(1)))

    def product(words_ref, views):
      by = f8.words_as_bytes(load(words_ref), interpret=interpret)
      pairs = [(lambda p=p: f8.fp8_plane(by, p, interpret=interpret), f8.b_slab(views, p, interpret=interpret))
               for p in range(f8.PLANES)]
      acc = mma(jnp.zeros((by.shape[0], 2 * width), jnp.float32), pairs)
      return acc[:, :width] + acc[:, width:]

    def step(idx, kc_s, vc_s, ks_s, kz_s, vs_s, vz_s, carry):
      o, m_prev, l_prev, cv = carry
      fac = f8.word_factors()
      with jax.named_scope("kprep"):
        s_lo, s_hi = (f8.rows_half(ks_s, i, interpret=interpret) * fac for i in range(2))
        f8.store_b(bk, f8.e4m3_words(q_lo * s_lo[:, None], q_hi * s_hi[:, None]), interpret=interpret)
        z_lo, z_hi = (f8.rows_half(kz_s, i, interpret=interpret) for i in range(2))
        dz = jnp.sum(q_lo * z_lo[:, None] + q_hi * z_hi[:, None], axis=0)  # q . z (scaled by 2^e)
        plgpu.commit_smem()
      with jax.named_scope("kmma"):
        sc = (product(kc_s, bk) + dz[None, :]) * inv[None, :]
      with jax.named_scope("softmax"):
        (p,), m_new, alpha = softmax([sc], first + idx[0], m_prev, length, lo0)
      with jax.named_scope("vprep"):
        vfac = fac * 2.0 ** VALUE_SCALE_LOG2
        v_lo, v_hi = (f8.rows_half(vs_s, i, interpret=interpret) * vfac for i in range(2))
        f8.store_b(bv, f8.e4m3_words(p[:64] * v_lo[:, None], p[64:] * v_hi[:, None]), interpret=interpret)
        cv = cv * alpha[None, :] + p * row(vz_s).astype(jnp.float32)[:, None]  # sum_t p z_t, lazily
        l_new = l_update(l_prev, alpha, p)
        plgpu.commit_smem()
      with jax.named_scope("vmma"):
        o = (o[0] * alpha[None, :] + product(vc_s, bv) * 2.0 ** -VALUE_SCALE_LOG2,)
      if manual_barriers:  # every thread is done with this slot before the pipeline refetches into it
        plgpu.commit_smem()
      return o, m_new, l_new, cv
    return step
  return build


def finish(o, cv):
  """The program's o [128 ch, width] plus the values' zero term (the lazy sums over the tokens)."""
  return o + jnp.sum(cv, axis=0)[None, :]

