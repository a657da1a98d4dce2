"""Flash-decoding split merge as one Pallas kernel (Triton lowering); `decode.combine` is its jnp
reference.

The decode kernels leave per-split states (o, m, l) of every (sequence, KV head); the XLA merge of
those (`decode.combine`) compiles to three or four small fusions (max over splits, weights, weighted
sum, normalize and cast). At short contexts each is a launch of ~0.6-0.8 us plus the gap to the next
one (H200 trace, `benchmarks/profile_step.py`, session 9: fp8 B=1 4k spent 5.9 us in the decode
kernel and 11.8 us per call). Here one program per (b, k) walks the splits in chunks of `CHUNK`
(one masked [CHUNK, R, H] load each, so the L2 round trips overlap) with an online log-sum-exp,
normalizes, and stores the output in the query's dtype: one launch.

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

__all__ = ["merge_states", "out_rows", "CHUNK"]

CHUNK = 8  # splits per masked load


def out_rows(rows: int) -> int:
  """Rows a merge program works on: the power of two >= rows (Triton tiles are powers of two)."""
  return 1 << max(0, (rows - 1).bit_length())


def _merge_kernel(o_ref, m_ref, l_ref, out_ref, *, num_splits):
  r = out_ref.shape[0]
  c = min(CHUNK, out_rows(num_splits))
  rows = pl.ds(0, r)

  def body(i, carry):
    acc, m_prev, l_prev = carry
    idx = i * c + lax.broadcasted_iota(jnp.int32, (c, 1), 0)  # [c, 1] split indices
    ok = idx < num_splits
    span = pl.ds(i * c, c)
    m_s = plgpu.load(m_ref.at[span, rows], mask=ok, other=decode.NEG)  # [c, R]
    l_s = plgpu.load(l_ref.at[span, rows], mask=ok, other=0.0)
    o_s = plgpu.load(o_ref.at[span, rows, :], mask=ok[:, :, None], other=0.0)  # [c, R, H]
    m_new = jnp.maximum(m_prev, jnp.max(m_s, axis=0))  # [R]
    alpha = jnp.exp2(m_prev - m_new)
    w = jnp.exp2(m_s - m_new[None, :])  # [c, R]
    l_new = l_prev * alpha + jnp.sum(l_s * w, axis=0)
    acc = acc * alpha[:, None] + jnp.sum(o_s * w[:, :, None], axis=0)
    return acc, m_new, l_new

  h = out_ref.shape[1]
  init = (jnp.zeros((r, h), jnp.float32), jnp.full((r,), decode.NEG, jnp.float32),
          jnp.zeros((r,), jnp.float32))
  acc, _, l = lax.fori_loop(0, pl.cdiv(num_splits, c), body, init)
  out = jnp.where(l[:, None] > 0, acc / jnp.where(l > 0, l, 1.0)[:, None], 0.0)
  out_ref[...] = out.astype(out_ref.dtype)


def merge_states(o, m, l, rows: int, dtype, *, interpret: bool = False, num_warps: int = 4):
  """o [B, K, NS, M, H], m / l [B, K, NS, M] f32 -> [B, K, R, H] in `dtype` (R = out_rows(rows);
  rows past `rows` are undefined), equal to ``decode.combine(o, m, l, rows)`` in the first rows."""
  b, kh, ns, m_rows, h = o.shape
  r = out_rows(rows)
  if not 1 <= rows <= m_rows:
    raise ValueError(f"rows must be in [1, {m_rows}] (the states' padded rows), got {rows}")
  if m.shape != (b, kh, ns, m_rows) or l.shape != m.shape:
    raise ValueError(f"m and l must be [B, K, NS, M] = {(b, kh, ns, m_rows)}, got {m.shape}, {l.shape}")
  return pl.pallas_call(
      functools.partial(_merge_kernel, num_splits=ns),
      grid=(b, kh),
      in_specs=[pl.BlockSpec((None, None, ns, m_rows, h), lambda i, j: (i, j, 0, 0, 0)),
                pl.BlockSpec((None, None, ns, m_rows), lambda i, j: (i, j, 0, 0)),
                pl.BlockSpec((None, None, ns, m_rows), lambda i, j: (i, j, 0, 0))],
      out_specs=pl.BlockSpec((None, None, r, h), lambda i, j: (i, j, 0, 0)),
      out_shape=jax.ShapeDtypeStruct((b, kh, r, h), dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
      interpret=interpret,
      name="kvjax_merge_splits",
  )(o, m, l)
