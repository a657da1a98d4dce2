"""Flash-decoding split merge as one Pallas kernel (Triton lowering); `decode.combine` is its jnp
reference.

The decode kernels leave per-split states (o, m, l) of every (sequence, KV head); the XLA merge of
those (`decode.combine`) compiles to three or four small fusions (max over splits, weights, weighted
sum, normalize and cast). At short contexts each is a launch of ~0.6-0.8 us plus the gap to the next
one (H200 trace, `benchmarks/profile_step.py`, session 9: fp8 B=1 4k spent 5.9 us in the decode
kernel and 11.8 us per call). Here one launch does it all:
  * one program per (b, k, column block of `cols` channels): `merge_cols` narrows the columns until
    there are about `TARGET_PROGRAMS` programs, so a batch-1 merge is not 8 programs each walking
    the splits alone (session 9's first kernel: 5.1 us at B=1, 4k against 4.1 us for XLA's);
  * every split's m and l are loaded at once ([NS', R], NS' the power of two >= NS, masked), so the
    final weights ``2^(m_s - max) / sum`` are known before any o is read: the o chunks ([c, R, cols],
    `chunk_splits`) are independent loads summed with fixed weights (no rescaling chain between
    them), one load when they fit in `LOAD_ELEMS`;
  * the output is stored normalized in the query's dtype (zero where no split saw a key).

Only the first R = `out_rows(rows)` rows of the padded M rows are read; rows past `rows` in the
states were never written (the decode kernels store real rows only) and are sliced off by the caller.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.gpu import decode

__all__ = ["merge_states", "out_rows", "merge_cols", "chunk_splits", "TARGET_PROGRAMS",
           "LOAD_ELEMS", "MIN_COLS"]

TARGET_PROGRAMS = 128  # about one program per SM of an H100/H200 (132)
MIN_COLS = 16          # narrowest column block (a 64-byte row segment of f32 states)
LOAD_ELEMS = 4096      # f32 elements of o per masked load (32 registers a thread at 4 warps)


def out_rows(rows: int) -> int:
  """Rows a merge program works on: the power of two >= rows (Triton tiles are powers of two)."""
  return decode.pow2_at_least(rows)


def merge_cols(batch: int, kv_heads: int, head_dim: int) -> int:
  """Channels per program: head_dim halved (while >= MIN_COLS and dividing it) until the grid
  batch x kv_heads x head_dim / cols reaches TARGET_PROGRAMS."""
  cols = head_dim
  while (batch * kv_heads * (head_dim // cols) < TARGET_PROGRAMS and cols % 2 == 0
         and cols // 2 >= MIN_COLS):
    cols //= 2
  return cols


def chunk_splits(num_splits: int, rows: int, cols: int) -> int:
  """Splits per o load: all of them (rounded up to a power of two) when [NS', R, cols] fits in
  LOAD_ELEMS, else the largest power of two that does (at least 1)."""
  c = decode.pow2_at_least(num_splits)
  while c > 1 and c * out_rows(rows) * cols > LOAD_ELEMS:
    c //= 2
  return c


def _merge_kernel(o_ref, m_ref, l_ref, out_ref, *, num_splits, chunk, transposed):
  r, cols = out_ref.shape
  rows = pl.ds(0, r)
  nsp = decode.pow2_at_least(num_splits)
  sid = lax.broadcasted_iota(jnp.int32, (nsp, 1), 0)
  m_s = plgpu.load(m_ref.at[pl.ds(0, nsp), rows], mask=sid < num_splits, other=decode.NEG)  # [NS', R]
  l_s = plgpu.load(l_ref.at[pl.ds(0, nsp), rows], mask=sid < num_splits, other=0.0)
  m_max = jnp.max(m_s, axis=0)  # [R]
  w = jnp.exp2(m_s - m_max[None, :])  # [NS', R]; 0 for masked splits (NEG - NEG = 0: l_s is 0 there)
  l_tot = jnp.sum(l_s * w, axis=0)
  inv_l = jnp.where(l_tot > 0, 1.0 / jnp.where(l_tot > 0, l_tot, 1.0), 0.0)  # [R]
  acc = jnp.zeros((cols, r) if transposed else (r, cols), jnp.float32)
  for i in range(pl.cdiv(num_splits, chunk)):  # static: one chunk, or a few when NS is large
    span = pl.ds(i * chunk, chunk)
    ok = (i * chunk + lax.broadcasted_iota(jnp.int32, (chunk, 1), 0)) < num_splits
    if chunk == nsp:
      w_c = w
    else:  # this chunk's m again (an L2 hit) rather than a slice of the [NS', R] tile
      w_c = jnp.exp2(plgpu.load(m_ref.at[span, rows], mask=ok, other=decode.NEG) - m_max[None, :])
    if transposed:  # the states' o^T (the Mosaic kernels')
      o_s = plgpu.load(o_ref.at[span, :, rows], mask=ok[:, :, None], other=0.0)  # [c, cols, R]
      acc = acc + jnp.sum(o_s * w_c[:, None, :], axis=0)
    else:
      o_s = plgpu.load(o_ref.at[span, rows, :], mask=ok[:, :, None], other=0.0)  # [c, R, cols]
      acc = acc + jnp.sum(o_s * w_c[:, :, None], axis=0)
  out = (acc * inv_l[None, :]).T if transposed else acc * inv_l[:, None]
  out_ref[...] = out.astype(out_ref.dtype)


def merge_states(o, m, l, rows: int, dtype, *, interpret: bool = False, num_warps: int = 4,
                 cols: int | None = None, transposed: bool = False):
  """o [B, K, NS, M, H], m / l [B, K, NS, M] f32 -> [B, K, R, H] in `dtype` (R = out_rows(rows);
  rows past `rows` are undefined), equal to ``decode.combine(o, m, l, rows)`` in the first rows.
  cols: channels per program (default `merge_cols`); must divide H. transposed: o is [B, K, NS, H, M]
  (the Mosaic kernels' o^T), transposed back in the kernel; same result."""
  if transposed:
    b, kh, ns, h, m_rows = o.shape
  else:
    b, kh, ns, m_rows, h = o.shape
  r = out_rows(rows)
  if not 1 <= rows <= m_rows:
    raise ValueError(f"rows must be in [1, {m_rows}] (the states' padded rows), got {rows}")
  if m.shape != (b, kh, ns, m_rows) or l.shape != m.shape:
    raise ValueError(f"m and l must be [B, K, NS, M] = {(b, kh, ns, m_rows)}, got {m.shape}, {l.shape}")
  cols = merge_cols(b, kh, h) if cols is None else cols
  if cols < 1 or h % cols or cols & (cols - 1):
    raise ValueError(f"cols must be a power of two dividing the head dim {h}, got {cols}")
  kernel = functools.partial(_merge_kernel, num_splits=ns, chunk=chunk_splits(ns, rows, cols), transposed=transposed)
  nsp = decode.pow2_at_least(ns)
  o_spec = (pl.BlockSpec((None, None, nsp, cols, m_rows), lambda i, j, c: (i, j, 0, c, 0)) if transposed
            else pl.BlockSpec((None, None, nsp, m_rows, cols), lambda i, j, c: (i, j, 0, 0, c)))
  return pl.pallas_call(
      kernel,
      grid=(b, kh, h // cols),
      # The split axis's block is NS' >= NS (a power of two); the kernel masks splits >= NS.
      in_specs=[o_spec,
                pl.BlockSpec((None, None, nsp, m_rows), lambda i, j, c: (i, j, 0, 0)),
                pl.BlockSpec((None, None, nsp, m_rows), lambda i, j, c: (i, j, 0, 0))],
      out_specs=pl.BlockSpec((None, None, r, cols), lambda i, j, c: (i, j, 0, c)),
      out_shape=jax.ShapeDtypeStruct((b, kh, r, h), dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
      interpret=interpret,
      name="kvjax_merge_splits",
  )(o, m, l)
