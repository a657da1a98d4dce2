"""Pieces the Mosaic GPU decode kernels share (`mosaic_kivi`, `mosaic_fp8`): the WGMMA chain over register A
operands built right before each instruction, the balanced split of the live steps, the logit soft-cap, and the
narrow softmax's padding back to WGMMA's 16 columns with the K-major B operands of its N = 8 MMAs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["wgmma_sum", "balanced_range", "soft_capped", "softmax_columns", "widened", "kmajor_slab", "store_kmajor"]

LOG2E = math.log2(math.e)  # the kernels' logits are in the log2 domain (the query carries the scale x log2 e)


def wgmma_sum(init, pairs, *, lag, interpret):
  """init + sum of a() . b_ref over (a, b_ref) pairs, a() building a [rows, 16] register A operand (or
  returning a shared-memory ref) right before its WGMMA, at most `lag` groups left in flight (None: all
  issued, then waited; interpret mode has no register-A WGMMA: jnp.dot there, same arithmetic)."""
  if interpret:
    for a, b_ref in pairs:
      x = a()
      x = x if isinstance(x, jax.Array) else x[...]  # a (transposed) shared-memory ref as A
      init = init + jnp.dot(x.astype(jnp.float32), b_ref[...].astype(jnp.float32))
    return init

  def scope(acc):
    for i, (a, b_ref) in enumerate(pairs):
      plgpu.wgmma(acc, a(), b_ref)
      if lag is not None and i >= lag:
        plgpu.wgmma_wait(lag)
    plgpu.wgmma_wait(0)
  return pl.run_state(scope)(plgpu.ACC.init(init))


def balanced_range(length, si, *, num_splits: int, tile: int, capacity_steps: int, min_share: int, start=None):
  """(first, steps) of split si: the steps holding a token below `length` shared evenly, at least
  `min_share` a split (those past the live ones: none). start: None, or the first step holding a visible
  token (a sliding window's): the steps from it on are shared instead."""
  live = jnp.minimum(lax.div(length + (tile - 1), tile), capacity_steps)
  if start is None:
    per = jnp.maximum(lax.div(live + (num_splits - 1), num_splits), min_share)
    first = si * per
  else:
    per = jnp.maximum(lax.div(jnp.maximum(live - start, 0) + (num_splits - 1), num_splits), min_share)
    first = start + si * per
  return first, jnp.clip(live - first, 0, per)


def soft_capped(sc, cap: float, k: float = 1.0):
  """The logit soft-cap (`cap tanh(s / cap)` of the natural-log logits s) of log2-domain logits held as sc / k:
  c tanh(sc / c) with c = cap log2(e) / k."""
  c = cap * LOG2E / k
  return c * jnp.tanh(sc * (1.0 / c))


def softmax_columns(live_rows: int, rows: int, enabled: bool):
  """(narrow, width): whether the tiles' softmax runs over the first rows // 2 of WGMMA's `rows` query columns
  (`narrow_softmax` enabled and at most that many rows hold queries) and how many columns it runs over."""
  if not 1 <= live_rows <= rows:
    raise ValueError(f"live_rows must be in [1, {rows}] (the query rows that hold queries), got {live_rows}")
  narrow = enabled and live_rows <= rows // 2
  return narrow, rows // 2 if narrow else rows


def widened(x, fill: float):
  """x [..., 8] -> [..., 16], the other 8 columns `fill`: the narrow softmax's (`Options.narrow_softmax`)
  probabilities (0), o's rescale (1) and final states (m NEG, l 0) back at WGMMA's 16 query rows."""
  return jnp.concatenate([x, jnp.full_like(x, fill)], axis=-1)


class _Transposed:
  """The interpreter's stand-in for a transposed ref view (`ref.transpose`): reads give x[...].T."""

  def __init__(self, ref):
    self.ref = ref

  def __getitem__(self, idx):
    return self.ref[...].T[idx]


def kmajor_slab(ref, i: int, *, interpret: bool):
  """ref [N, K] (K-major: a B operand stored transposed, N = 8 query rows) -> slab i, the [16, N] B operand
  of k columns 16 i .. 16 i + 15 (WGMMA's N = 8 needs the K-major form: 16 bytes a row is below the swizzle)."""
  view = ref.at[:, pl.ds(16 * i, 16)]
  return _Transposed(view) if interpret else view.transpose((1, 0))


def store_kmajor(ref, x, *, interpret: bool):
  """x [K, N] (registers) -> ref [N, K] (K-major shared memory), transposed on the way."""
  if interpret:
    ref[...] = x.T.astype(ref.dtype)
  else:
    ref.transpose((1, 0))[...] = x.astype(ref.dtype)
