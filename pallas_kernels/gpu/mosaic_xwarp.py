"""A column reduction over a warpgroup's rows in two halves, around a barrier the kernel already has.

`jnp.sum` / `jnp.max` over axis 0 of a [M, N] array in WGMMA's layout (rows split over the 4 warps) lower in
Mosaic GPU to shuffles, a shared-memory store, a warpgroup barrier, the loads, and a second barrier that keeps
the scratch from being rewritten before every warp has read it: two barriers a reduction (in the e4m3 KIVI-2
tile, `mosaic_kivi_fp8`, two reductions a tile: the keys' zero term q . z and the softmax's max).

Here the halves are separate calls:

    warp_partials(x, ref, op)     each warp's reduction of its rows, stored into ref [WARPS, N] (f32)
    ... a warpgroup barrier (the caller's own, e.g. `plgpu.commit_smem`, or `combine(..., barrier=True)`)
    combine(ref, N, op)           op over the 4 warps' partials: [N] in WGMMA's column layout

and no second barrier: the caller guarantees that a barrier separates `combine`'s loads from the next
`warp_partials` into the same ref (in the tile loop: the values' commit and the slot's barrier).
A warp's rows: row r of a 64-row block belongs to warp (r % 64) // 16.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["WARPS", "OPS", "warp_partials", "combine", "reduce_rows", "scratch", "barrier"]

WARPS = 4  # a warpgroup's warps
OPS = ("add", "max")
_ROWS_A_WARP = 16  # WGMMA's layout: rows 16 w .. 16 w + 15 of each 64-row block in warp w


def _check(op: str, width: int):
  if op not in OPS:
    raise ValueError(f"op={op!r}: expected one of {OPS}")
  if width <= 0 or width % 8:
    raise ValueError(f"width={width}: expected a positive multiple of 8 (WGMMA's column tile)")


def scratch(width: int):
  """The shared-memory scratch of one reduction: [WARPS, width] f32."""
  _check("add", width)
  return plgpu.SMEM((WARPS, width), jnp.float32)


def barrier(*, interpret: bool) -> None:
  """A warpgroup barrier alone, without `plgpu.commit_smem`'s proxy fence (MEMBAR + FENCE in SASS): what
  orders a warpgroup's shared-memory reads before a TMA refetch into the same buffer (Mosaic's own automatic
  barrier before `copy_gmem_to_smem` is this one). Nothing in the interpreter."""
  if interpret:
    return
  from jax.experimental.mosaic.gpu import utils  # noqa: PLC0415

  @plgpu.inline_mgpu()
  def f(ctx):
    del ctx
    utils.warpgroup_barrier()
  f()


def _jnp_op(op: str):
  return jnp.sum if op == "add" else jnp.max


def warp_partials(x, ref, op: str, *, interpret: bool) -> None:
  """x [M, N] f32 (WGMMA layout; M a multiple of 64): each warp's op over its rows, into ref [WARPS, N]."""
  m, n = x.shape
  _check(op, n)
  if m % 64:
    raise ValueError(f"x.shape={x.shape}: expected rows in multiples of 64 (WGMMA's layout)")
  if tuple(ref.shape) != (WARPS, n):
    raise ValueError(f"ref.shape={tuple(ref.shape)}: expected {(WARPS, n)} for x.shape={x.shape}")
  if interpret:
    ref[...] = _jnp_op(op)(x.reshape(m // 64, WARPS, _ROWS_A_WARP, n), axis=(0, 2))
    return
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import arith, vector  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import utils  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()))
  def f(ctx, a, r):
    del ctx
    i32, index = ir.IntegerType.get_signless(32), ir.IndexType.get()
    fn = arith.addf if op == "add" else arith.maximumf
    regs = a.registers  # (M / 64, N / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2xf32>: [.., col tile c, .., half, ..]
    if regs.shape != (m // 64, n // 8, 1, 1, 2, 1, 1, 1, 1):
      raise NotImplementedError(f"WGMMA registers {regs.shape} for x.shape={x.shape}")
    tid = utils.thread_idx()
    lane = arith.remui(tid, arith.constant(i32, 32))
    warp = arith.remui(arith.divui(tid, arith.constant(i32, 32)), arith.constant(i32, WARPS))
    pair = arith.muli(arith.remui(lane, arith.constant(i32, 4)), arith.constant(i32, 2))  # the column pair
    for c in range(n // 8):
      v = None
      for i in range(m // 64):
        for half in range(2):
          x_ = regs[i, c, 0, 0, half, 0, 0, 0, 0]
          v = x_ if v is None else fn(v, x_)
      for d in (4, 8, 16):  # the 8 lanes holding these columns (lane // 4: the rows)
        v = fn(v, utils.shfl_bfly(v, d))
      col = arith.addi(pair, arith.constant(i32, 8 * c))
      vector.store(v, r, [arith.index_cast(index, warp), arith.index_cast(index, col)])  # 8 lanes, one value
  f(x, ref)


def combine(ref, width: int, op: str, *, barrier: bool, interpret: bool):
  """op over ref [WARPS, width]'s partials: [width] f32 in WGMMA's column layout (`Layout.WGMMA.reduce(0)`).
  barrier: a warpgroup barrier first (when the caller has none between `warp_partials` and this)."""
  _check(op, width)
  if tuple(ref.shape) != (WARPS, width):
    raise ValueError(f"ref.shape={tuple(ref.shape)}: expected {(WARPS, width)}")
  if interpret:
    return _jnp_op(op)(ref[...], axis=0)
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import arith, vector  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import FragmentedArray, utils  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import fragmented_array as fa  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                     return_type=plgpu.ShapeDtypeStruct((width,), jnp.float32, layout=plgpu.Layout.WGMMA.reduce(0)))
  def f(ctx, r):
    del ctx
    i32, index = ir.IntegerType.get_signless(32), ir.IndexType.get()
    fn = arith.addf if op == "add" else arith.maximumf
    if barrier:
      utils.warpgroup_barrier()
    lane = arith.remui(utils.thread_idx(), arith.constant(i32, 32))
    pair = arith.muli(arith.remui(lane, arith.constant(i32, 4)), arith.constant(i32, 2))
    shape = fa.WGMMA_COL_LAYOUT.registers_shape((width,))
    regs = np.empty(shape, dtype=object)
    vec = ir.VectorType.get((2,), ir.F32Type.get())
    for c in range(width // 8):
      col = arith.index_cast(index, arith.addi(pair, arith.constant(i32, 8 * c)))
      parts = [vector.load(vec, r, [arith.constant(index, w), col]) for w in range(WARPS)]
      regs.reshape(width // 8, -1)[c, 0] = fn(fn(parts[0], parts[1]), fn(parts[2], parts[3]))
    return FragmentedArray(_registers=regs, _layout=fa.WGMMA_COL_LAYOUT, _is_signed=None)
  return f(ref)


def reduce_rows(x, ref, op: str, *, interpret: bool):
  """x [M, N] f32 (WGMMA layout) -> op over its rows, [N] in WGMMA's column layout, with one barrier (ref
  [WARPS, N]: its scratch, not rewritten before the caller's next barrier)."""
  warp_partials(x, ref, op, interpret=interpret)
  return combine(ref, x.shape[1], op, barrier=True, interpret=interpret)
