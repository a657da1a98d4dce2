"""The Mosaic kernel body: one (sequence, KV head) per grid row, KV blocks streamed.

Grid ``(B, K, S / block)``; the last axis walks the cache ("arbitrary"), the
first two are "parallel". BlockSpec pipelining double-buffers every K/V block
from HBM into VMEM; the per-sequence limits are scalar-prefetched, and the
index maps clamp the block index to the last block holding visible tokens,
so blocks past a sequence's length are neither copied (same index as the step
before: no DMA) nor computed (`pl.when`).

Online softmax (flash decoding within one core): running max `m`, sum `l` and
accumulator per query row, rescaled when the max moves.

Token order. Plain formats (bf16 / f32 / FP8 / INT8) visit a block's tokens in
order. Packed formats (INT4, KIVI) load uint8 codes and `pltpu.bitcast` them
to uint32 words: one word holds 4 consecutive byte rows, so one shift and
mask per (byte m, plane i) yields a contiguous slab of codes for the tokens
``t % 4 == m``. The kernel therefore visits each block as 4 *classes*
(``t = start + 4 * idx + m``), keys and values alike; logits, masks and
per-token scales (which the wrapper stores class-ordered) follow.

Scales are folded rather than broadcast: per-token key scales multiply the
logits, per-token value scales (and KIVI value scales) multiply the
probabilities before the PV product, the KIVI value minimum is a row sum of
the probabilities; KIVI per-channel key scales are applied to each key slab
(one scale row per group).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.plan import Plan

NEG = -1e30
F32 = jnp.float32
# Integer division / remainder below use lax.div / lax.rem (operands are non-negative): jnp's
# floor semantics add a sign fix-up whose Mosaic lowering needs the chip kind.


def _dot_t(a, b):
  """a [M, C] . b [N, C]^T -> [M, N] in f32."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def _dot(a, b):
  """a [M, N] . b [N, C] -> [M, C] in f32."""
  return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=F32)


def _field(words, shift: int, mask: int):
  """Unsigned bit field of uint32 words, as f32 (codes < 256 are exact)."""
  return ((words >> shift) & jnp.uint32(mask)).astype(jnp.int32).astype(F32)


def make_kernel(plan: Plan, names: tuple[str, ...]):
  """Returns the kernel function; `names` lists the VMEM inputs in order."""
  p = plan
  bs, rows, t_q, h = p.block, p.rows, p.num_queries, p.head_dim
  n = p.per_word
  mask_bits = (1 << p.bits) - 1
  nb = p.num_blocks

  def kernel(lens_ref, lim_ref, *refs):
    ins = dict(zip(names, refs[:len(names)]))
    rest = refs[len(names):]
    if p.kind == "kivi":
      out_ref, out_tail_ref, m_ref, l_ref, acc_ref, acc_tail_ref = rest
    else:
      out_ref, m_ref, l_ref, acc_ref = rest
      out_tail_ref = acc_tail_ref = None
    bi, j = pl.program_id(0), pl.program_id(2)
    length = lens_ref[bi]
    limit = lim_ref[bi]
    row = jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0)
    qpos = length - t_q + jax.lax.rem(row, t_q)  # [rows, 1]: position of each query row

    @pl.when(j == 0)
    def _init():
      m_ref[...] = jnp.full(m_ref.shape, NEG, F32)
      l_ref[...] = jnp.zeros(l_ref.shape, F32)
      acc_ref[...] = jnp.zeros(acc_ref.shape, F32)
      if acc_tail_ref is not None:
        acc_tail_ref[...] = jnp.zeros(acc_tail_ref.shape, F32)

    def visible(pos, lim):
      ok = (pos < lim) & (pos >= 0) & (pos <= qpos)
      if p.window is not None:
        ok &= pos > qpos - p.window
      return ok  # [rows, n]

    def softcap(s):
      if p.logit_softcap is None:
        return s
      return p.logit_softcap * jnp.tanh(s / p.logit_softcap)

    def update(chunks):
      """chunks: (logits [rows, c], visible [rows, c], pv) with pv(probs) -> {target: [..]}."""
      m_prev = m_ref[...]
      m_cur = m_prev
      for s, ok, _ in chunks:
        m_cur = jnp.maximum(m_cur, jnp.max(jnp.where(ok, s, NEG), axis=-1, keepdims=True))
      alpha = jnp.exp(m_prev - m_cur)
      l_new = alpha * l_ref[...]
      main = [None] * p.planes
      tail = None
      for s, ok, pv in chunks:
        prob = jnp.where(ok, jnp.exp(s - m_cur), 0.0)
        l_new += jnp.sum(prob, axis=-1, keepdims=True)
        for target, val in pv(prob).items():
          if target == "tail":
            tail = val if tail is None else tail + val
          else:
            main[target] = val if main[target] is None else main[target] + val
      m_ref[...] = m_cur
      l_ref[...] = l_new
      for i, val in enumerate(main):
        if val is not None:
          acc_ref[i] = alpha * acc_ref[i] + val
        else:
          acc_ref[i] = alpha * acc_ref[i]
      if acc_tail_ref is not None:
        acc_tail_ref[...] = alpha * acc_tail_ref[...] + (0.0 if tail is None else tail)

    start = j * bs

    # ---- plain formats: natural token order ------------------------------------------
    def plain_block():
      q = ins["q"][0].astype(F32)                               # [rows, H]
      s = _dot_t(q, ins["kc"][...].astype(F32))                 # [rows, bs]
      if p.key_token_scale:
        s = s * ins["ks"][...].astype(F32)                      # [1, bs] per-token scale
      s = softcap(s)
      pos = start + jax.lax.broadcasted_iota(jnp.int32, (1, bs), 1)
      v = ins["vc"][...].astype(F32)                            # [bs, H]

      def pv(prob):
        if p.value_token_scale:
          prob = prob * ins["vs"][...].astype(F32)              # fold p_t * s_t
        return {0: _dot(prob, v)}
      update([(s, visible(pos, limit), pv)])

    # ---- INT4: 32-bit words, classes by token % 4, planes by channel half -------------
    def int4_block():
      q = [ins["q"][i].astype(F32) for i in range(2)]           # 2 x [rows, H/2]
      wk = pltpu.bitcast(ins["kc"][...], jnp.uint32)            # [bs/4, H/2]
      wv = pltpu.bitcast(ins["vc"][...], jnp.uint32)
      idx = jax.lax.broadcasted_iota(jnp.int32, (1, bs // 4), 1)
      chunks = []
      for m in range(4):
        s = sum(_dot_t(q[i], _field(wk, 8 * m + 4 * i, 0xF) - 8.0) for i in range(2))
        s = softcap(s * ins["ks"][0, pl.ds(m, 1), :].astype(F32))  # [rows, bs/4]
        sv = ins["vs"][0, pl.ds(m, 1), :].astype(F32)             # [1, bs/4]

        def pv(prob, m=m, sv=sv):
          prob = prob * sv
          return {i: _dot(prob, _field(wv, 8 * m + 4 * i, 0xF) - 8.0) for i in range(2)}
        chunks.append((s, visible(start + 4 * idx + m, limit), pv))
      update(chunks)

    # ---- KIVI: per-channel keys packed along tokens, per-token values along channels ----
    def kivi_keys(wk, m):
      """Dequantized keys of class m, [bs/4, H]: slabs (packing block pb, plane i)."""
      r_len, g = p.residual, p.group
      slab = r_len // (4 * n)        # word rows per (pb, plane)
      sub = min(slab, g // 4)        # word rows per (pb, plane, group)
      pieces = []
      for pb in range(bs // r_len):
        for i in range(n):
          codes = _field(wk[pb * slab:(pb + 1) * slab], 8 * m + i * p.bits, mask_bits)
          for c in range(slab // sub):
            tok = pb * r_len + i * (r_len // n) + 4 * c * sub   # first token of the run
            grp = tok // g
            sc = ins["ks"][pl.ds(grp, 1), :].astype(F32)         # [1, H] one group row
            zr = ins["kz"][pl.ds(grp, 1), :].astype(F32)
            pieces.append(codes[c * sub:(c + 1) * sub] * sc + zr)
      return jnp.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0]

    def kivi_block():
      q = ins["q"][0].astype(F32)
      wk = pltpu.bitcast(ins["kc"][...], jnp.uint32)            # [bs/(4n), H]
      wv = pltpu.bitcast(ins["vc"][...], jnp.uint32)            # [bs/4, H/n]
      w = h // n                                                # channels per value plane
      idx = jax.lax.broadcasted_iota(jnp.int32, (1, bs // 4), 1)
      lane = jax.lax.broadcasted_iota(jnp.int32, (1, w), 1)
      chunks = []
      for m in range(4):
        s = softcap(_dot_t(q, kivi_keys(wk, m)))                # [rows, bs/4]

        def pv(prob, m=m):
          out = {}
          for i in range(n):
            codes = _field(wv, 8 * m + i * p.bits, mask_bits)    # [bs/4, W]
            first, last = (i * w) // p.group, (i * w + w - 1) // p.group
            acc = None
            for gg in range(first, last + 1):
              sv = ins["vs"][gg, pl.ds(m, 1), :].astype(F32)    # [1, bs/4]
              zv = ins["vz"][gg, pl.ds(m, 1), :].astype(F32)
              part_codes = codes
              zsum = jnp.sum(prob * zv, axis=-1, keepdims=True)  # [rows, 1]
              term_z = jnp.broadcast_to(zsum, (rows, w))
              if first != last:  # several groups share the plane: mask lanes
                in_g = jax.lax.div(lane + i * w, p.group) == gg
                part_codes = jnp.where(in_g.reshape(1, w), codes, 0.0)
                term_z = jnp.where(in_g, term_z, 0.0)
              val = _dot(prob * sv, part_codes) + term_z
              acc = val if acc is None else acc + val
            out[i] = acc
          return out
        chunks.append((s, visible(start + 4 * idx + m, limit), pv))
      update(chunks)

    def kivi_tail():
      """Last R tokens: full-precision values (ring) with keys residual or just quantized."""
      r_len = p.residual
      q = ins["q"][0].astype(F32)
      s = softcap(_dot_t(q, ins["kt"][...].astype(F32)))        # [rows, R]
      x = jax.lax.broadcasted_iota(jnp.int32, (1, r_len), 1)
      r = jax.lax.rem(length, r_len)
      lq = length - r
      pos = jnp.where(x < r, lq + x, lq - r_len + x)
      vres = ins["vr"][...].astype(F32)                          # [R, H] ring slot x
      update([(s, visible(pos, length), lambda prob: {"tail": _dot(prob, vres)})])

    body = {"plain": plain_block, "int4": int4_block, "kivi": kivi_block}[p.kind]
    pl.when(start < limit)(body)

    @pl.when(j == nb - 1)
    def _finish():
      if p.kind == "kivi":
        kivi_tail()
      l = l_ref[...]
      inv = jnp.where(l > 0, 1.0 / jnp.where(l > 0, l, 1.0), 0.0)  # empty -> zeros, not NaN
      for i in range(p.planes):
        out_ref[i] = acc_ref[i] * inv
      if out_tail_ref is not None:
        out_tail_ref[...] = acc_tail_ref[...] * inv

  return kernel
