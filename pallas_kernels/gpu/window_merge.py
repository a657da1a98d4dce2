"""The residual window of a KIVI-2 "words" cache and the flash-decoding merge as one Pallas kernel
(Triton lowering): what `mosaic_decode.window_states` + `decode.combine` do in XLA, in one launch.

Why: the Mosaic kernel covers tokens [0, L - R); the last R tokens (the window: values from the
full-precision ring, keys half quantized and half from `k_res`) and the merge of all split states
compiled to ~a dozen small XLA kernels (token gathers, two einsums, reductions, the merge), which
cost 43 us on top of the 128 us kernel at B=8, 32k on the H200 and 20 us at B=1
(`benchmarks/results/decode_parts/decode_s12_kivi.json` against `mosaic_s12a.json`).

The window needs no gather. With R = 128 = the key group, L = length, rem = L % R, Lq = L - rem:
  * ring slot i < rem holds token Lq + i: key `k_res[i]`, value `v_res[i]`;
  * ring slot i >= rem holds token Lq - R + i (present iff Lq >= R): key row i of quantized key tile
    Lq / R - 1 (the tile before the open group), value `v_res[i]` (the ring is indexed by token % R).
So the program reads one 128-token key tile (dynamic offset), `k_res` and `v_res` as stored, and
attention being order-free, scores the slots without putting them back in token order.

One program per (b, KV head, `cols` output channels): each recomputes the window's scores (128 x 128
x 16 MACs, L2-resident inputs) and merges its channels, so batch 1 still launches B x K x H / cols
programs. Every load is issued before the first use; the dots are tf32 tensor-core dots over 16-channel
slices (f32 dots at HIGHEST precision compiled to FMA loops that spilled: 216 us at B=8 on the H200).
Measured (session 13, `benchmarks/NOTES_gpu.md`): 15.4 us at B=8 32k, 13.2 at B=1 32k, against 43 / 20
for the XLA window and merge; GPU check 1.77e-3 end to end.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.gpu import decode, merge, mosaic_kivi as mk

__all__ = ["window_merge"]

LANES = mk.TILE // mk.PLANES  # words per 128-code row (16): word j holds channels j + 16 m


def _dot(a, b, trans_a=False):
  return plgpu.dot(a, b, trans_a=trans_a, allow_tf32=True)


def _window_merge_kernel(len_ref, q_ref, kc_ref, ks_ref, kz_ref, kres_ref, vres_ref, o_ref, m_ref, l_ref,
                         out_ref, *, num_splits, chunk, num_queries):
  h, rows = q_ref.shape  # [H, ROWS]: q transposed, scaled by sm_scale x log2 e
  r = kres_ref.shape[0]
  cols = out_ref.shape[1]
  col0 = pl.program_id(2) * cols
  length = len_ref[...]
  rem = length % r
  lq = length - rem
  tile = jnp.maximum(lq // r - 1, 0)
  slot = lax.broadcasted_iota(jnp.int32, (r, 1), 0)
  from_res = slot < rem  # [R, 1]
  token = jnp.where(from_res, lq + slot, lq - r + slot)  # [R, 1]: the token in ring slot i
  # row = head x T + t is query token t at position L - T + t (causal within the last T tokens)
  qpos = length - num_queries + lax.broadcasted_iota(jnp.int32, (1, rows), 1) % num_queries  # [1, ROWS]
  visible = (from_res | (lq >= r)) & (token <= qpos)  # [R, ROWS]

  # Loads first (none waits on another's value): one memory round trip, not one per slice. Split states
  # past the first `chunk` splits (B=8 32k: 8 splits, 4 per load) are loaded in the merge loop.
  nsp = decode.pow2_at_least(num_splits)
  sid = lax.broadcasted_iota(jnp.int32, (nsp, 1), 0)
  m_s = plgpu.load(m_ref.at[pl.ds(0, nsp), :], mask=sid < num_splits, other=decode.NEG)  # [NS', ROWS]
  l_s = plgpu.load(l_ref.at[pl.ds(0, nsp), :], mask=sid < num_splits, other=0.0)

  def split_chunk(i):  # [c, cols, ROWS] states and [c, ROWS] maxima of splits i c .. (i + 1) c
    span = pl.ds(i * chunk, chunk)
    ok = (i * chunk + lax.broadcasted_iota(jnp.int32, (chunk, 1), 0)) < num_splits
    m_c = m_s if chunk == nsp else plgpu.load(m_ref.at[span, :], mask=ok, other=decode.NEG)
    return plgpu.load(o_ref.at[span, :, :], mask=ok[:, :, None], other=0.0), m_c
  first = split_chunk(0)
  words = kc_ref[pl.ds(tile * r, r), :].astype(jnp.int32)  # [R, 16]: element j + 16 m at bits 2 m
  chans = [pl.ds(m * LANES, LANES) for m in range(mk.PLANES)]  # 16 channels: [R, 16] dot operands
  q_m = [q_ref[c, :] for c in chans]  # [16, ROWS]
  k_m = [kres_ref[:, c] for c in chans]  # [R, 16]
  scale_m = [ks_ref[pl.ds(tile, 1), c] for c in chans]  # [1, 16]
  zero_m = [kz_ref[pl.ds(tile, 1), c] for c in chans]
  v = vres_ref[:, pl.ds(col0, cols)]  # [R, cols]

  # The splits' merge (independent of the window) ...
  m_split = jnp.max(m_s, axis=0)  # [ROWS]
  w = jnp.exp2(m_s - m_split[None, :])
  l_split = jnp.sum(l_s * w, axis=0)
  acc = jnp.zeros((cols, rows), jnp.float32)
  for i in range(pl.cdiv(num_splits, chunk)):
    o_c, m_c = first if i == 0 else split_chunk(i)
    acc = acc + jnp.sum(o_c * jnp.exp2(m_c - m_split[None, :])[:, None, :], axis=0)

  # ... the window's scores: ring slots from k_res or from the dequantized key tile ...
  s_res = jnp.zeros((r, rows), jnp.float32)
  s_q = jnp.zeros((r, rows), jnp.float32)
  for m in range(mk.PLANES):
    s_res = s_res + _dot(k_m[m].astype(jnp.float32), q_m[m])
    key = (((words >> (2 * m)) & 3).astype(jnp.float32) * scale_m[m].astype(jnp.float32)
           + zero_m[m].astype(jnp.float32))  # [R, 16] dequantized channels 16 m ..
    s_q = s_q + _dot(key, q_m[m])
  s = jnp.where(visible, jnp.where(from_res, s_res, s_q), decode.NEG)
  m_w = jnp.max(s, axis=0)  # [ROWS]
  p = jnp.where(visible, jnp.exp2(s - m_w[None, :]), 0.0)  # [R, ROWS]
  o_w = _dot(v.astype(jnp.float32), p, trans_a=True)  # [cols, ROWS]

  # ... and the two merged.
  m_max = jnp.maximum(m_split, m_w)
  a_split, a_w = jnp.exp2(m_split - m_max), jnp.exp2(m_w - m_max)
  l_tot = l_split * a_split + jnp.sum(p, axis=0) * a_w
  inv_l = jnp.where(l_tot > 0, 1.0 / jnp.where(l_tot > 0, l_tot, 1.0), 0.0)  # [ROWS]
  acc = acc * a_split[None, :] + o_w * a_w[None, :]
  out_ref[...] = (acc * inv_l[None, :]).T.astype(out_ref.dtype)


def window_merge(q_t, lengths, kc, ks, kz, k_res, v_res, o_t, m, l, dtype, *, num_queries: int = 1,
                 interpret: bool = False, num_warps: int = 8, cols: int | None = None):
  """The KIVI-2 window and the merge of the Mosaic kernel's split states.

  q_t [B, K, H, ROWS] f32 (q transposed, x sm_scale x log2 e, rows past the real ones zero);
  lengths [B]; kc [B, K, S, 16] uint16 key words; ks / kz [B, K, S / 128, H]; k_res / v_res
  [B, K, 128, H]; o_t [B, K, NS, H, ROWS], m / l [B, K, NS, ROWS] from `mosaic_kivi.kivi2_states`
  (over tokens [0, L - 128)). Returns [B, K, ROWS, H] in `dtype`: attention over [0, L), zero where
  L = 0; rows past the real ones are undefined. num_queries: T query tokens, row h T + t being query
  t of head h at position L - T + t (it sees tokens <= that; T <= 128, so the kernel's tokens are all
  visible). cols: channels per program (default `merge.merge_cols`).
  """
  b, kh, h, rows = q_t.shape
  ns = o_t.shape[2]
  if k_res.shape != (b, kh, mk.TILE, mk.PLANES * LANES) or v_res.shape != k_res.shape:
    raise ValueError(f"k_res and v_res must be [B, K, R, H] = {(b, kh, mk.TILE, mk.PLANES * LANES)}, got "
                     f"{k_res.shape}, {v_res.shape}")
  if h != mk.PLANES * LANES or rows & (rows - 1) or rows < 16:
    raise ValueError(f"q_t must be [B, K, {mk.PLANES * LANES}, ROWS] with ROWS a power of two >= 16, "
                     f"got {q_t.shape}")
  s = kc.shape[2]
  if kc.shape != (b, kh, s, LANES) or s % mk.TILE or ks.shape != (b, kh, s // mk.TILE, h) or kz.shape != ks.shape:
    raise ValueError(f"kc must be [B, K, S, {LANES}] (S a multiple of {mk.TILE}) and ks / kz [B, K, S / {mk.TILE}, "
                     f"{h}], got {kc.shape}, {ks.shape}, {kz.shape}")
  if o_t.shape != (b, kh, ns, h, rows) or m.shape != (b, kh, ns, rows) or l.shape != m.shape:
    raise ValueError(f"o_t must be [B, K, NS, H, ROWS] = {(b, kh, ns, h, rows)} and m / l [B, K, NS, ROWS], "
                     f"got {o_t.shape}, {m.shape}, {l.shape}")
  if not 1 <= num_queries <= min(rows, mk.TILE):
    raise ValueError(f"num_queries must be in [1, {min(rows, mk.TILE)}], got {num_queries}")
  cols = merge.merge_cols(b, kh, h) if cols is None else cols
  if cols < 16 or h % cols or cols & (cols - 1):
    raise ValueError(f"cols must be a power of two >= 16 dividing the head dim {h}, got {cols}")
  nsp = decode.pow2_at_least(ns)
  chunk = merge.chunk_splits(ns, rows, cols)  # split states per load, as the split merge kernel
  whole = lambda arr: pl.BlockSpec((None, None) + arr.shape[2:], lambda i, j, c: (i, j) + (0,) * (arr.ndim - 2))
  return pl.pallas_call(
      functools.partial(_window_merge_kernel, num_splits=ns, chunk=chunk, num_queries=num_queries),
      grid=(b, kh, h // cols),
      in_specs=[pl.BlockSpec((None,), lambda i, j, c: (i,)), whole(q_t), whole(kc), whole(ks), whole(kz),
                whole(k_res), whole(v_res),
                pl.BlockSpec((None, None, nsp, cols, rows), lambda i, j, c: (i, j, 0, c, 0)),
                pl.BlockSpec((None, None, nsp, rows), lambda i, j, c: (i, j, 0, 0)),
                pl.BlockSpec((None, None, nsp, rows), lambda i, j, c: (i, j, 0, 0))],
      out_specs=pl.BlockSpec((None, None, rows, cols), lambda i, j, c: (i, j, 0, c)),
      out_shape=jax.ShapeDtypeStruct((b, kh, rows, h), dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret,
      name="kvjax_kivi2_window_merge",
  )(lengths, q_t, kc, ks, kz, k_res, v_res, o_t, m, l)
