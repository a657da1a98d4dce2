"""Scales and zeros of 32-row groups as WGMMA register fragments, for the Mosaic GPU KIVI kernel at G=32
(`mosaic_kivi.kivi2_states`; G=128 broadcasts one [16] vector per k-slab instead).

The kernel's A operands are [128, 16] fp16 slabs in WGMMA's register layout (`plgpu.Layout.WGMMA`): keys
with tokens on the rows and channels on the k columns, values transposed (channels on the rows, tokens
on the k columns). At G=32 a key's scale depends on its token's 32-token group and its channel, a value's
on its token and its channel's 32-channel group: either way on (row // 32, column). In that layout thread
(warp w, lane l) holds rows 64 j + 16 w + l // 4 (+ 8) of M-block j and columns 2 (l % 4) (+ 1, + 8, + 9)
of the slab, so its rows lie in one group per M-block, 2 j + w // 2, and `group_fragment` builds its
registers of an M-block from the scales of that group at those 4 columns (session 20's design,
`benchmarks/NOTES_gpu.md`).

A tile's scales (one ref of [4, 128]: 512 entries, as TMA copies them: at most 256 a dimension, rows of 16
bytes or more) come in one of `LAYOUTS`, entry i at row i // 128, column i % 128, x the k column (the
channel of a key slab, the token of a value slab):
  * "rows" (keys as the cache holds them: [S / 32, H] per tile is [4 groups, 128 channels]): entry 128 g + x;
  * "tokens" (values as the cache holds them: [S, H / 32] per tile is [128 tokens, 4 groups]): entry 4 x + g;
  * "packed" (made once per tile by `regroup`): as "rows" with each 16 columns reordered 0, 1, 8, 9, 2, 3,
    10, 11, .. so that a thread's 4 columns of a slab are adjacent: one 64-bit load an M-block, 2 a slab
    (where "rows" takes 4 32-bit loads and "tokens" 8 16-bit loads and 4 packs).
The interpreter builds the same [128, 16] arrays with jnp. At head_dim 256 a tile's scales are wider ([4, 256]
for keys, [8, 128] for values: "tokens8", entry 8 x + g) and each 128-channel half is a [4, 128] window at an
`offset` ((0, 128 u) for keys, (4 u, 0) for values) that `regroup` and `group_fragment` index in place.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["GROUP", "GROUPS", "LAYOUTS", "group_fragment", "regroup", "packed_position", "split_halves"]

GROUP = 32            # rows (tokens of a key tile, channels of a value tile) per scale group
GROUPS = 4            # groups per 128-row tile
LAYOUTS = ("rows", "tokens", "packed", "tokens8")
_ROWS, _COLS = 128, 16  # one A slab
_REGS = (2, 2, 1, 1, 2, 1, 1, 1, 1)  # WGMMA_LAYOUT's register array for [128, 16]: (M-block, 8-col block, .., 8-row half, ..)


def packed_position(x):
  """Where column x of a group row sits in the "packed" layout (ints or int arrays)."""
  c = x % 16
  return x - c + 4 * (c % 8 // 2) + c % 2 + 2 * (c // 8)


# "packed" as axes: a group row's 128 columns are (chunk 8, c // 8: 2, c % 8 // 2: 4, c % 2: 2), its positions
# (chunk, c % 8 // 2, c // 8, c % 2): the middle pair swapped (reshapes, no constant index arrays: the
# interpreted kernel may not close over arrays)
_SPLIT = (GROUPS, 8, 2, 4, 2)
_SWAP = (0, 1, 3, 2, 4)


def _as_rows(x, layout: str):
  """A tile's entries x [4, 128] in `layout` -> [group, column] ("rows")."""
  if layout == "tokens":
    return x.reshape(128, GROUPS).T
  if layout == "packed":
    return x.reshape(GROUPS, 8, 4, 2, 2).transpose(_SWAP).reshape(GROUPS, 128)
  return x


def _packed(rows):
  """[group, column] -> "packed"."""
  return rows.reshape(_SPLIT).transpose(_SWAP).reshape(GROUPS, 128)


def _check(ref, layout: str, name: str = "ref", offset=(0, 0)):
  """ref holds one tile's scales [4, 128], or (head_dim 256) a wider block whose [4, 128] window at `offset`
  (rows, columns) is the one used: [4, 256] (a key tile's two 128-channel halves) or [8, 128] (a value tile's
  8 groups of a token, 4 a half)."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
  if layout == "tokens" and tuple(ref.shape) != (GROUPS, 128):
    raise ValueError(f"layout 'tokens' takes a [{GROUPS}, 128] ref (4 groups a token), got {ref.shape}")
  if layout == "tokens8" and tuple(ref.shape) != (2 * GROUPS, 128):
    raise ValueError(f"layout 'tokens8' takes a [{2 * GROUPS}, 128] ref (8 groups a token), got {ref.shape}")
  r0, c0 = offset
  if (len(ref.shape) != 2 or ref.shape[0] % GROUPS or ref.shape[1] % 128 or r0 % GROUPS or c0 % 128
          or not (0 <= r0 < ref.shape[0] and 0 <= c0 < ref.shape[1])):
    raise ValueError(f"{name} must hold one tile's scales, [{GROUPS} k, 128 j] with a window at offset (4 i, 128 i') "
                     f"inside, got {ref.shape} at {offset}")


def group_fragment(ref, m: int, *, layout: str, interpret: bool, offset=(0, 0)):
  """[128, 16] fp16 (WGMMA layout): element (r, c) the tile's entry for group r // 32 and k column 16 m + c
  of ref ([4, 128] in `layout`, or its [4, 128] window at `offset` ("rows" / "packed"); shared or global
  memory, fp16 / bf16 / f32: converted to fp16)."""
  _check(ref, layout, offset=offset)
  if layout == "tokens8":
    raise ValueError("group_fragment reads 'rows', 'tokens' or 'packed' (regroup makes 'tokens8' packed)")
  if not 0 <= m < 8:
    raise ValueError(f"m (the k-slab of 16 columns) must be in [0, 8), got {m}")
  if interpret:
    r0, c0 = offset
    t = _as_rows(ref[...][r0:r0 + GROUPS, c0:c0 + 128].astype(jnp.float16), layout)
    return jnp.repeat(t[:, 16 * m:16 * m + 16], GROUP, axis=0)
  return _fragment(ref, m, layout, offset)


def _fragment(ref, m: int, layout: str, offset=(0, 0)):
  from jax.experimental.mosaic.gpu import FragmentedArray, fragmented_array as fa, utils  # noqa: PLC0415
  from jaxlib.mlir import ir  # noqa: PLC0415
  from jaxlib.mlir.dialects import arith, memref, vector  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                     return_type=plgpu.ShapeDtypeStruct((_ROWS, _COLS), jnp.float16, layout=plgpu.Layout.WGMMA))
  def build(ctx, src):
    del ctx
    wgmma = fa.WGMMA_LAYOUT
    if wgmma.registers_shape((_ROWS, _COLS)) != _REGS:  # the (M-block, col block, row half) indexing below
      raise NotImplementedError(f"WGMMA layout's registers changed: {wgmma.registers_shape((_ROWS, _COLS))}")
    i32, index, f16 = ir.IntegerType.get_signless(32), ir.IndexType.get(), ir.F16Type.get()
    elem = ir.MemRefType(src.type).element_type
    vec = lambda n, t=elem: ir.VectorType.get((n,), t)
    c = lambda v: arith.constant(i32, v)
    ix = lambda v: arith.index_castui(index, v)
    tid = utils.thread_idx()
    half = arith.andi(arith.shrui(tid, c(6)), c(1))  # warp // 2 within the warpgroup: the M-block's group
    quad = arith.andi(tid, c(3))  # lane % 4: columns 2 quad (+ 1, + 8, + 9)
    r0, c0 = offset  # the [4, 128] window's corner
    col = arith.addi(c(c0 + 16 * m), arith.shli(quad, c(1)))

    def to_f16(v, n=2):  # vector<n x elem> -> vector<n x f16>
      if elem == f16:
        return v
      if elem != ir.F32Type.get():
        v = arith.extf(vec(n, ir.F32Type.get()), v)
      return arith.truncf(vec(n, f16), v)

    def block(j):  # this thread's (cols 0-1, cols 8-9) pairs of M-block j
      g = arith.addi(c(2 * j), half)
      if layout == "packed":  # 4 adjacent entries at 16 m + 4 quad
        v = to_f16(vector.load(vec(4), src, [ix(arith.addi(g, c(r0))),
                                             ix(arith.addi(c(c0 + 16 * m), arith.shli(quad, c(2))))]), 4)
        return tuple(vector.extract_strided_slice(vec(2, f16), v, [o], [2], [1]) for o in (0, 2))
      if layout == "rows":  # entries x, x + 1 of group g: adjacent
        return tuple(to_f16(vector.load(vec(2), src, [ix(arith.addi(g, c(r0))), ix(arith.addi(col, c(8 * cb)))]))
                     for cb in (0, 1))
      # "tokens": entry 4 x + g at row x // 32, column 4 (x % 32) + g
      at = lambda x: [ix(arith.shrui(x, c(5))), ix(arith.addi(arith.shli(arith.andi(x, c(31)), c(2)), g))]
      return tuple(to_f16(vector.from_elements(vec(2), [memref.load(src, at(arith.addi(col, c(8 * cb + d))))
                                                        for d in (0, 1)])) for cb in (0, 1))

    pairs = [block(j) for j in range(2)]
    regs = np.empty(_REGS, dtype=object)
    for idx in np.ndindex(_REGS):
      regs[idx] = pairs[idx[0]][idx[1]]  # both 8-row halves (idx[4]) of an M-block share the group
    return FragmentedArray(_registers=regs, _layout=wgmma, _is_signed=None)
  return build(ref)


def _slab_factors(factors, shape, axis: int):
  """The interpreter's factors[x // 16] over `axis` (x: 0..127) of an f32 array of `shape` (iota and selects: an
  interpreted kernel may not close over constant arrays)."""
  slab = lax.broadcasted_iota(jnp.int32, shape, axis) // 16
  f = jnp.zeros(shape, jnp.float32)
  for m, fm in enumerate(factors):
    f = jnp.where(slab == m, jnp.float32(fm), f)
  return f


def _slab_factor(factors, slab):
  """Natively (inside an `inline_mgpu` emitter): factors[slab] as an f32 scalar, slab an i32 value in 0..7."""
  from jaxlib.mlir import ir  # noqa: PLC0415
  from jaxlib.mlir.dialects import arith  # noqa: PLC0415
  i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
  f = arith.constant(f32, float(factors[7]))
  for m in range(6, -1, -1):
    f = arith.select(arith.cmpi(arith.CmpIPredicate.eq, slab, arith.constant(i32, m)),
                     arith.constant(f32, float(factors[m])), f)
  return f


def regroup(src, dst, factors=None, *, layout: str, interpret: bool, offset=(0, 0)):
  """dst's [4, 128] window at `offset` fp16 "packed" = src's ("rows": its window at the same offset, "tokens":
  [4, 128]; "tokens8": a head_dim-256 value tile [8, 128], entry 8 x + g, groups offset[0] .. + 3; fp16 / bf16
  / f32) x factors[x // 16] (8 floats, one per k-slab, or None): a tile's scales made ready for
  `group_fragment(layout="packed", offset=offset)`, once per tile. Natively thread t of the warpgroup moves 4
  entries (one 8-byte load, 4 2-byte stores): row t // 32, columns 4 (t % 32) .. + 3 ("rows"), or token t's 4
  groups ("tokens", "tokens8"). The caller's `plgpu.commit_smem` follows before the fragments read dst."""
  _check(src, layout, "src", offset if layout != "tokens" else (0, 0))
  _check(dst, "packed", "dst", offset)
  if layout == "packed":
    raise ValueError("regroup's src must be 'rows', 'tokens' or 'tokens8', got 'packed'")
  if factors is not None and len(factors) != 8:
    raise ValueError(f"factors must hold one float per k-slab (8), got {factors!r}")
  r0, c0 = offset
  if interpret:
    x = src[...].astype(jnp.float32)
    if layout == "tokens8":
      x = x.reshape(128, 2 * GROUPS).T[r0:r0 + GROUPS]
    else:
      x = _as_rows(x[r0:r0 + GROUPS, c0:c0 + 128] if layout == "rows" else x, layout)
    if factors is not None:
      x = x * _slab_factors(factors, (1, 128), 1)
    x = _packed(x).astype(jnp.float16)
    dst[...] = x if tuple(dst.shape) == (GROUPS, 128) else dst[...].at[r0:r0 + GROUPS, c0:c0 + 128].set(x)
    return
  from jax.experimental.mosaic.gpu import utils  # noqa: PLC0415
  from jaxlib.mlir import ir  # noqa: PLC0415
  from jaxlib.mlir.dialects import arith, memref, vector  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def emit(ctx, src_ref, dst_ref):
    del ctx
    i32, index, f32, f16 = ir.IntegerType.get_signless(32), ir.IndexType.get(), ir.F32Type.get(), ir.F16Type.get()
    elem = ir.MemRefType(src_ref.type).element_type
    vec = lambda t: ir.VectorType.get((GROUPS,), t)
    c = lambda v: arith.constant(i32, v)
    ix = lambda v: arith.index_castui(index, v)
    t = arith.andi(utils.thread_idx(), c(127))
    if layout == "tokens8":  # token t's groups r0 .. r0 + 3: entries 8 t + r0 ..
      e0 = arith.addi(arith.shli(t, c(3)), c(r0))
      at = [ix(arith.shrui(e0, c(7))), ix(arith.andi(e0, c(127)))]
    else:
      at = [ix(arith.addi(arith.shrui(t, c(5)), c(r0 if layout == "rows" else 0))),
            ix(arith.addi(arith.shli(arith.andi(t, c(31)), c(2)), c(c0 if layout == "rows" else 0)))]
    v = vector.load(vec(elem), src_ref, at)
    v = v if elem == f32 else arith.extf(vec(f32), v)
    if layout == "rows":  # row t // 32, columns x0 .. x0 + 3
      x0 = arith.shli(arith.andi(t, c(31)), c(2))
      places = [(arith.shrui(t, c(5)), arith.addi(x0, c(i))) for i in range(GROUPS)]
      slab = arith.shrui(x0, c(4))
    else:  # token t, groups 0..3
      places = [(c(g), t) for g in range(GROUPS)]
      slab = arith.shrui(t, c(4))
    if factors is not None:
      v = arith.mulf(v, vector.broadcast(vec(f32), _slab_factor(factors, slab)))
    v = arith.truncf(vec(f16), v)
    for i, (g, x) in enumerate(places):
      cc = arith.andi(x, c(15))  # packed_position(x)
      pos = arith.addi(arith.subi(x, cc), arith.addi(arith.shli(arith.shrui(arith.andi(cc, c(7)), c(1)), c(2)),
                                                      arith.addi(arith.andi(cc, c(1)), arith.shli(arith.shrui(cc, c(3)), c(1)))))
      memref.store(vector.extract(v, [], [i]), dst_ref, [ix(arith.addi(g, c(r0))), ix(arith.addi(pos, c(c0)))])
  emit(src, dst)


def split_halves(src, dst, factors=None, *, interpret: bool):
  """Head_dim 256 at G=128: a value scale (or zero) per token and 128 channels. dst [n 256] fp16, each tile's
  entries half-major (entry 256 j + 128 u + x: token x, half u) = src [n 256] (fp16 / bf16 / f32, token-major
  as the cache holds them: 256 j + 2 x + u) x factors[x // 16] (8 floats, one per k-slab of 16 tokens, or
  None), so a half's tokens are one contiguous [128] vector (`mosaic_kivi`'s per-slab broadcast). Natively
  thread t of the warpgroup moves token t of each tile (one 2-entry load, 2 stores); the caller's
  `plgpu.commit_smem` follows."""
  n = src.shape[0]
  if src.shape != dst.shape or len(src.shape) != 1 or n % 256:
    raise ValueError(f"src and dst must be [n x 256] alike, got {src.shape} and {dst.shape}")
  if factors is not None and len(factors) != 8:
    raise ValueError(f"factors must hold one float per k-slab (8), got {factors!r}")
  if interpret:
    x = src[...].astype(jnp.float32).reshape(n // 256, 128, 2)
    if factors is not None:
      x = x * _slab_factors(factors, (1, 128, 1), 1)
    dst[...] = x.transpose(0, 2, 1).reshape(n).astype(jnp.float16)
    return
  from jax.experimental.mosaic.gpu import utils  # noqa: PLC0415
  from jaxlib.mlir import ir  # noqa: PLC0415
  from jaxlib.mlir.dialects import arith, memref, vector  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def emit(ctx, src_ref, dst_ref):
    del ctx
    i32, index, f32, f16 = ir.IntegerType.get_signless(32), ir.IndexType.get(), ir.F32Type.get(), ir.F16Type.get()
    elem = ir.MemRefType(src_ref.type).element_type
    vec = lambda t: ir.VectorType.get((2,), t)
    c = lambda v: arith.constant(i32, v)
    ix = lambda v: arith.index_castui(index, v)
    t = arith.andi(utils.thread_idx(), c(127))
    f = None if factors is None else _slab_factor(factors, arith.shrui(t, c(4)))
    for j in range(n // 256):
      v = vector.load(vec(elem), src_ref, [ix(arith.addi(c(256 * j), arith.shli(t, c(1))))])
      v = v if elem == f32 else arith.extf(vec(f32), v)
      if f is not None:
        v = arith.mulf(v, vector.broadcast(vec(f32), f))
      v = arith.truncf(vec(f16), v)
      for u in range(2):
        memref.store(vector.extract(v, [], [u]), dst_ref, [ix(arith.addi(c(256 * j + 128 * u), t))])
  emit(src, dst)
