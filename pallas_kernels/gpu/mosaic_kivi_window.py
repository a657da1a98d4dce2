"""The residual window's program of the Mosaic GPU KIVI kernel (`mosaic_kivi.kivi2_states` with `window=`):
program (b, k, NS) of the grid scores the window's 128 ring slots against the query rows and returns one more
flash-decoding state, while the others walk the quantized tiles. It shares the tile loop's builders (the
scale columns, the word tiles, the WGMMA sums), which `WindowParts` carries in from the kernel being built.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu import mosaic_groups as groups, mosaic_planes as planes
from pallas_kernels.gpu.mosaic_common import soft_capped
from pallas_kernels.gpu.mosaic_kivi_checks import ROWS
from pallas_kernels.gpu.mosaic_kivi_ref import NEG, TILE

__all__ = ["WindowParts", "window_state"]


@dataclasses.dataclass(frozen=True)
class WindowParts:
  """What the window's program takes from the kernel `mosaic_kivi.kivi2_states` builds: head_dim h, vh value
  halves (128-channel accumulators), the code width, codes a word, grouped (G=32) scales, the window's query
  tokens, soft-cap and sliding window, the ring's key and value dtypes, the shared-memory transforms of the
  code and query tiles, and the tile loop's builders: `col(ref, m, rows)` (a scale column as fp16 rows),
  `word_tiles(ref, load)` and `mma(acc, [(A builder, B ref), ...])`; key_part: the ring's keys pass through
  shared memory key_part channels at a time (32: 8 KB less than 64, for a program of at most 44 KB)."""
  h: int
  vh: int
  bits: int
  per_word: int
  grouped: bool
  w_queries: int
  softcap: float | None
  sliding: int | None
  interpret: bool
  k_dtype: Any
  v_dtype: Any
  code_tiles: tuple
  b_tiles: tuple
  col: Callable
  word_tiles: Callable
  mma: Callable
  key_part: int = TILE // 2

  def __post_init__(self):
    if self.key_part not in (32, 64):
      raise ValueError(f"key_part must be 32 or 64 channels, got {self.key_part}")


def window_state(parts: WindowParts, bi, ki, lw_g, kc_g, ks_g, kz_g, kres_g, vres_g, q_smem, fetch_query, q16_smem,
                 bar, magic):
  """The residual window's state (o: [128, N] per 128 channels, m, l [N]): ring slot i < L % 128 holds
  token Lq + i (key `k_res[i]`), slot i >= L % 128 token Lq - 128 + i (key row i of the quantized tile Lq / 128 - 1;
  present iff Lq >= 128), value `v_res[i]` either way (`window_merge`'s rule). Both key sources are
  scored for every slot and the slot's own picked: the quantized tile as the main loop's register A
  (codes, scales and zeros loaded from global memory right where each plane is built), the ring from
  shared memory (in parts of key_part channels) against the query split into two 16-bit terms (q = hi +
  lo: the ring's dtype, near-f32 logits). The values, the transposed A of the second product, pass
  through shared memory in two halves of 64 slots; the scopes reuse the quantized tiles' buffers.
  q16_smem: the tiles' fp16 query [H, 16], or None (theirs is K-major,
  `Options.narrow_mma`): a scoped copy is made from the f32 one."""
  h, vh, bits, per_word, grouped, w_queries = parts.h, parts.vh, parts.bits, parts.per_word, parts.grouped, parts.w_queries
  softcap, sliding, interpret, col, mma = parts.softcap, parts.sliding, parts.interpret, parts.col, parts.mma
  code_tiles, b_tiles = parts.code_tiles, parts.b_tiles
  length = lw_g[bi]
  rem = length % TILE
  lq = length - rem
  tile = jnp.maximum(lq // TILE - 1, 0)
  gload = lambda ref, layout: plgpu.load(ref, layout=layout, optimized=False)
  half, kp = TILE // 2, parts.key_part
  rdt = parts.k_dtype

  def keys(kbuf, q_hi, q_lo, *extra):  # extra: the f32 query fetched again (when no resident copy), then
    # the fp16 query (when the tiles' is K-major: `Options.narrow_mma`)
    q32 = extra[:1] if q_smem is None else ()
    q16 = extra[-1] if q16_smem is None else q16_smem
    if q32:
      fetch_query(q32[0])
    plgpu.copy_gmem_to_smem(kres_g.at[bi, ki, :, pl.ds(0, kp)], kbuf, bar)
    q = (q32[0] if q32 else q_smem)[...]
    hi = q.astype(rdt)
    q_hi[...] = hi
    q_lo[...] = (q - hi.astype(jnp.float32)).astype(rdt)
    if q16_smem is None:
      q16[...] = q.astype(jnp.float16)
    plgpu.commit_smem()
    with jax.named_scope("wkeys"):
      words = parts.word_tiles(kc_g.at[bi, ki, pl.ds(tile * TILE, TILE)], lambda r: gload(r, plgpu.Layout.WGMMA))
      hiw = [lax.shift_right_logical(w, jnp.uint16(planes.hi_shift(bits))) for w in words]

      def a(i):
        gcol = lambda ref: (col(ref.at[bi, ki, pl.ds(tile * groups.GROUPS, groups.GROUPS)], i, TILE) if grouped else
                            jnp.broadcast_to(gload(ref.at[bi, ki, pl.ds(tile * h + 16 * i, 16)],
                                                   plgpu.Layout.WGMMA.reduce(0)).astype(jnp.float16)[None, :],
                                             (TILE, 16)))
        t, m = divmod(i, per_word)
        return planes.plane_masked(words[t], hiw[t], m, magic, bits) * gcol(ks_g) + gcol(kz_g)
      sc_q = mma(jnp.zeros((TILE, ROWS), jnp.float32),
                 [(functools.partial(a, i), q16.at[pl.ds(16 * i, 16)]) for i in range(h // 16)])
      sc_r = jnp.zeros((TILE, ROWS), jnp.float32)
      for part in range(h // kp):
        if part:
          plgpu.copy_gmem_to_smem(kres_g.at[bi, ki, :, pl.ds(part * kp, kp)], kbuf, bar)
        plgpu.barrier_wait(bar)
        sc_r = mma(sc_r, [(functools.partial(lambda j: kbuf.at[:, pl.ds(16 * j, 16)], j),
                           qt.at[pl.ds(part * kp + 16 * j, 16)]) for j in range(kp // 16) for qt in (q_hi, q_lo)])
    return sc_q, sc_r
  sc_q, sc_r = pl.run_scoped(keys, plgpu.SMEM((TILE, kp), rdt, transforms=code_tiles),
                             plgpu.SMEM((h, ROWS), rdt, transforms=b_tiles),
                             plgpu.SMEM((h, ROWS), rdt, transforms=b_tiles),
                             *(() if q_smem is not None else (plgpu.SMEM((h, ROWS), jnp.float32),)),
                             *(() if q16_smem is not None else
                               (plgpu.SMEM((h, ROWS), jnp.float16, transforms=b_tiles),)))
  slot = lax.broadcasted_iota(jnp.int32, (TILE, ROWS), 0)
  from_res = slot < rem
  token = jnp.where(from_res, lq + slot, lq - TILE + slot)
  qpos = length - w_queries + lax.broadcasted_iota(jnp.int32, (TILE, ROWS), 1) % w_queries
  visible = (from_res | (lq >= TILE)) & (token <= qpos)
  if sliding is not None:
    visible = visible & (token > qpos - sliding)
  sc = jnp.where(from_res, sc_r, sc_q)
  sc = jnp.where(visible, sc if softcap is None else soft_capped(sc, softcap), NEG)
  m_w = jnp.max(sc, axis=0)
  p = jnp.where(visible, jnp.exp2(sc - m_w[None, :]), 0.0)

  def values(vbuf, pw_smem):
    copy_half = lambda part: plgpu.copy_gmem_to_smem(vres_g.at[bi, ki, pl.ds(part * half, half)], vbuf, bar)
    copy_half(0)
    with jax.named_scope("wvalues"):
      pw_smem[...] = p.astype(pw_smem.dtype)
      plgpu.commit_smem()
      o = (jnp.zeros((TILE, ROWS), jnp.float32),) * vh
      for part in range(2):
        if part:
          copy_half(part)
        plgpu.barrier_wait(bar)
        vt = lambda j, u: (vbuf[pl.ds(16 * j, 16), pl.ds(TILE * u, TILE)].T if interpret  # [128 channels, 16 slots]
                           else vbuf.at[pl.ds(16 * j, 16), pl.ds(TILE * u, TILE)].transpose((1, 0)))
        o = tuple(mma(o_u, [(functools.partial(vt, j, u), pw_smem.at[pl.ds(part * half + 16 * j, 16)])
                            for j in range(half // 16)]) for u, o_u in enumerate(o))
    return o
  o = pl.run_scoped(values, plgpu.SMEM((half, h), parts.v_dtype, transforms=code_tiles),
                    plgpu.SMEM((TILE, ROWS), parts.v_dtype, transforms=b_tiles))
  return o, m_w, jnp.sum(p, axis=0)
