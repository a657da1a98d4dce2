"""KIVI decode kernel: Pallas, Triton lowering (the shared skeleton is `decode`).

Same program layout as the per-token kernels (one program per (sequence, KV
head, split), GQA rows packed, flash-decoding states merged by
`decode.combine`), over KIVI's layout: keys packed planar along tokens in
blocks of R with per-channel scale/zero per token group, values packed planar
along channels with per-token scale/zero per channel group, and a
full-precision residual ring of R tokens.
  * Tiles are dequantized in registers, ``code * s + m`` in fp16 after the
    0x6400 trick (keys: per-channel scale/zero of the tile's token group, one
    [1, H] row; values: per-token scale/zero of the tile's channel group, one
    [u, 1] column), and dotted with the fixed fp16 query / the fp16
    probabilities. (Session 1 scaled the query per group and the
    probabilities per value plane instead; that re-laid out the tensor-core
    operand for every small dot and needed cross-lane zero-point sums.)
  * Options, off until timed: `join_values` interleaves a token tile's value
    planes into one [u, H] tile (one dot per key tile); `tile_loop` steps the
    loop one key tile at a time instead of unrolling each R-block (2.7x less
    Triton IR, faster compiles).
  * The residual window is one extra program per (b, k) (split index NS):
    slots ``j < L % R`` hold full-precision keys, the other slots of the ring
    hold tokens whose keys are quantized in the last full block; values of
    all R slots come from the full-precision ring.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.gpu import decode as base

__all__ = ["KiviPlan", "kivi_decode"]


@dataclasses.dataclass(frozen=True)
class KiviPlan:
  """Static description of a KIVI format."""
  key_bits: int
  key_group: int
  value_bits: int
  value_group: int
  residual: int       # R: key packing block and residual window
  num_queries: int
  rows: int
  num_splits: int     # splits over the quantized region; +1 program for the residual
  softcap: float | None = None
  window: int | None = None  # sliding window: keys in (qpos - window, qpos]
  join_values: bool = False  # one [u, H] value tile per key tile (planes interleaved), one dot
  tile_loop: bool = False    # loop over u-token tiles, not unrolled R-blocks (2.7x less Triton IR)
  prefetch: int = 0          # tile_loop: scale/zero rows and columns loaded this many tiles ahead
  packed_unpack: bool = False  # codes unpacked 4 bytes at a time by inline PTX (GPU only)
  fold_value_scales: bool = False  # p * s . (1024 + code) + per-row correction: no per-element FMA
  q_scale: float = 1.0  # the query is multiplied by this in the kernel (softmax scale, log2 e)

  @property
  def key_unit(self):  # tokens per key tile: one plane of a byte-row chunk, within one group
    return min(self.key_group, self.residual * self.key_bits // 8)

  def value_unit(self, h):  # channels per value tile
    return min(self.value_group, h * self.value_bits // 8)

  def joined_channel_order(self, h):
    """Channel held by column j of a joined value tile (and of the quantized splits' output)."""
    nv, cpp = 8 // self.value_bits, h * self.value_bits // 8
    return [(j % nv) * cpp + j // nv for j in range(h)]


def _interleave(tiles):
  """Same-shape [u, w] tiles -> [u, n*w], column n*c + i = tiles[i][:, c] (n a power of two),
  by pairwise last-axis joins (register shuffles in Triton, no shared memory)."""
  while len(tiles) > 1:
    half = len(tiles) // 2
    tiles = [jnp.stack([tiles[i], tiles[i + half]], axis=-1).reshape(tiles[i].shape[0], -1)
             for i in range(half)]
  return tiles[0]


def _kivi_key_tile(q16, k_ref, ks_ref, kz_ref, t0, plane, chunk, plan: KiviPlan, scale_zero=None):
  """[M, u] logits of one key tile: tokens ``t0 + plane * R/n + chunk * u ...`` of the R-block at
  t0 (plane and chunk may be traced). The [u, H] tile is dequantized in registers, ``code * s_g +
  m_g`` in fp16 (u <= G: one key group per tile), and dotted with the fixed fp16 query, so the
  query operand is laid out for the tensor cores once per program. scale_zero: the tile's group
  ([1, H] scale, [1, H] zero) already loaded (prefetched), else loaded here."""
  bits, u = plan.key_bits, plan.key_unit
  n = 8 // bits
  rows_per_plane = plan.residual // n
  byte_rows = k_ref[pl.ds(t0 // n + chunk * u, u), :]  # [u, H] uint8
  if scale_zero is None:
    gi = (t0 + plane * rows_per_plane + chunk * u) // plan.key_group
    scale_zero = (ks_ref[pl.ds(gi, 1), :], kz_ref[pl.ds(gi, 1), :])  # [1, H]
  sc, zr = (x.astype(jnp.float16) for x in scale_zero)
  kf = base.unpack_f16(byte_rows, plane * bits, bits, 0, plan.packed_unpack) * sc + zr
  return base._dot(q16, kf, trans_b=True)


def _kivi_key_logits(q16, k_ref, ks_ref, kz_ref, t0, plan: KiviPlan):
  """Logits of the quantized keys of the R-block at token t0 (multiple of R), every tile
  unrolled: a sorted list of (token offset in block, [M, u] logits)."""
  n = 8 // plan.key_bits
  rows_per_plane = plan.residual // n
  u = plan.key_unit
  out = [(i * rows_per_plane + j * u, _kivi_key_tile(q16, k_ref, ks_ref, kz_ref, t0, i, j, plan))
         for j in range(rows_per_plane // u) for i in range(n)]
  return sorted(out, key=lambda x: x[0])


def _softmax_update(parts, masks, m_prev, l_prev):
  """Online softmax over a block made of several logit tiles."""
  parts = [jnp.where(mk, s, base.NEG) for s, mk in zip(parts, masks)]
  m_blk = functools.reduce(jnp.maximum, [jnp.max(s, axis=1) for s in parts])
  m_new = jnp.maximum(m_prev, m_blk)
  alpha = jnp.exp2(m_prev - m_new)
  ps = [jnp.where(mk, jnp.exp2(s - m_new[:, None]), 0.0) for s, mk in zip(parts, masks)]
  l_new = l_prev * alpha + functools.reduce(lambda a, c: a + c, [jnp.sum(p, axis=1) for p in ps])
  return ps, m_new, l_new, alpha


def _kivi_kernel(len_ref, q_ref, k_ref, ks_ref, kz_ref, v_ref, vs_ref, vz_ref, kr_ref, vr_ref,
                 o_ref, m_ref, l_ref, *, plan: KiviPlan):
  m_rows, h = q_ref.shape
  r = plan.residual
  u = plan.key_unit
  length = len_ref[...]
  split = pl.program_id(2)
  ns = plan.num_splits
  qf = base.load_q(q_ref, plan.rows, plan.q_scale)
  q16 = qf.astype(jnp.float16)
  qpos = base._row_qpos(length, m_rows, plan.num_queries)
  tok = lax.broadcasted_iota(jnp.int32, (1, u), 1)
  nv = 8 // plan.value_bits
  cpp = h // nv  # channels per value plane
  wv = plan.value_unit(h)
  gv = plan.value_group
  m0 = jnp.full((m_rows,), base.NEG, jnp.float32)
  l0 = jnp.zeros((m_rows,), jnp.float32)
  n_vcols = cpp // wv
  n_vunits = nv * n_vcols
  tiles_per_block = r // u
  rows_per_plane = r * plan.key_bits // 8
  last_tile = vs_ref.shape[0] // u - 1  # capacity // u - 1
  value_groups = sorted({(iv * cpp + jc * wv) // gv for iv in range(nv) for jc in range(cpp // wv)})

  @pl.when(split < ns)
  def _quantized():
    lv = jnp.maximum(length - r, 0)  # tokens with quantized values (and keys)

    def quantized_visible(pos):  # every query sees all of [0, lv) but for the sliding window
      ok = pos < lv
      return ok if plan.window is None else ok & (pos > qpos - plan.window)

    def value_scale_zero(tu):
      """{channel group: ([u, 1] scale, [u, 1] zero)} of tokens tu .. tu + u, stored dtype ([u]
      each with `fold_value_scales`: they scale the probabilities' columns)."""
      if plan.fold_value_scales:
        return {g: (vs_ref[pl.ds(tu, u), g], vz_ref[pl.ds(tu, u), g]) for g in value_groups}
      return {g: (vs_ref[pl.ds(tu, u), pl.ds(g, 1)], vz_ref[pl.ds(tu, u), pl.ds(g, 1)])
              for g in value_groups}

    def folded_values(accs, p, tu, vsz=None):
      """`values` with the per-token scale and zero folded into p (`fold_value_scales`): for a
      tile of one channel group g, ``sum_t p_t (s_t c + z_t) = (p * s) . (1024 + c) + sum_t (p_t z_t
      - 1024 (p s)_t)``, the codes used as unpacked (``0x6400 | c`` is fp16 1024 + c, exact; the
      products are exact in the f32 accumulator), the correction one row sum per group."""
      sz = value_scale_zero(tu) if vsz is None else vsz
      p_g, corr = {}, {}
      for g, (sc, zr) in sz.items():
        ps = (p * sc.astype(jnp.float32)[None, :]).astype(jnp.float16)  # [M, u]
        p_g[g] = ps
        corr[g] = jnp.sum(p * zr.astype(jnp.float32)[None, :] - 1024.0 * ps.astype(jnp.float32),
                          axis=1)[:, None]
      for jc in range(n_vcols):
        vb = v_ref[pl.ds(tu, u), pl.ds(jc * wv, wv)]  # [u, wv] uint8
        for iv in range(nv):
          g = (iv * cpp + jc * wv) // gv
          raw = base.unpack_f16(vb, iv * plan.value_bits, plan.value_bits, -1024, plan.packed_unpack)
          accs[iv * n_vcols + jc] = accs[iv * n_vcols + jc] + base._dot(p_g[g], raw) + corr[g]
      return accs

    def values(accs, p, tu, vsz=None):
      """accs += p [M, u] times the dequantized values of tokens tu .. tu + u (vsz: their
      value_scale_zero, already loaded)."""
      if plan.fold_value_scales:
        return folded_values(accs, p, tu, vsz)
      p16 = p.astype(jnp.float16)
      sz = {g: tuple(x.astype(jnp.float16) for x in v)
            for g, v in (value_scale_zero(tu) if vsz is None else vsz).items()}

      for jc in range(n_vcols):
        vb = v_ref[pl.ds(tu, u), pl.ds(jc * wv, wv)]  # [u, wv] uint8
        tiles = []
        for iv in range(nv):
          c0 = iv * cpp + jc * wv
          sc, zr = sz[c0 // gv]
          tiles.append(base.unpack_f16(vb, iv * plan.value_bits, plan.value_bits, 0,
                                       plan.packed_unpack) * sc + zr)
        if plan.join_values:
          accs[0] = accs[0] + base._dot(p16, _interleave(tiles))
        else:
          for iv, vf in enumerate(tiles):
            accs[iv * n_vcols + jc] = accs[iv * n_vcols + jc] + base._dot(p16, vf)
      return accs

    def block_body(bi, carry):  # one R-block, every tile unrolled
      accs, m_prev, l_prev = carry
      t0 = bi * r
      logits = _kivi_key_logits(q16, k_ref, ks_ref, kz_ref, t0, plan)
      logits = [(off, base._finish_logits(s, plan.softcap)) for off, s in logits]
      masks = [quantized_visible(t0 + off + tok) for off, _ in logits]
      ps, m_new, l_new, alpha = _softmax_update([s for _, s in logits], masks, m_prev, l_prev)
      accs = [a * alpha[:, None] for a in accs]
      for (off, _), p in zip(logits, ps):
        accs = values(accs, p, t0 + off)
      return accs, m_new, l_new

    def tile_geometry(ti):
      bi = ti // tiles_per_block
      t0 = bi * r
      off = (ti - bi * tiles_per_block) * u  # (no traced %: it does not lower to Triton here)
      plane = off // rows_per_plane
      return t0, off, plane, (off - plane * rows_per_plane) // u

    def tile_scales(ti):
      """A tile's key-group scale/zero rows and value scale/zero columns, stored dtype: with
      `prefetch` these loads are issued tiles ahead and carried unconverted (Triton pipelines only
      the code tiles; a [1, H] or [u, 1] bf16 load is 2 bytes per thread, too small for cp.async)."""
      t0, off, plane, chunk = tile_geometry(jnp.minimum(ti, last_tile))
      gi = (t0 + plane * rows_per_plane + chunk * u) // plan.key_group
      return (ks_ref[pl.ds(gi, 1), :], kz_ref[pl.ds(gi, 1), :]), value_scale_zero(t0 + off)

    def tile_body(ti, carry):  # one key tile of u tokens (plane and chunk traced): a smaller program
      accs, m_prev, l_prev, ahead = carry
      if plan.prefetch:
        (ksz, vsz), ahead = ahead[0], ahead[1:] + (tile_scales(ti + plan.prefetch),)
      else:
        ksz = vsz = None
      t0, off, plane, chunk = tile_geometry(ti)
      s = _kivi_key_tile(q16, k_ref, ks_ref, kz_ref, t0, plane, chunk, plan, ksz)
      (p,), m_new, l_new, alpha = _softmax_update([base._finish_logits(s, plan.softcap)],
                                                  [quantized_visible(t0 + off + tok)], m_prev, l_prev)
      return values([a * alpha[:, None] for a in accs], p, t0 + off, vsz), m_new, l_new, ahead

    start = base._window_start(length, plan.num_queries, plan.window)
    if plan.tile_loop:
      body, (lo, n) = tile_body, base._split_range(lv, u, ns, split, start)
    else:
      body, (lo, n) = block_body, base._split_range(lv, r, ns, split, start)
    if plan.join_values:  # columns in joined_channel_order; ops un-permutes after the kernel
      accs = [jnp.zeros((m_rows, h), jnp.float32)]
    else:
      accs = [jnp.zeros((m_rows, wv), jnp.float32) for _ in range(n_vunits)]
    if plan.tile_loop:
      ahead0 = tuple(tile_scales(lo + d) for d in range(plan.prefetch))
      accs, m, l, _ = lax.fori_loop(0, n, lambda j, c: body(lo + j, c), (accs, m0, l0, ahead0))
    else:
      accs, m, l = lax.fori_loop(0, n, lambda j, c: body(lo + j, c), (accs, m0, l0))
    if plan.join_values:
      parts = [(0, accs[0])]
    else:
      parts = [(iv * cpp + jc * wv, accs[iv * n_vcols + jc]) for iv in range(nv) for jc in range(n_vcols)]
    base._store_state(o_ref, m_ref, l_ref, parts, m, l, plan.rows)

  @pl.when(split == ns)
  def _residual():
    rem = length % r
    lq = length - rem
    tb = jnp.maximum(lq - r, 0)
    qb = qf.astype(jnp.bfloat16)

    def slot_logits(off, sq):
      """Ring slots off .. off + u: the full-precision key where written this block, else the
      quantized key of the last full block (token lq - r + slot)."""
      sr = base._dot(qb, kr_ref[pl.ds(off, u), :].astype(jnp.bfloat16), trans_b=True)
      slot = off + tok
      use_res = slot < rem
      t = jnp.where(use_res, lq + slot, lq - r + slot)
      return base._finish_logits(jnp.where(use_res, sr, sq), plan.softcap), (t >= 0) & base._visible(t, qpos, plan.window)

    def pv(off, p):
      return base._dot(p.astype(jnp.bfloat16), vr_ref[pl.ds(off, u), :].astype(jnp.bfloat16))

    acc = jnp.zeros((m_rows, h), jnp.float32)
    if plan.tile_loop:  # online softmax over the ring's tiles
      def step(w, carry):
        acc, m_prev, l_prev = carry
        off = w * u
        plane = off // rows_per_plane
        sq = _kivi_key_tile(q16, k_ref, ks_ref, kz_ref, tb, plane,
                            (off - plane * rows_per_plane) // u, plan)
        s_, mk = slot_logits(off, sq)
        (p,), m_new, l_new, alpha = _softmax_update([s_], [mk], m_prev, l_prev)
        return acc * alpha[:, None] + pv(off, p), m_new, l_new
      acc, m, l = lax.fori_loop(0, tiles_per_block, step, (acc, m0, l0))
    else:
      qlog = _kivi_key_logits(q16, k_ref, ks_ref, kz_ref, tb, plan)
      parts, masks = zip(*[slot_logits(off, sq) for off, sq in qlog])
      ps, m, l, _ = _softmax_update(list(parts), list(masks), m0, l0)
      for (off, _), p in zip(qlog, ps):
        acc = acc + pv(off, p)
    base._store_state(o_ref, m_ref, l_ref, [(0, acc)], m, l, plan.rows)


def kivi_decode(q, lengths, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, k_res, v_res, *,
                plan: KiviPlan, num_warps=4, num_stages=2, interpret=False):
  """KIVI decode of q [B, K, rows, H] (scaled by plan.q_scale and padded in the kernel, as in
  `decode.flat_decode`): per-split states (o, m, l) with NS + 1 splits (the last: residual window)."""
  b, kh, _, h = q.shape
  m_rows, qs = base.q_spec(q.shape, plan.rows)
  ns = plan.num_splits + 1
  args = [lengths, q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, k_res, v_res]
  specs = ([pl.BlockSpec((None,), lambda b_, k, s: (b_,)), qs]
           + [base.seq_spec(a.shape) for a in args[2:]])
  return base.split_states_call(functools.partial(_kivi_kernel, plan=plan), args, specs,
                            (b, kh, ns, m_rows, h), num_warps, num_stages, interpret,
                            "kvjax_kivi_decode")
