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
  * KIVI keys (per-channel groups along tokens, packed planar along tokens in
    blocks of R): per group the query is scaled once, ``q*s_g``, dotted with
    raw codes, plus the constant ``q . m_g``. KIVI values (per-token groups
    along channels): ``p_t * s_tg`` before the PV product plus ``sum_t p_t
    m_tg``.
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
      pp = pp.astype(jnp.float16)
      if plan.value_kind == "i4":
        pv = (_dot(pp, _u4_to_f16(vc & 0xF, 8)), _dot(pp, _u4_to_f16(vc >> 4, 8)))
      else:
        pv = (_dot(pp, vc.astype(jnp.float16)),)
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

  @property
  def key_unit(self):  # tokens per key tile: one plane of a byte-row chunk, within one group
    return min(self.key_group, self.residual * self.key_bits // 8)

  def value_unit(self, h):  # channels per value tile
    return min(self.value_group, h * self.value_bits // 8)


def _kivi_key_logits(q, k_ref, ks_ref, kz_ref, t0, plan: KiviPlan):
  """Logits of the quantized keys of the R-block at token t0 (multiple of R).

  Returns a list of (token offset in block, [M, u] logits), u = key_unit.
  """
  r, bits, g = plan.residual, plan.key_bits, plan.key_group
  n = 8 // bits
  rows_per_plane = r // n
  u = plan.key_unit
  mask = (1 << bits) - 1
  cache = {}
  out = []
  for j in range(rows_per_plane // u):
    byte_rows = k_ref[pl.ds(t0 // n + j * u, u), :]  # [u, H] uint8
    for i in range(n):
      off = i * rows_per_plane + j * u
      grp = off // g
      if grp not in cache:
        gi = t0 // g + grp
        sc = ks_ref[gi, :].astype(jnp.float32)
        zr = kz_ref[gi, :].astype(jnp.float32)
        cache[grp] = ((q * sc[None, :]).astype(jnp.float16), jnp.sum(q * zr[None, :], axis=1))
      qs, qz = cache[grp]
      codes = _u4_to_f16((byte_rows >> (i * bits)) & mask, 0)
      out.append((off, _dot(qs, codes, trans_b=True) + qz[:, None]))
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

  @pl.when(split < ns)
  def _quantized():
    lv = jnp.maximum(length - r, 0)  # tokens with quantized values (and keys)

    def body(bi, carry):
      accs, zaccs, m_prev, l_prev = carry
      t0 = bi * r
      logits = _kivi_key_logits(qf, k_ref, ks_ref, kz_ref, t0, plan)
      logits = [(off, _finish_logits(s, plan.softcap)) for off, s in logits]
      masks = [(t0 + off + tok) < lv for off, _ in logits]
      ps, m_new, l_new, alpha = _softmax_update([s for _, s in logits], masks, m_prev, l_prev)
      accs = [a * alpha[:, None] for a in accs]
      zaccs = [z * alpha for z in zaccs]
      for (off, _), p in zip(logits, ps):
        tu = t0 + off
        for jc in range(n_vcols):
          vb = v_ref[pl.ds(tu, u), pl.ds(jc * wv, wv)]  # [u, wv] uint8
          for iv in range(nv):
            c0 = iv * cpp + jc * wv
            grp = c0 // gv
            sc = vs_ref[pl.ds(tu, u), grp].astype(jnp.float32)
            zr = vz_ref[pl.ds(tu, u), grp].astype(jnp.float32)
            pp = (p * sc[None, :]).astype(jnp.float16)
            codes = _u4_to_f16((vb >> (iv * plan.value_bits)) & vmask, 0)
            idx = iv * n_vcols + jc
            accs[idx] = accs[idx] + _dot(pp, codes)
            if c0 % gv == 0:  # one zero-point term per group
              zaccs[grp] = zaccs[grp] + jnp.sum(p * zr[None, :], axis=1)
      return accs, zaccs, m_new, l_new

    lo, n = _split_range(lv, r, ns, split)
    accs = [jnp.zeros((m_rows, wv), jnp.float32) for _ in range(n_vunits)]
    zaccs = [jnp.zeros((m_rows,), jnp.float32) for _ in range(h // gv)]
    accs, zaccs, m, l = lax.fori_loop(0, n, lambda j, c: body(lo + j, c), (accs, zaccs, m0, l0))
    parts = []
    for iv in range(nv):
      for jc in range(n_vcols):
        c0 = iv * cpp + jc * wv
        parts.append((c0, accs[iv * n_vcols + jc] + zaccs[c0 // gv][:, None]))
    _store_state(o_ref, m_ref, l_ref, parts, m, l, plan.rows)

  @pl.when(split == ns)
  def _residual():
    rem = length % r
    lq = length - rem
    tb = jnp.maximum(lq - r, 0)
    qlog = _kivi_key_logits(qf, k_ref, ks_ref, kz_ref, tb, plan)
    qb = qf.astype(jnp.bfloat16)
    parts, masks = [], []
    for off, sq in qlog:
      kr = kr_ref[pl.ds(off, u), :]
      sr = _dot(qb, kr.astype(jnp.bfloat16), trans_b=True)
      slot = off + tok
      use_res = slot < rem
      t = jnp.where(use_res, lq + slot, lq - r + slot)
      parts.append(_finish_logits(jnp.where(use_res, sr, sq), plan.softcap))
      masks.append((t >= 0) & (t <= qpos))
    ps, m, l, _ = _softmax_update(parts, masks, m0, l0)
    acc = jnp.zeros((m_rows, h), jnp.float32)
    for (off, _), p in zip(qlog, ps):
      vr = vr_ref[pl.ds(off, u), :].astype(jnp.bfloat16)
      acc = acc + _dot(p.astype(jnp.bfloat16), vr)
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
