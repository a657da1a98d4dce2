"""Fused dequantize+attend decode kernels: Pallas, Triton lowering (per-token formats and the
parts every kernel shares; the KIVI kernel is `pallas_kernels.gpu.kivi`).

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
  * INT4 nibbles (planar: byte j = channels j and j + H/2) go through the
    0x6400 trick: ``bitcast_f16(code | 0x6400) - 1032``, one OR and one SUB
    per element.
  * FP8 e4m3 / INT8 can instead run q.k and p.v as 8-bit tensor-core dots on
    the stored codes (`narrow_qk`, `narrow_pv`): the other operand is split
    in two 8-bit terms, hi + lo/16 (or /254), per row, which keeps about
    bf16's 2^-8 relative precision without upcasting the cache tile.

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

__all__ = ["FlatPlan", "flat_decode", "combine", "split_states_call", "seq_spec", "pow2_at_least",
           "padded_rows", "load_q", "q_spec"]

NEG = -1e30
LOG2E = 1.4426950408889634


def _dot(a, b, trans_b=False):
  return plgpu.dot(a, b, trans_b=trans_b)


def _to_f16(c):
  """fp8 / int8 codes -> fp16; int8 through 0x6400 (bitcast of 0x6400 | (c ^ 0x80) = 1152 + c)."""
  if c.dtype != jnp.int8:
    return c.astype(jnp.float16)
  x = (lax.bitcast_convert_type(c, jnp.uint8) ^ jnp.uint8(0x80)).astype(jnp.uint16) | jnp.uint16(0x6400)
  return lax.bitcast_convert_type(x, jnp.float16) - jnp.float16(1152)


def _minus(x, offset):
  """fp16 ``1024 + code`` (the 0x6400 trick) -> ``code - offset``; offset -1024 leaves it as it is."""
  return x if offset == -1024 else x - jnp.float16(1024 + offset)


def _u4_to_f16(c, offset):
  """uint8 codes < 16 (or < 256 for KIVI-4 nibbles) -> fp16 ``code - offset`` via 0x6400."""
  return _minus(lax.bitcast_convert_type(c.astype(jnp.uint16) | jnp.uint16(0x6400), jnp.float16), offset)


# Four bytes (4 elements of a row) per instance: shift the whole 32-bit word, mask two bytes' codes
# into fp16 pairs ``0x6400 | code`` (= 1024 + code) with one lop3 each, and order the pairs with
# two prmt: 7 instructions per 4 codes. Operands: $0, $1 out (elements 0-1, 2-3); $2 the packed
# codes; $3 the shift (one byte, repeated).
_PACKED_UNPACK = """{
.reg .b32 s, t, a, b;
and.b32 s, $3, 0xff;
shr.u32 t, $2, s;
lop3.b32 a, t, MASK, 0x64006400, 0xea;
shr.u32 t, t, 8;
lop3.b32 b, t, MASK, 0x64006400, 0xea;
prmt.b32 $0, a, b, 0x5410;
prmt.b32 $1, a, b, 0x7632;
}"""


def unpack_f16(c, shift, bits, offset, packed=False):
  """uint8 tile c -> fp16 ``((c >> shift) & (2**bits - 1)) - offset`` (shift: int or traced; offset
  -1024 leaves the unpacked ``1024 + code`` as it is).

  packed: the GPU-only inline-PTX path (`_PACKED_UNPACK`) working on 4 bytes per instruction
  sequence instead of byte by byte; interpret mode must use packed=False (the same values)."""
  mask = (1 << bits) - 1
  if not packed:
    return _u4_to_f16((c >> jnp.asarray(shift, jnp.uint8)) & mask, offset)
  sh = jnp.broadcast_to(jnp.asarray(shift, jnp.uint8), c.shape)
  (x,) = plgpu.elementwise_inline_asm(
      _PACKED_UNPACK.replace("MASK", hex(mask | mask << 16)), args=[c, sh],
      constraints="=r,=r,r,r", pack=4,
      result_shape_dtypes=[jax.ShapeDtypeStruct(c.shape, jnp.float16)])
  return _minus(x, offset)


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
  window: int | None = None  # sliding window (Gemma local layers): keys in (qpos - window, qpos]
  narrow_qk: bool = False  # q . k on the tensor cores in the cache's own 8-bit type (two-term q)
  narrow_pv: bool = False  # p . v likewise (two-term p * scale)
  prefetch: int = 0  # per-token scales loaded this many blocks ahead (carried through the loop)
  packed_unpack: bool = False  # INT4 nibbles unpacked 4 bytes at a time by inline PTX (GPU only)
  value_t: bool = False  # value codes in tiles of `block` tokens ([H, block] each, QArray.tile): k-pairs adjacent
  q_scale: float = 1.0  # the query is multiplied by this in the kernel (softmax scale, log2 e)


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


def _split_range(length, block, num_splits, split, start=0):
  """(first block, number of blocks) of `split`: blocks from the one holding `start` to the one
  holding token length - 1, divided evenly among the splits."""
  nblk = pl.cdiv(length, block)
  b0 = start // block
  per = pl.cdiv(jnp.maximum(nblk - b0, 0), num_splits)
  lo = b0 + split * per
  hi = jnp.minimum(lo + per, nblk)
  return lo, jnp.maximum(hi - lo, 0)


def _window_start(length, num_queries, window):
  """First token any query row can see: the earliest query is at length - T."""
  return 0 if window is None else jnp.maximum(length - num_queries - window + 1, 0)


def _visible(pos, qpos, window):
  """pos [1, n] tokens vs query positions qpos [M, 1]: causal, and within the sliding window."""
  ok = pos <= qpos
  return ok if window is None else ok & (pos > qpos - window)


def pow2_at_least(x: int, lo: int = 1) -> int:
  """The smallest power of two >= max(x, lo) (Triton tiles are powers of two)."""
  return 1 << max(0, (max(x, lo) - 1).bit_length())


def padded_rows(rows: int) -> int:
  """M: the query rows a program computes, rows padded to a power of two >= 16 (the tensor cores'
  smallest M); the padding rows are zero queries whose states are never stored."""
  return pow2_at_least(rows, 16)


def q_spec(q_shape, rows: int):
  """(M, the query's block spec): its [rows, H] slab of q [B, K, rows, H] as an [M, H] block
  (M = padded_rows(rows); the kernel masks rows >= rows, so nothing past the array is read)."""
  if q_shape[2] != rows:
    raise ValueError(f"q must have plan.rows = {rows} rows per KV head, got {q_shape[2]} (q {q_shape})")
  m_rows = padded_rows(rows)
  return m_rows, pl.BlockSpec((None, None, m_rows, q_shape[3]), lambda b_, k, s: (b_, k, 0, 0))


def load_q(q_ref, rows: int, q_scale: float, cols=None):
  """The [M, H] (or [M, cols]) query block in f32 times q_scale, rows >= `rows` zero: the padding
  and the scaling are done here so the call has no XLA query fusions (a launch each)."""
  m_rows = q_ref.shape[0]
  idx = (pl.ds(0, m_rows),) + ((slice(None),) if cols is None else (cols,))
  if rows < m_rows:
    ok = lax.broadcasted_iota(jnp.int32, (m_rows, 1), 0) < rows
    q = plgpu.load(q_ref.at[idx], mask=ok, other=0)
  else:
    q = q_ref[idx]
  q = q.astype(jnp.float32)
  return q if q_scale == 1.0 else q * q_scale


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
  qf = load_q(q_ref, plan.rows, plan.q_scale)
  half = h // 2
  if plan.key_kind == "bf16":
    qk = (qf.astype(jnp.bfloat16),)
  elif plan.narrow_qk:
    qk = _two_term(qf, k_ref.dtype)
  elif plan.key_kind == "i4":
    qk = tuple(load_q(q_ref, plan.rows, plan.q_scale, pl.ds(c, half)).astype(jnp.float16)
               for c in (0, half))
  else:
    qk = (qf.astype(jnp.float16),)
  tok = lax.broadcasted_iota(jnp.int32, (1, bs), 1)
  v_parts = 2 if plan.value_kind == "i4" else 1
  vw = h // v_parts

  last_block = k_ref.shape[0] // bs - 1

  def scales(i):
    """Per-token key/value scales of block i (clamped in bounds), stored dtype [bs]: carried
    unconverted, so nothing waits on the load before the block that uses it."""
    t0 = jnp.minimum(i, last_block) * bs
    return tuple(r[pl.ds(t0, bs)] for r in (ks_ref, vs_ref) if r is not None)

  def body(i, carry):
    accs, m_prev, l_prev, ahead = carry
    if plan.prefetch:  # Triton does not pipeline these 2-byte-per-thread loads: issue them early
      sc, ahead = ahead[0], ahead[1:] + (scales(i + plan.prefetch),)
    else:
      sc = scales(i)
    sc = [x.astype(jnp.float32) for x in sc]
    ksc = sc.pop(0) if plan.key_scaled else None
    vsc = sc.pop(0) if plan.value_scaled else None
    t0 = i * bs
    kc = k_ref[pl.ds(t0, bs), :]
    if plan.key_kind == "bf16":
      s = _dot(qk[0], kc, trans_b=True)
    elif plan.narrow_qk:
      s = _two_term_dot(qk, kc, True)
    elif plan.key_kind == "i4":
      pk = plan.packed_unpack
      s = (_dot(qk[0], unpack_f16(kc, 0, 4, 8, pk), trans_b=True)
           + _dot(qk[1], unpack_f16(kc, 4, 4, 8, pk), trans_b=True))
    else:
      s = _dot(qk[0], kc.astype(jnp.float16), trans_b=True)
    if plan.key_scaled:
      s = s * ksc[None, :]
    s = _finish_logits(s, plan.softcap)
    mask = _visible(t0 + tok, qpos, plan.window)
    s = jnp.where(mask, s, NEG)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    alpha = jnp.exp2(m_prev - m_new)
    p = jnp.where(mask, jnp.exp2(s - m_new[:, None]), 0.0)
    l_new = l_prev * alpha + jnp.sum(p, axis=1)
    vc = v_ref[pl.ds(i * h, h), :] if plan.value_t else v_ref[pl.ds(t0, bs), :]
    if plan.value_t:
      pp = p * (vsc * plan.value_c)[None, :] if plan.value_scaled else p
      if plan.narrow_pv:
        pv = (_two_term_dot(_two_term(pp, vc.dtype), vc, True),)
      else:
        pv = (_dot(pp.astype(jnp.float16), _to_f16(vc), trans_b=True),)
    elif plan.value_kind == "bf16":
      pv = (_dot(p.astype(jnp.bfloat16), vc),)
    else:
      pp = p
      if plan.value_scaled:
        pp = p * (vsc * plan.value_c)[None, :]
      if plan.narrow_pv:
        pv = (_two_term_dot(_two_term(pp, vc.dtype), vc, False),)
      elif plan.value_kind == "i4":
        pp = pp.astype(jnp.float16)
        pk = plan.packed_unpack
        pv = (_dot(pp, unpack_f16(vc, 0, 4, 8, pk)), _dot(pp, unpack_f16(vc, 4, 4, 8, pk)))
      else:
        pv = (_dot(pp.astype(jnp.float16), vc.astype(jnp.float16)),)
    accs = tuple(a * alpha[:, None] + x for a, x in zip(accs, pv))
    return accs, m_new, l_new, ahead

  lo, n = _split_range(length, bs, plan.num_splits, split,
                       _window_start(length, plan.num_queries, plan.window))
  accs = tuple(jnp.zeros((m_rows, vw), jnp.float32) for _ in range(v_parts))
  m0 = jnp.full((m_rows,), NEG, jnp.float32)
  l0 = jnp.zeros((m_rows,), jnp.float32)
  ahead0 = tuple(scales(lo + d) for d in range(plan.prefetch))
  accs, m, l, _ = lax.fori_loop(0, n, lambda j, c: body(lo + j, c), (accs, m0, l0, ahead0))
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


def seq_spec(shape):
  """Whole per-(b, k) slab of a [B, K, ...] array."""
  nd = len(shape)
  return pl.BlockSpec((None, None) + tuple(shape[2:]), lambda b, k, s: (b, k) + (0,) * (nd - 2))


def flat_decode(q, lengths, k_codes, v_codes, k_scale, v_scale, *, plan: FlatPlan,
                num_warps=4, num_stages=2, interpret=False):
  """q [B, K, rows, H] (any float dtype; the kernel scales it by plan.q_scale and pads it to M =
  padded_rows(rows) rows); codes [B, K, S, H or H/2]; scales [B, K, S] or None.

  Returns per-split (o [B, K, NS, M, H], m, l).
  """
  b, kh, _, h = q.shape
  m_rows, qs = q_spec(q.shape, plan.rows)
  ns = plan.num_splits
  args = [lengths, q, k_codes, v_codes]
  specs = [pl.BlockSpec((None,), lambda b_, k, s: (b_,)), qs,
           seq_spec(k_codes.shape), seq_spec(v_codes.shape)]
  for sc in (k_scale, v_scale):
    if sc is not None:
      args.append(sc)
      specs.append(seq_spec(sc.shape))
  return split_states_call(functools.partial(_flat_kernel, plan=plan), args, specs,
                            (b, kh, ns, m_rows, h), num_warps, num_stages, interpret,
                            "kvjax_flat_decode")


def split_states_call(kernel, args, specs, dims, num_warps, num_stages, interpret, name):
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
