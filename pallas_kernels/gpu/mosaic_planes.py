"""How the Mosaic GPU KIVI kernel (`mosaic_kivi.kivi2_states`) turns a register tile of uint16 words
(8 two-bit codes each, plane m at bits 2m; or 4 four-bit codes, plane m at bits 4m) into fp16 WGMMA A
operands, one [rows, 16] plane at a time, elementwise (any layout) so the CPU interpreter runs the same
code: `plane` (shift per plane, 2-bit), `plane_masked` (mask in place, the codes themselves), `plane_denorm`
(mask in place, the codes as fp16 subnormals; `Options(unpack="denorm")`), `shr_pairs` (the shift the
planes above the mantissa need, on 32-bit pairs: 10 for 2-bit planes 5-7, 8 for 4-bit planes 2-3)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu.mosaic_options import DENORM_LOG2

__all__ = ["plane", "plane_masked", "plane_denorm", "shr10_pairs", "shr_pairs", "hi_shift", "denorm_scale_log2",
           "denorm_factors", "zero_over_scale"]


def _split(m: int, bits: int):
  """(from hi?, field index j) of plane m: the fields wholly in an fp16 mantissa (bits 0-9) are read from
  the word itself, the rest from hi = w >> `hi_shift(bits)`."""
  low = 10 // bits  # 5 two-bit fields, 2 four-bit ones
  return (m >= low, m - low if m >= low else m)


def hi_shift(bits: int = 2) -> int:
  """w >> this puts the planes above the mantissa's fields at bits 0.. (10 for 2-bit, 8 for 4-bit)."""
  return bits * (10 // bits)


def plane(words, m: int, exact: bool = False):
  """Plane m (bits 2m, 2m + 1) of uint16 words as fp16 (any layout; elementwise): 1024 + code, or the
  code itself (`exact`: one fp16 subtraction of 1024 more per pair of codes; exact)."""
  x = lax.bitcast_convert_type(
      (lax.shift_right_logical(words, jnp.uint16(2 * m)) & jnp.uint16(3)) | jnp.uint16(0x6400), jnp.float16)
  return x - jnp.float16(1024) if exact else x


def plane_masked(words, hi, m: int, magic=None, bits: int = 2):
  """Plane m as its exact fp16 code without shifting each word per plane: for the planes in the mantissa
  (2-bit 0-4) the code is masked in place, (w & 3 << 2m) | 0x6400 = fp16 1024 + c 4^m (mantissa bits 0-9
  at exponent 10), then x 4^-m - 1024 4^-m = c, both steps exact; the others (2-bit 5-7) do the same from
  hi = w >> 10 (one shift a word). 4-bit: 16 for 4, planes 0-1 from w, 2-3 from hi = w >> 8.
  magic: 0x6400 as a uint16 scalar read at run time (`Options.opaque_magic`), else the literal."""
  from_hi, j = _split(m, bits)
  src, r = (hi if from_hi else words), float(2 ** bits) ** -j
  x = lax.bitcast_convert_type((src & jnp.uint16((2 ** bits - 1) << bits * j))
                               | (jnp.uint16(0x6400) if magic is None else magic), jnp.float16)
  return (x * jnp.float16(r) if j else x) - jnp.float16(1024 * r)


def plane_denorm(words, hi, m: int, bits: int = 2):
  """Plane m as an fp16 subnormal (`Options(unpack="denorm")`): (src & (2^bits - 1) << bits j) read as fp16
  is exactly c 2^(bits j) 2^-24 (mantissa bits only; j = m from the words for the planes in the
  mantissa, else from hi = w >> `hi_shift(bits)`)."""
  from_hi, j = _split(m, bits)
  return lax.bitcast_convert_type((hi if from_hi else words) & jnp.uint16((2 ** bits - 1) << bits * j), jnp.float16)


def shr10_pairs(words, interpret: bool):
  """`shr_pairs(words, 10)`: 2-bit planes 5-7."""
  return shr_pairs(words, 10, interpret)


def shr_pairs(words, shift: int, interpret: bool):
  """words >> shift (10: 2-bit planes 5-7; 8: 4-bit planes 2-3) with each register's pair of uint16 words
  shifted as one 32-bit word (`Options.shift32`): one SHF a pair, where a uint16 shift is two scalar shifts
  and a repack in PTX. The low word's bits 16 - shift .. 15 then hold the high word's low bits; the planes
  read from it mask bits 0 .. 15 - shift only (2-bit: 0-5, 4-bit: 0-7), so their codes are those of
  `words >> shift`. [rows, 16] uint16 in WGMMA's layout (pairs: columns 2i,
  2i + 1); the interpreter does the same on those pairs."""
  if interpret:
    lo, hi = words[:, 0::2].astype(jnp.uint32), words[:, 1::2].astype(jnp.uint32)
    w = lax.shift_right_logical(lo | hi << 16, jnp.uint32(shift))
    return jnp.stack([w & 0xFFFF, w >> 16], axis=-1).reshape(words.shape).astype(jnp.uint16)
  from jax._src.lib.mlir import ir  # noqa: PLC0415 (Mosaic GPU's MLIR, for the kernel only)
  from jax._src.lib.mlir.dialects import arith  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import FragmentedArray, utils  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,),
                     return_type=plgpu.ShapeDtypeStruct(words.shape, jnp.uint16, layout=plgpu.Layout.WGMMA))
  def shr(ctx, w):
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    ten = arith.constant(i32, shift)
    regs = w.registers.copy()
    for idx, r in np.ndenumerate(w.registers):
      regs[idx] = utils.bitcast(arith.shrui(utils.bitcast(r, i32), ten), r.type)
    return FragmentedArray(_registers=regs, _layout=w.layout, _is_signed=w.is_signed)
  return shr(words)


def denorm_scale_log2(m: int, bits: int = 2) -> int:
  """log2 of the factor plane m's scales carry under unpack="denorm": 2^-(bits j) 2^24 / 2^DENORM_LOG2."""
  return 24 - bits * _split(m, bits)[1] - DENORM_LOG2


def denorm_factors(n: int, bits: int = 2):
  """unpack="denorm"'s factors for n consecutive k columns (128 a tile: slab i = columns 16 i ..): the scales'
  2^`denorm_scale_log2` of the slab's plane (f32 [n], made from the bits: exact) and the zeros' 2^-DENORM_LOG2.
  In a kernel (iota, no constant arrays)."""
  m = lax.broadcasted_iota(jnp.int32, (n,), 0) // 16 % (16 // bits)  # the slab's plane in its word
  low = 10 // bits  # `hi_shift`: planes from here on are read from w >> (bits low)
  e = 24 - bits * jnp.where(m < low, m, m - low) - DENORM_LOG2
  return lax.bitcast_convert_type(lax.shift_left(e + 127, 23), jnp.float32), 2.0 ** -DENORM_LOG2


def zero_over_scale(z, s):
  """z / s in fp16, 0 where s is 0 (slots never written: 0 / 0 would reach the MMA as NaN x 0)."""
  z, s = z.astype(jnp.float32), s.astype(jnp.float32)
  return jnp.where(s == 0.0, 0.0, z / jnp.where(s == 0.0, 1.0, s)).astype(jnp.float16)
