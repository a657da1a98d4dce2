"""Fused dequantize+attend decode kernels: Pallas, Triton lowering.

One program per (sequence b, KV head k, context split s). The query heads of
KV head k (and the T query tokens) are packed into the rows of one ``[M, H]``
tile (M padded to 16), so every key/value block is read once for the whole
GQA group. Each split walks its share of ``[0, length)`` in blocks, keeps an
online-softmax state (o, m, l) in registers, and writes it out; `combine`
merges the splits with a log-sum-exp (flash-decoding).

Dequantization never materializes the cache (DESIGN.md section 3):
  * FP8 / INT8 codes are upcast to fp16 in registers (Hopper converts
    e4m3/e5m2 -> fp16 natively; bf16 is slow), dotted with the fp16 query,
    and the per-token key scale multiplies the logits; the per-token value
    scale multiplies the probabilities before the PV product. Probabilities
    times scale are kept in fp16 range by folding in the format's qmax and
    dividing it out once at the end.
  * INT4 nibbles (planar: byte j = channels j and j + H/2) and KIVI codes go
    through the 0x6400 trick: ``bitcast_f16(code | 0x6400) - 1024`` (- 1032
    for biased INT4), one OR and one SUB per element.
  * KIVI tiles are dequantized in registers, ``code * s + m`` in fp16 (keys:
    per-channel scale/zero of the tile's token group, one [1, H] row; values:
    per-token scale/zero of the tile's channel group, one [u, 1] column), and
    dotted with the fixed fp16 query / the fp16 probabilities. (Session 1
    scaled the query per group and the probabilities per value plane instead;
    that re-laid out the tensor-core operand for every small dot and needed
    cross-lane zero-point sums: 0.3 TB/s.)
  * FP8 e4m3 / INT8 can instead run q.k and p.v as 8-bit tensor-core dots on
    the stored codes (`narrow_qk`, `narrow_pv`): the other operand is split
    in two 8-bit terms, hi + lo/16 (or /254), per row, which keeps about
    bf16's 2^-8 relative precision without upcasting the cache tile.
  * KIVI residual windows are one extra program per (b, k) (split index NS):
    slots ``j < L % R`` hold full-precision keys, the other slots of the ring
    hold tokens whose keys are quantized in the last full block; values of
    all R slots come from the full-precision ring.

All logits are in log2 units (log2(e) folded into the query) and use exp2.
Static shapes: B, K, S, H, T, the format and the number of splits; lengths
are data, so decode never recompiles per step.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["FlatPlan", "KiviPlan", "flat_decode", "kivi_decode", "combine"]

NEG = -1e30
LOG2E = 1.4426950408889634


def _dot(a, b, trans_b=False):
  return plgpu.dot(a, b, trans_b=trans_b)


def _u4_to_f16(c, offset):
  """uint8 codes < 16 (or < 256 for KIVI-4 nibbles) -> fp16 ``code - offset`` via 0x6400."""
  x = c.astype(jnp.uint16) | jnp.uint16(0x6400)
  return lax.bitcast_convert_type(x, jnp.float16) - jnp.float16(1024 + offset)


@dataclasses.dataclass(frozen=True)
class FlatPlan:
  """Static description of a per-token format (bf16, fp8, int8, int4)."""
  key_kind: str       # "bf16" | "f8" | "i8" | "i4"
  value_kind: str
  key_scaled: bool    # per-token key scales present
  value_scaled: bool
  value_c: float      # qmax folded into p * scale (divided out at the end)
  num_queries: int    # T
  rows: int           # real rows = rep * T
  block: int          # tokens per iteration
  num_splits: int
  softcap: float | None = None
  narrow_qk: bool = False  # q . k on the tensor cores in the cache's own 8-bit type (two-term q)
  narrow_pv: bool = False  # p . v likewise (two-term p * scale)


def _two_term(x, dtype):
  """x [M, N] f32 -> (hi, lo, inv [M, 1]) with x ~= (hi + lo / LO) * inv row-wise, hi and lo
  in the 8-bit `dtype` (float8_e4m3fn or int8): about 2^-8 relative per element, bf16's level,
  so an 8-bit x 8-bit tensor-core dot needs no upcast of the cache tile."""
  top, lo_mult = (224.0, 16.0) if dtype != jnp.int8 else (127.0, 254.0)
  amax = jnp.max(jnp.abs(x), axis=1, keepdims=True)
  f = top / jnp.where(amax > 0, amax, 1.0)
  y = x * f
  if dtype == jnp.int8:
    hi_f = jnp.floor(y + 0.5)
    lo = jnp.floor((y - hi_f) * lo_mult + 0.5).astype(jnp.int8)
    hi = hi_f.astype(jnp.int8)
  else:
    hi = y.astype(dtype)
    lo = ((y - hi.astype(jnp.float32)) * lo_mult).astype(dtype)
  return hi, lo, 1.0 / f, 1.0 / lo_mult


def _two_term_dot(terms, c, trans_b):
  hi, lo, inv, lo_inv = terms
  return (_dot(hi, c, trans_b=trans_b) + _dot(lo, c, trans_b=trans_b) * lo_inv) * inv


def _row_qpos(length, m_rows, t):
  """Position of the query of each tile row: rows are (rep, T) flattened."""
  row = lax.broadcasted_iota(jnp.int32, (m_rows, 1), 0)
  return length - t + row % t  # [M, 1]


def _finish_logits(s, softcap):
  if softcap is not None:  # q carries sm_scale only; apply cap, then go to log2 units
    s = softcap * jnp.tanh(s / softcap) * LOG2E
  return s


def _split_range(length, block, num_splits, split):
  nblk = pl.cdiv(length, block)
  per = pl.cdiv(nblk, num_splits)
  lo = split * per
  hi = jnp.minimum(lo + per, nblk)
  return lo, jnp.maximum(hi - lo, 0)


def _store_state(o_ref, m_ref, l_ref, acc_parts, m, l, rows):
  """acc_parts: list of (column offset, [M, w] f32)."""
  m_rows = m.shape[0]
  rmask = lax.broadcasted_iota(jnp.int32, (m_rows,), 0) < rows
  for c0, a in acc_parts:
    plgpu.store(o_ref.at[:, pl.ds(c0, a.shape[1])], a, mask=rmask[:, None])
  plgpu.store(m_ref.at[:], m, mask=rmask)
  plgpu.store(l_ref.at[:], l, mask=rmask)


def _flat_kernel(len_ref, q_ref, k_ref, v_ref, *refs, plan: FlatPlan):
  refs = list(refs)
  ks_ref = refs.pop(0) if plan.key_scaled else None
  vs_ref = refs.pop(0) if plan.value_scaled else None
  o_ref, m_ref, l_ref = refs
  m_rows, h = q_ref.shape
  bs = plan.block
  length = len_ref[...]
  split = pl.program_id(2)
  qpos = _row_qpos(length, m_rows, plan.num_queries)
  qf = q_ref[...]
  half = h // 2
  if plan.key_kind == "bf16":
    qk = (qf.astype(jnp.bfloat16),)
  elif plan.narrow_qk:
    qk = _two_term(qf, k_ref.dtype)
  elif plan.key_kind == "i4":
    qk = (q_ref[:, pl.ds(0, half)].astype(jnp.float16), q_ref[:, pl.ds(half, half)].astype(jnp.float16))
  else:
    qk = (qf.astype(jnp.float16),)
  tok = lax.broadcasted_iota(jnp.int32, (1, bs), 1)
  v_parts = 2 if plan.value_kind == "i4" else 1
  vw = h // v_parts

  def body(i, carry):
    accs, m_prev, l_prev = carry
    t0 = i * bs
    kc = k_ref[pl.ds(t0, bs), :]
    if plan.key_kind == "bf16":
      s = _dot(qk[0], kc, trans_b=True)
    elif plan.narrow_qk:
      s = _two_term_dot(qk, kc, True)
    elif plan.key_kind == "i4":
      s = (_dot(qk[0], _u4_to_f16(kc & 0xF, 8), trans_b=True)
           + _dot(qk[1], _u4_to_f16(kc >> 4, 8), trans_b=True))
    else:
      s = _dot(qk[0], kc.astype(jnp.float16), trans_b=True)
    if plan.key_scaled:
      s = s * ks_ref[pl.ds(t0, bs)].astype(jnp.float32)[None, :]
    s = _finish_logits(s, plan.softcap)
    mask = (t0 + tok) <= qpos
    s = jnp.where(mask, s, NEG)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    alpha = jnp.exp2(m_prev - m_new)
    p = jnp.where(mask, jnp.exp2(s - m_new[:, None]), 0.0)
    l_new = l_prev * alpha + jnp.sum(p, axis=1)
    vc = v_ref[pl.ds(t0, bs), :]
    if plan.value_kind == "bf16":
      pv = (_dot(p.astype(jnp.bfloat16), vc),)
    else:
      pp = p
      if plan.value_scaled:
        pp = p * (vs_ref[pl.ds(t0, bs)].astype(jnp.float32) * plan.value_c)[None, :]
      if plan.narrow_pv:
        pv = (_two_term_dot(_two_term(pp, vc.dtype), vc, False),)
      elif plan.value_kind == "i4":
        pp = pp.astype(jnp.float16)
        pv = (_dot(pp, _u4_to_f16(vc & 0xF, 8)), _dot(pp, _u4_to_f16(vc >> 4, 8)))
      else:
        pv = (_dot(pp.astype(jnp.float16), vc.astype(jnp.float16)),)
    accs = tuple(a * alpha[:, None] + x for a, x in zip(accs, pv))
    return accs, m_new, l_new

  lo, n = _split_range(length, bs, plan.num_splits, split)
  accs = tuple(jnp.zeros((m_rows, vw), jnp.float32) for _ in range(v_parts))
  m0 = jnp.full((m_rows,), NEG, jnp.float32)
  l0 = jnp.zeros((m_rows,), jnp.float32)
  accs, m, l = lax.fori_loop(0, n, lambda j, c: body(lo + j, c), (accs, m0, l0))
  if plan.value_scaled and plan.value_c != 1.0:
    accs = tuple(a * (1.0 / plan.value_c) for a in accs)
  _store_state(o_ref, m_ref, l_ref, [(j * vw, a) for j, a in enumerate(accs)], m, l, plan.rows)


def _state_shapes(b, kh, ns, m_rows, h):
  return [jax.ShapeDtypeStruct((b, kh, ns, m_rows, h), jnp.float32),
          jax.ShapeDtypeStruct((b, kh, ns, m_rows), jnp.float32),
          jax.ShapeDtypeStruct((b, kh, ns, m_rows), jnp.float32)]


def _state_specs(m_rows, h):
  return [pl.BlockSpec((None, None, None, m_rows, h), lambda b, k, s: (b, k, s, 0, 0)),
          pl.BlockSpec((None, None, None, m_rows), lambda b, k, s: (b, k, s, 0)),
          pl.BlockSpec((None, None, None, m_rows), lambda b, k, s: (b, k, s, 0))]


def _seq_spec(shape):
  """Whole per-(b, k) slab of a [B, K, ...] array."""
  nd = len(shape)
  return pl.BlockSpec((None, None) + tuple(shape[2:]), lambda b, k, s: (b, k) + (0,) * (nd - 2))


def flat_decode(q, lengths, k_codes, v_codes, k_scale, v_scale, *, plan: FlatPlan,
                num_warps=4, num_stages=2, interpret=False):
  """q [B, K, M, H] f32 (pre-scaled); codes [B, K, S, H or H/2]; scales [B, K, S] or None.

  Returns per-split (o [B, K, NS, M, H], m, l).
  """
  b, kh, m_rows, h = q.shape
  ns = plan.num_splits
  args = [lengths, q, k_codes, v_codes]
  specs = [pl.BlockSpec((None,), lambda b_, k, s: (b_,)),
           pl.BlockSpec((None, None, m_rows, h), lambda b_, k, s: (b_, k, 0, 0)),
           _seq_spec(k_codes.shape), _seq_spec(v_codes.shape)]
  for sc in (k_scale, v_scale):
    if sc is not None:
      args.append(sc)
      specs.append(_seq_spec(sc.shape))
  return _split_states_call(functools.partial(_flat_kernel, plan=plan), args, specs,
                            (b, kh, ns, m_rows, h), num_warps, num_stages, interpret,
                            "kvjax_flat_decode")


# ----------------------------------------------------------------------------- KIVI


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
  join_values: bool = False  # one [u, H] value tile per key tile (planes interleaved), one dot
  tile_loop: bool = False    # loop over u-token tiles instead of unrolling each R-block (~4x less code)

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


def _kivi_key_tile(q16, k_ref, ks_ref, kz_ref, t0, plane, chunk, plan: KiviPlan):
  """[M, u] logits of one key tile: tokens ``t0 + plane * R/n + chunk * u ...`` of the R-block at
  t0 (plane and chunk may be traced). The [u, H] tile is dequantized in registers, ``code * s_g +
  m_g`` in fp16 (u <= G: one key group per tile), and dotted with the fixed fp16 query, so the
  query operand is laid out for the tensor cores once per program."""
  bits, u = plan.key_bits, plan.key_unit
  n = 8 // bits
  rows_per_plane = plan.residual // n
  byte_rows = k_ref[pl.ds(t0 // n + chunk * u, u), :]  # [u, H] uint8
  gi = (t0 + plane * rows_per_plane + chunk * u) // plan.key_group
  sc = ks_ref[pl.ds(gi, 1), :].astype(jnp.float16)  # [1, H]
  zr = kz_ref[pl.ds(gi, 1), :].astype(jnp.float16)
  shift = plane * bits
  if not isinstance(shift, int):
    shift = shift.astype(jnp.uint8)
  kf = _u4_to_f16((byte_rows >> shift) & ((1 << bits) - 1), 0) * sc + zr
  return _dot(q16, kf, trans_b=True)


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
  parts = [jnp.where(mk, s, NEG) for s, mk in zip(parts, masks)]
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
  qf = q_ref[...]
  q16 = qf.astype(jnp.float16)
  qpos = _row_qpos(length, m_rows, plan.num_queries)
  tok = lax.broadcasted_iota(jnp.int32, (1, u), 1)
  nv = 8 // plan.value_bits
  cpp = h // nv  # channels per value plane
  wv = plan.value_unit(h)
  gv = plan.value_group
  vmask = (1 << plan.value_bits) - 1
  m0 = jnp.full((m_rows,), NEG, jnp.float32)
  l0 = jnp.zeros((m_rows,), jnp.float32)
  n_vcols = cpp // wv
  n_vunits = nv * n_vcols
  tiles_per_block = r // u
  rows_per_plane = r * plan.key_bits // 8

  @pl.when(split < ns)
  def _quantized():
    lv = jnp.maximum(length - r, 0)  # tokens with quantized values (and keys)

    def values(accs, p, tu):
      """accs += p [M, u] times the dequantized values of tokens tu .. tu + u."""
      p16 = p.astype(jnp.float16)
      sz = {}

      def vscale(grp):  # per-token scale and zero of a channel group: [u, 1] fp16
        if grp not in sz:
          sz[grp] = (vs_ref[pl.ds(tu, u), pl.ds(grp, 1)].astype(jnp.float16),
                     vz_ref[pl.ds(tu, u), pl.ds(grp, 1)].astype(jnp.float16))
        return sz[grp]

      for jc in range(n_vcols):
        vb = v_ref[pl.ds(tu, u), pl.ds(jc * wv, wv)]  # [u, wv] uint8
        tiles = []
        for iv in range(nv):
          c0 = iv * cpp + jc * wv
          sc, zr = vscale(c0 // gv)
          tiles.append(_u4_to_f16((vb >> (iv * plan.value_bits)) & vmask, 0) * sc + zr)
        if plan.join_values:
          accs[0] = accs[0] + _dot(p16, _interleave(tiles))
        else:
          for iv, vf in enumerate(tiles):
            accs[iv * n_vcols + jc] = accs[iv * n_vcols + jc] + _dot(p16, vf)
      return accs

    def block_body(bi, carry):  # one R-block, every tile unrolled
      accs, m_prev, l_prev = carry
      t0 = bi * r
      logits = _kivi_key_logits(q16, k_ref, ks_ref, kz_ref, t0, plan)
      logits = [(off, _finish_logits(s, plan.softcap)) for off, s in logits]
      masks = [(t0 + off + tok) < lv for off, _ in logits]
      ps, m_new, l_new, alpha = _softmax_update([s for _, s in logits], masks, m_prev, l_prev)
      accs = [a * alpha[:, None] for a in accs]
      for (off, _), p in zip(logits, ps):
        accs = values(accs, p, t0 + off)
      return accs, m_new, l_new

    def tile_body(ti, carry):  # one key tile of u tokens (plane and chunk traced): a smaller program
      accs, m_prev, l_prev = carry
      bi = ti // tiles_per_block
      t0 = bi * r
      off = (ti - bi * tiles_per_block) * u  # (no traced %: it does not lower to Triton here)
      plane = off // rows_per_plane
      s = _kivi_key_tile(q16, k_ref, ks_ref, kz_ref, t0, plane,
                         (off - plane * rows_per_plane) // u, plan)
      (p,), m_new, l_new, alpha = _softmax_update([_finish_logits(s, plan.softcap)],
                                                  [(t0 + off + tok) < lv], m_prev, l_prev)
      return values([a * alpha[:, None] for a in accs], p, t0 + off), m_new, l_new

    if plan.tile_loop:
      body, (lo, n) = tile_body, _split_range(lv, u, ns, split)
    else:
      body, (lo, n) = block_body, _split_range(lv, r, ns, split)
    if plan.join_values:  # columns in joined_channel_order; ops un-permutes after the kernel
      accs = [jnp.zeros((m_rows, h), jnp.float32)]
    else:
      accs = [jnp.zeros((m_rows, wv), jnp.float32) for _ in range(n_vunits)]
    accs, m, l = lax.fori_loop(0, n, lambda j, c: body(lo + j, c), (accs, m0, l0))
    if plan.join_values:
      parts = [(0, accs[0])]
    else:
      parts = [(iv * cpp + jc * wv, accs[iv * n_vcols + jc]) for iv in range(nv) for jc in range(n_vcols)]
    _store_state(o_ref, m_ref, l_ref, parts, m, l, plan.rows)

  @pl.when(split == ns)
  def _residual():
    rem = length % r
    lq = length - rem
    tb = jnp.maximum(lq - r, 0)
    qb = qf.astype(jnp.bfloat16)

    def slot_logits(off, sq):
      """Ring slots off .. off + u: the full-precision key where written this block, else the
      quantized key of the last full block (token lq - r + slot)."""
      sr = _dot(qb, kr_ref[pl.ds(off, u), :].astype(jnp.bfloat16), trans_b=True)
      slot = off + tok
      use_res = slot < rem
      t = jnp.where(use_res, lq + slot, lq - r + slot)
      return _finish_logits(jnp.where(use_res, sr, sq), plan.softcap), (t >= 0) & (t <= qpos)

    def pv(off, p):
      return _dot(p.astype(jnp.bfloat16), vr_ref[pl.ds(off, u), :].astype(jnp.bfloat16))

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
    _store_state(o_ref, m_ref, l_ref, [(0, acc)], m, l, plan.rows)


def kivi_decode(q, lengths, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, k_res, v_res, *,
                plan: KiviPlan, num_warps=4, num_stages=2, interpret=False):
  """KIVI decode: per-split states (o, m, l) with NS + 1 splits (the last: residual window)."""
  b, kh, m_rows, h = q.shape
  ns = plan.num_splits + 1
  args = [lengths, q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, k_res, v_res]
  specs = ([pl.BlockSpec((None,), lambda b_, k, s: (b_,)),
            pl.BlockSpec((None, None, m_rows, h), lambda b_, k, s: (b_, k, 0, 0))]
           + [_seq_spec(a.shape) for a in args[2:]])
  return _split_states_call(functools.partial(_kivi_kernel, plan=plan), args, specs,
                            (b, kh, ns, m_rows, h), num_warps, num_stages, interpret,
                            "kvjax_kivi_decode")


def _split_states_call(kernel, args, specs, dims, num_warps, num_stages, interpret, name):
  """One program per (sequence, KV head, split) writing that split's (o, m, l) state."""
  b, kh, ns, m_rows, h = dims
  return pl.pallas_call(
      kernel,
      grid=(b, kh, ns),
      in_specs=specs,
      out_specs=_state_specs(m_rows, h),
      out_shape=_state_shapes(b, kh, ns, m_rows, h),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name=name,
  )(*args)


def combine(o, m, l, rows):
  """Log-sum-exp merge of split states -> normalized [B, K, rows, H] f32 (zero where nothing visible)."""
  o, m, l = o[:, :, :, :rows], m[:, :, :, :rows], l[:, :, :, :rows]
  m_max = jnp.max(m, axis=2, keepdims=True)
  w = jnp.exp2(m - m_max)
  l_tot = jnp.sum(l * w, axis=2)
  out = jnp.sum(o * w[..., None], axis=2)
  return jnp.where(l_tot[..., None] > 0, out / jnp.where(l_tot > 0, l_tot, 1.0)[..., None], 0.0)
