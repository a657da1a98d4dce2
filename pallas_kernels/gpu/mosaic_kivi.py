"""KIVI-2 (G=128) decode states on Mosaic GPU (Pallas `plgpu`), dequantized codes as WGMMA's register A
operand. Experimental (session 10): correct in Mosaic GPU's CPU interpreter and lowered for CUDA on the
CPU; not yet run on a GPU nor wired into `ops.decode_attention` (its code layout is not the cache's).

Why: the Triton kernels reach the tensor cores only through shared-memory round trips of every
dequantized tile; KIVI-2 issues ~1.1 warp-instructions per cache byte there, and 4.5x the bf16 peer
needs ~0.18 (benchmarks/NOTES_gpu.md). Here one warpgroup per (sequence, KV head, split) computes the
transposed problem, tokens on WGMMA's M axis:

  S^T [128 tok, N] = K [128 tok, H] . (q * s_g)^T [H, N] + (q . z_g - 1024 q . s_g)
  O^T [H, N]      += V^T [H, 128 tok] . (p * s_t)^T [128 tok, N] + sum_t p_t (z_t - 1024 s_t)

with K and V^T unpacked in registers: codes are stored as uint16 words of 8 two-bit codes, and plane m
of a word tile (bits 2m, 2m + 1) is one [rows, 16] k-slab of WGMMA; ``(w >> 2m) & 3 | 0x6400`` is the
fp16 1024 + code (exact), the 1024 offset cancelled in the per-column constant with the same fp16-rounded
(q s) / (p s) the tensor cores see. N = 16 query rows (padded; the B operand's SMEM tiling needs 16).

Layouts (`pack_keys`, `pack_values`):
  * keys  [B, K, S, 16] uint16: token rows; word j holds channels j + 16 m (m = 0..7) at bits 2m;
  * values [B, K, S / 128, H, 16] uint16: per 128-token tile, channel rows; word j holds the tile's
    tokens j + 16 m at bits 2m (the tile transposed, as the FP8 / INT8 tiled value layout);
  * key scale / zero [B, K, S / 128, H] per channel and 128-token group; value scale / zero [B, K, S]
    per token (G = H = 128).
`reference_states` is the jnp reference (same split states as `decode.combine` takes, transposed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["TILE", "ROWS", "pack_keys", "pack_values", "kivi2_states", "reference_states"]

TILE = 128    # tokens per pipeline step = the key group
ROWS = 16     # query rows (N of WGMMA), padded
PLANES = 8    # 2-bit codes per uint16 word
NEG = -1e30


def _pack_planes(codes):
  """[..., 8 * w] codes 0..3 -> [..., w] uint16, word j holding entries j + w m at bits 2m."""
  w = codes.shape[-1] // PLANES
  out = jnp.zeros(codes.shape[:-1] + (w,), jnp.uint16)
  for m in range(PLANES):
    out = out | (codes[..., m * w:(m + 1) * w].astype(jnp.uint16) << (2 * m))
  return out


def pack_keys(codes):
  """Key codes [B, K, S, H=128] (0..3) -> [B, K, S, 16] uint16 (word j: channels j + 16 m)."""
  return _pack_planes(codes)


def pack_values(codes):
  """Value codes [B, K, S, H] (0..3) -> [B, K, S / 128, H, 16] uint16 (word j: tile tokens j + 16 m)."""
  b, k, s, h = codes.shape
  tiles = codes.reshape(b, k, s // TILE, TILE, h).swapaxes(-1, -2)  # [.., tile, H, 128 tokens]
  return _pack_planes(tiles)


def _planes(words):
  """The 8 fp16 planes 1024 + code of uint16 words (any layout; elementwise)."""
  return [lax.bitcast_convert_type(
      (lax.shift_right_logical(words, jnp.uint16(2 * m)) & jnp.uint16(3)) | jnp.uint16(0x6400),
      jnp.float16) for m in range(PLANES)]


def kivi2_states(q_t, lengths, kc, ks, kz, vc, vs, vz, *, num_splits: int, interpret: bool = False,
                 stages: int = 2):
  """Per-split flash-decoding states of KIVI-2 (G=128) attention.

  q_t [B, K, H, 16] f32 (queries transposed, scaled by softmax scale x log2 e, rows padded to 16);
  lengths [B] int32; kc [B, K, S, 16] uint16, ks / kz [B, K, S/128, H]; vc [B, K, S/128, H, 16] uint16,
  vs / vz [B, K, S] (scales and zeros fp16 or bf16). Returns (o_t [B, K, NS, H, 16], m, l [B, K, NS, 16])
  in f32, m and l in the log2 domain; tokens >= lengths[b] are masked.
  """
  b, kh, h, n = q_t.shape
  s = kc.shape[2]
  if h != 128 or n != ROWS:
    raise ValueError(f"q_t must be [B, K, 128, {ROWS}], got {q_t.shape}")
  if s % TILE or (s // TILE) % num_splits:
    raise ValueError(f"the capacity {s} must be a multiple of {TILE} x num_splits ({num_splits})")
  expect = {"kc": (b, kh, s, 16), "ks": (b, kh, s // TILE, h), "kz": (b, kh, s // TILE, h),
            "vc": (b, kh, s // TILE, h, 16), "vs": (b, kh, s), "vz": (b, kh, s)}
  for name, arr in zip(expect, (kc, ks, kz, vc, vs, vz)):
    if arr.shape != expect[name]:
      raise ValueError(f"{name} must be {expect[name]}, got {arr.shape}")
  per = s // TILE // num_splits
  swz = plgpu.find_swizzle(ROWS * 16, "rhs")
  b_tiles = (plgpu.TilingTransform((8, swz * 8 // 16)), plgpu.SwizzleTransform(swz))
  code_tiles = (plgpu.TilingTransform((8, 16)), plgpu.SwizzleTransform(32))  # [rows, 16] uint16

  def planes_mma(init, words, b_ref):
    """init + sum_m plane_m(words) . b_ref[16 m: 16 m + 16]: WGMMA with A in registers (interpret
    mode has no register-A WGMMA: jnp.dot there, same arithmetic)."""
    planes = _planes(words)
    if interpret:
      for m, a in enumerate(planes):
        init = init + jnp.dot(a.astype(jnp.float32), b_ref[pl.ds(16 * m, 16), :].astype(jnp.float32))
      return init

    def scope(acc):
      for m, a in enumerate(planes):
        plgpu.wgmma(acc, a, b_ref.at[pl.ds(16 * m, 16)])
      plgpu.wgmma_wait(0)
    return pl.run_state(scope)(plgpu.ACC.init(init))

  def body(q_g, len_g, kc_g, vc_g, ks_g, kz_g, vs_g, vz_g, o_g, m_g, l_g, qs_smem, pt_smem, q_smem, bar):
    bi, ki, si = lax.axis_index("b"), lax.axis_index("k"), lax.axis_index("s")
    plgpu.copy_gmem_to_smem(q_g.at[bi, ki], q_smem, bar)
    plgpu.barrier_wait(bar)
    qt = q_smem[...]  # [H, N]
    length = len_g[bi]

    def step(idx, kc_s, vc_s, ks_s, kz_s, vs_s, vz_s, carry):
      o, m_prev, l_prev, cv = carry
      (t,) = idx
      ksc, kzr = ks_s[...].astype(jnp.float32), kz_s[...].astype(jnp.float32)  # [H]
      qs16 = (qt * ksc[:, None]).astype(jnp.float16)
      qs_smem[...] = qs16
      ck = jnp.sum(qt * kzr[:, None] - 1024.0 * qs16.astype(jnp.float32), axis=0)  # [N]
      plgpu.commit_smem()
      sc = planes_mma(jnp.zeros((TILE, ROWS), jnp.float32),
                      plgpu.load(kc_s, layout=plgpu.Layout.WGMMA), qs_smem) + ck[None, :]
      ok = (si * per + t) * TILE + lax.broadcasted_iota(jnp.int32, (TILE, ROWS), 0) < length
      sc = jnp.where(ok, sc, NEG)
      m_new = jnp.maximum(m_prev, jnp.max(sc, axis=0))
      alpha = jnp.exp2(m_prev - m_new)
      p = jnp.where(ok, jnp.exp2(sc - m_new[None, :]), 0.0)
      l_new = l_prev * alpha + jnp.sum(p, axis=0)
      vsc, vzr = vs_s[...].astype(jnp.float32), vz_s[...].astype(jnp.float32)  # [TILE]
      pt16 = (p * vsc[:, None]).astype(jnp.float16)
      pt_smem[...] = pt16
      cv = cv * alpha + jnp.sum(p * vzr[:, None] - 1024.0 * pt16.astype(jnp.float32), axis=0)
      plgpu.commit_smem()
      o = planes_mma(o * alpha[None, :], plgpu.load(vc_s, layout=plgpu.Layout.WGMMA), pt_smem)
      return o, m_new, l_new, cv

    init = (jnp.zeros((h, ROWS), jnp.float32), jnp.full((ROWS,), NEG, jnp.float32),
            jnp.zeros((ROWS,), jnp.float32), jnp.zeros((ROWS,), jnp.float32))
    tile_of = lambda t: si * per + t
    pipe = plgpu.emit_pipeline(
        step, grid=(per,), max_concurrent_steps=stages, init_carry=init,
        in_specs=[plgpu.BlockSpec((TILE, 16), lambda t: (tile_of(t), 0), transforms=code_tiles),
                  plgpu.BlockSpec((h, 16), lambda t: (tile_of(t), 0), transforms=code_tiles),
                  plgpu.BlockSpec((h,), lambda t: (tile_of(t),)),
                  plgpu.BlockSpec((h,), lambda t: (tile_of(t),)),
                  plgpu.BlockSpec((TILE,), lambda t: (tile_of(t),)),
                  plgpu.BlockSpec((TILE,), lambda t: (tile_of(t),))])
    o, m_f, l_f, cv = pipe(kc_g.at[bi, ki], vc_g.at[bi, ki], ks_g.at[bi, ki], kz_g.at[bi, ki],
                           vs_g.at[bi, ki], vz_g.at[bi, ki])
    o_g[bi, ki, si] = o + cv[None, :]
    m_g[bi, ki, si] = m_f
    l_g[bi, ki, si] = l_f

  kw = {"interpret": plgpu.InterpretGPUParams()} if interpret else {}
  f = plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((b, kh, num_splits, h, ROWS), jnp.float32),
                jax.ShapeDtypeStruct((b, kh, num_splits, ROWS), jnp.float32),
                jax.ShapeDtypeStruct((b, kh, num_splits, ROWS), jnp.float32)),
      grid=(b, kh, num_splits), grid_names=("b", "k", "s"),
      scratch_types=[plgpu.SMEM((h, ROWS), jnp.float16, transforms=b_tiles),
                     plgpu.SMEM((TILE, ROWS), jnp.float16, transforms=b_tiles),
                     plgpu.SMEM((h, ROWS), jnp.float32), plgpu.Barrier(num_arrivals=1)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      kernel_name="kvjax_mosaic_kivi2", **kw)
  tiles = s // TILE
  return f(q_t, lengths, kc, vc.reshape(b, kh, tiles * h, 16), ks.reshape(b, kh, tiles * h),
           kz.reshape(b, kh, tiles * h), vs, vz)


@functools.partial(jax.jit, static_argnames="num_splits")
def reference_states(q_t, lengths, k_codes, ks, kz, v_codes, vs, vz, *, num_splits: int):
  """jnp reference of `kivi2_states` from the unpacked codes [B, K, S, H] (0..3), f32 throughout."""
  f32 = lambda x: x.astype(jnp.float32)
  b, kh, s, h = k_codes.shape
  g = jnp.arange(s) // TILE
  kf = f32(k_codes) * f32(ks)[:, :, g] + f32(kz)[:, :, g]  # [B, K, S, H]
  vf = f32(v_codes) * f32(vs)[..., None] + f32(vz)[..., None]
  sc = jnp.einsum("bksh,bkhn->bksn", kf, f32(q_t))
  ok = (jnp.arange(s)[None, :] < lengths[:, None])[:, None, :, None]  # [B, 1, S, 1]
  sc = jnp.where(ok, sc, NEG).reshape(b, kh, num_splits, s // num_splits, -1)
  m = jnp.max(sc, axis=3)
  p = jnp.where(ok.reshape(b, 1, num_splits, -1, 1), jnp.exp2(sc - m[:, :, :, None]), 0.0)
  o = jnp.einsum("bkjsh,bkjsn->bkjhn", vf.reshape(b, kh, num_splits, s // num_splits, h), p)
  return o, m, jnp.sum(p, axis=3)
