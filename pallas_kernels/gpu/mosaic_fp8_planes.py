"""KIVI-2 code words as e4m3 WGMMA A operands (session 37): k = 32 a WGMMA instead of fp16's 16, and no
dequantization in A (the codes themselves, exact).

Why: a register-A WGMMA at decode's N (8-16 query rows) costs an SM about the same time whatever its N and
whether it is fp16 m64nNk16 or e4m3 m64nNk32 (`benchmarks/wgmma_rate.py`, H100: 22-28 SM cycles each at
4-8 programs per SM). The fp16 KIVI tile needs 32 of them for 128 tokens x 128 channels x 2 products; e4m3
needs 16. Its A is the 2-bit code word itself, masked: a byte v < 16 read as e4m3 is exactly v 2^-9
(subnormals below 8, the first binade above), so c and 4c (c in 0..3) are exact.

Layout. The cache's [rows, 16] uint16 word tile holds plane m of word w at bits 2m (`mosaic_planes`): k
column 16 m + w of the fp16 kernel's slabs. Read as bytes ([rows, 32] uint8, little-endian: byte 2 w + b is
word w's planes 4 b .. 4 b + 3), WGMMA's 8-bit register fragment holds the same 32-bit registers as the
16-bit one (`words_as_bytes` reinterprets them; no data moves). Plane-in-byte p (bits 2p, 2p + 1) of every
byte is one [rows, 32] e4m3 A operand (`fp8_plane`): p = 0, 1 masked in place (c, 4c), p = 2, 3 from the
word shifted right by 4 (one 32-bit shift a register for both). Its column k holds the code of fp16 k column
`plane_k_index(p)[k]` = 16 (4 (k % 2) + p) + k // 2, times `PLANE_FACTORS[p]` 2^`A_SCALE_LOG2`: the B rows
(the query times the keys' scales, or the probabilities times the values') are stored in that order.

B. In that order, B's rows 2 w and 2 w + 1 meet k columns w and 64 + w, whatever the plane: read as uint16
words [N, 64], word w is (column w, column 64 + w). So B is built with no permutation (`e4m3_words`): the
values of columns 0-63 and 64-127 as two [64, n] halves in WGMMA's layout (a thread holds the same rows of
both), rounded to e4m3 in pairs, stored K-major as 16-bit words, and read by the WGMMA as e4m3 through a
second view of the same shared memory (`plgpu.RefUnion`). e4m3 keeps 4 significant bits: each value is
stored as hi + lo on two column blocks (about bf16's 8 bits), summed after the product in f32.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu.mosaic_common import _Transposed, store_kmajor

__all__ = ["A_SCALE_LOG2", "PLANE_FACTORS", "PLANES", "words_as_bytes", "fp8_plane", "plane_k_index",
           "b_order_channels", "word_factors", "e4m3_words", "store_b", "b_slab", "WORD_TILES", "E4M3_TILES",
           "b_buffers", "rows_half"]

WORD_TILES = (plgpu.TilingTransform((8, 16)), plgpu.SwizzleTransform(32))  # B as uint16 words [N, 64]
E4M3_TILES = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(32))  # the same bytes as e4m3 [N, 128]

A_SCALE_LOG2 = -9  # an e4m3 byte v < 16 is v 2^-9
PLANES = 4  # 2-bit codes a byte: one k-32 A operand each
PLANE_FACTORS = (1, 4, 1, 4)  # plane p's A holds c PLANE_FACTORS[p] 2^A_SCALE_LOG2
_MASKS = (0x03, 0x0C, 0x03, 0x0C)  # after the shift by 4 for p = 2, 3


def plane_k_index(p: int) -> np.ndarray:
  """[32] int: the fp16 k column (16 m + w: plane m of word w) whose code plane p's A column k holds."""
  if not 0 <= p < PLANES:
    raise ValueError(f"p must be in [0, {PLANES}) (a byte's 2-bit planes), got {p}")
  k = np.arange(32)
  return 16 * (4 * (k % 2) + p) + k // 2


def words_as_bytes(words, *, interpret: bool):
  """[rows, 16] uint16 words (WGMMA layout) -> [rows, 32] uint8, byte 2 w + b = byte b of word w (WGMMA's
  8-bit layout: the same registers, reinterpreted)."""
  if words.dtype != jnp.uint16 or words.ndim != 2 or words.shape[1] != 16:
    raise ValueError(f"words must be [rows, 16] uint16 (one word tile), got {words.shape} {words.dtype}")
  if interpret:
    lo, hi = (words & 0xFF).astype(jnp.uint8), (words >> 8).astype(jnp.uint8)
    return jnp.stack([lo, hi], axis=-1).reshape(words.shape[0], 32)
  return _reinterpret(words, (words.shape[0], 32), jnp.uint8)


def fp8_plane(bytes_, p: int, *, interpret: bool):
  """[rows, 32] e4m3: plane-in-byte p of each byte, c PLANE_FACTORS[p] 2^A_SCALE_LOG2 (exact)."""
  plane_k_index(p)  # validates p
  if interpret:
    src = lax.shift_right_logical(bytes_, jnp.uint8(4)) if p >= 2 else bytes_
    return lax.bitcast_convert_type(src & jnp.uint8(_MASKS[p]), jnp.float8_e4m3fn)
  return _masked_plane(bytes_, p)


def _reinterpret(x, shape, dtype):
  """The registers of x (WGMMA layout, 32 bits each) as an array of `shape` / `dtype` in WGMMA's 8-bit layout."""
  from jax._src.lib.mlir import ir  # noqa: PLC0415 (Mosaic GPU's MLIR, for the kernel only)
  from jax.experimental.mosaic.gpu import FragmentedArray, utils  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import fragmented_array as fa  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,),
                     return_type=plgpu.ShapeDtypeStruct(shape, dtype, layout=plgpu.Layout.WGMMA_8BIT))
  def f(ctx, w):
    del ctx
    vec = ir.VectorType.get((4,), ir.IntegerType.get_signless(8))
    regs = np.empty(w.registers.shape, dtype=object)
    for idx, r in np.ndenumerate(w.registers):
      regs[idx] = utils.bitcast(r, vec)
    return FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT_8BIT, _is_signed=False)
  return f(x)


def _masked_plane(bytes_, p: int):
  """fp8_plane on the registers: one AND (and for p >= 2 one 32-bit shift) a register of 4 bytes."""
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import arith  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import FragmentedArray, utils  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA_8BIT,),
                     return_type=plgpu.ShapeDtypeStruct(bytes_.shape, jnp.float8_e4m3fn,
                                                        layout=plgpu.Layout.WGMMA_8BIT))
  def f(ctx, b):
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    mask = arith.constant(i32, _MASKS[p] * 0x01010101)
    vec = ir.VectorType.get((4,), ir.Float8E4M3FNType.get())
    regs = np.empty(b.registers.shape, dtype=object)
    for idx, r in np.ndenumerate(b.registers):
      w = utils.bitcast(r, i32)
      if p >= 2:
        w = arith.shrui(w, arith.constant(i32, 4))
      regs[idx] = utils.bitcast(arith.andi(w, mask), vec)
    return FragmentedArray(_registers=regs, _layout=b.layout, _is_signed=None)
  return f(bytes_)



def b_order_channels() -> np.ndarray:
  """[128] int: the fp16 k column (channel for keys, token for values) that B's row j meets: plane j // 32,
  column j % 32 (`plane_k_index`). Row pairs (2 w, 2 w + 1) meet columns w and 64 + w: B read as uint16
  words [n, 64] is word w = (row w, row 64 + w) of the k-ordered operand, no permutation."""
  return np.concatenate([plane_k_index(p) for p in range(PLANES)])


def word_factors():
  """[64] f32 (in a kernel: iota, no constant arrays): what B's word w carries besides its two values so that
  A . B is the codes' product: 2^-A_SCALE_LOG2 / PLANE_FACTORS[p], p = w // 16 (its rows' plane)."""
  w = lax.broadcasted_iota(jnp.int32, (64,), 0)
  return jnp.where((w >> 4) & 1 == 1, 2.0 ** -A_SCALE_LOG2 / 4, 2.0 ** -A_SCALE_LOG2).astype(jnp.float32)


def e4m3_words(y_lo, y_hi, *, interpret: bool = True, f16_rest: bool = False):
  """y_lo, y_hi [64, n] f32 (k columns w and 64 + w) -> [64, 2 n] uint16: columns 0..n-1 the words of the
  values rounded to e4m3 (hi: byte 0 y_lo's, byte 1 y_hi's), n..2n-1 of what that rounding left (lo), so
  hi + lo is each value to about bf16's 8 significant bits. Stored K-major as [2 n, 64] words, it is the
  e4m3 B operand [2 n, 128] in `b_order_channels`' order. interpret=False (in a Mosaic GPU kernel, WGMMA
  layouts): `_words_ptx`, the same words from one PTX block a register pair (a word is one conversion of
  the pair (y_lo, y_hi): no byte permutes); out of range, both saturate to +-448 natively. f16_rest: lo is
  what the rounding left of y in fp16, f16(y) - hi (exact: hi is y to e4m3's 4 bits), rounded to e4m3: 5
  conversions and subtractions a value pair rather than 7 in the PTX block, lo within fp16's 2^-11 of y's
  rest (an eighth of lo's own e4m3 rounding)."""
  if not interpret:
    return _words_ptx(y_lo, y_hi, f16_rest)

  def split(y):
    hi = y.astype(jnp.float8_e4m3fn)
    if f16_rest:
      return hi, (y.astype(jnp.float16) - hi.astype(jnp.float16)).astype(jnp.float8_e4m3fn)
    return hi, (y - hi.astype(jnp.float32)).astype(jnp.float8_e4m3fn)

  def word(a, b):
    u = lambda x: lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint16)
    return u(a) | (u(b) << 8)
  (h0, l0), (h1, l1) = split(y_lo), split(y_hi)
  return jnp.concatenate([word(h0, h1), word(l0, l1)], axis=1)


# Per register pair (columns c, c + 1 of y_lo: $2 $4, of y_hi: $3 $5): hi word c = e4m3 (y_hi, y_lo) (the first
# operand goes to the upper byte), unpacked to f16x2 and f32, subtracted, and the rest packed the same way.
_WORDS_PTX = """{
  .reg .b16 h0, h1, l0, l1, x0, x1, x2, x3;
  .reg .b32 f0, f1;
  .reg .f32 g0, g1, g2, g3;
  cvt.rn.satfinite.e4m3x2.f32 h0, $3, $2;
  cvt.rn.satfinite.e4m3x2.f32 h1, $5, $4;
  cvt.rn.f16x2.e4m3x2 f0, h0;
  cvt.rn.f16x2.e4m3x2 f1, h1;
  mov.b32 {x0, x1}, f0;
  mov.b32 {x2, x3}, f1;
  cvt.f32.f16 g0, x0;
  cvt.f32.f16 g1, x1;
  cvt.f32.f16 g2, x2;
  cvt.f32.f16 g3, x3;
  sub.f32 g0, $2, g0;
  sub.f32 g1, $3, g1;
  sub.f32 g2, $4, g2;
  sub.f32 g3, $5, g3;
  cvt.rn.satfinite.e4m3x2.f32 l0, g1, g0;
  cvt.rn.satfinite.e4m3x2.f32 l1, g3, g2;
  mov.b32 $0, {h0, h1};
  mov.b32 $1, {l0, l1};
}"""


# f16_rest: y in fp16 (one conversion a pair), hi unpacked to fp16, their difference in one f16x2 subtraction
# (exact), packed to e4m3 from fp16.
_WORDS_F16_PTX = """{
  .reg .b16 h0, h1, l0, l1;
  .reg .b32 f0, f1, y0, y1;
  cvt.rn.satfinite.e4m3x2.f32 h0, $3, $2;
  cvt.rn.satfinite.e4m3x2.f32 h1, $5, $4;
  cvt.rn.f16x2.f32 y0, $3, $2;
  cvt.rn.f16x2.f32 y1, $5, $4;
  cvt.rn.f16x2.e4m3x2 f0, h0;
  cvt.rn.f16x2.e4m3x2 f1, h1;
  sub.rn.f16x2 y0, y0, f0;
  sub.rn.f16x2 y1, y1, f1;
  cvt.rn.satfinite.e4m3x2.f16x2 l0, y0;
  cvt.rn.satfinite.e4m3x2.f16x2 l1, y1;
  mov.b32 $0, {h0, h1};
  mov.b32 $1, {l0, l1};
}"""


def _words_ptx(y_lo, y_hi, f16_rest: bool = False):
  """`e4m3_words` on a Mosaic GPU kernel's registers (WGMMA layouts in and out)."""
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import llvm, vector  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import FragmentedArray, utils  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import fragmented_array as fa  # noqa: PLC0415

  m, n = y_lo.shape
  if y_hi.shape != (m, n) or m != 64 or n % 8:
    raise ValueError(f"y_lo, y_hi must be [64, n] with n a multiple of 8, got {y_lo.shape} and {y_hi.shape}")

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.Layout.WGMMA),
                     return_type=plgpu.ShapeDtypeStruct((m, 2 * n), jnp.uint16, layout=plgpu.Layout.WGMMA))
  def f(ctx, a, b):
    del ctx
    i32, i16 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(16)
    pair = ir.VectorType.get((2,), i16)
    struct = llvm.StructType.get_literal([i32, i32])
    regs = np.empty(fa.WGMMA_LAYOUT.registers_shape((m, 2 * n)), dtype=object)
    for idx, ra in np.ndenumerate(a.registers):  # idx[1]: the 8-column tile, idx[4]: the 8-row half
      rb = b.registers[idx]
      ops = [vector.extract(r, [], [j]) for j in range(2) for r in (ra, rb)]  # a0 b0 a1 b1
      out = llvm.inline_asm(struct, ops, _WORDS_F16_PTX if f16_rest else _WORDS_PTX, "=r,=r,f,f,f,f")
      hi, lo = (utils.bitcast(llvm.extractvalue(i32, out, [i]), pair) for i in range(2))
      regs[idx] = hi
      regs[idx[:1] + (idx[1] + n // 8,) + idx[2:]] = lo
    return FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=False)
  return f(y_lo, y_hi)


def b_buffers(n: int, *, interpret: bool):
  """Scratch for one e4m3 B operand [n, 128]: its uint16 word view [n, 64] and its e4m3 view, one buffer
  (`plgpu.RefUnion`; in the interpreter two, `store_b` keeping them equal)."""
  views = (plgpu.SMEM((n, 64), jnp.uint16, transforms=WORD_TILES),
           plgpu.SMEM((n, 128), jnp.float8_e4m3fn, transforms=E4M3_TILES))
  return views if interpret else plgpu.RefUnion(*views)


def store_b(views, words, *, interpret: bool):
  """words [64, N] uint16 (`e4m3_words`) -> the B operand (views from `b_buffers`), K-major."""
  words_ref, e4m3_ref = views
  store_kmajor(words_ref, words, interpret=interpret)
  if interpret:  # the interpreter's two views are two buffers
    e4m3_ref[...] = lax.bitcast_convert_type(words_ref[...], jnp.float8_e4m3fn).reshape(e4m3_ref.shape)


def b_slab(views, p: int, *, interpret: bool):
  """Plane p's [32, N] B slab (k columns 32 p ..) of the e4m3 view, transposed (it is stored K-major)."""
  view = views[1].at[:, pl.ds(32 * p, 32)]
  return _Transposed(view) if interpret else view.transpose((1, 0))


def rows_half(ref, i: int, *, interpret: bool):
  """ref [128] (a tile's per-k-column scales or zeros, any float dtype) -> rows 64 i .. 64 i + 63 as f32 in
  WGMMA's row layout (a thread holds the rows it holds of a [64, n] WGMMA array)."""
  half = ref.at[pl.ds(64 * i, 64)]
  x = half[...] if interpret else plgpu.load(half, (), layout=plgpu.Layout.WGMMA.reduce(1))
  return x.astype(jnp.float32)
