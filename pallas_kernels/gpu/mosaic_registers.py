"""Register-level conversions of 8-bit WGMMA A operands for the Mosaic FP8 / INT8 decode kernel (`mosaic_fp8`):
`as_wgmma` renames the registers of a key slab loaded in WGMMA's 8-bit layout as the 16-bit A layout
(`Fp8Options.key_perm`), `int8_as_f16` converts int8 codes to fp16 with three PTX instructions a pair
(`Fp8Options.int8_prmt`). Both are `plgpu.inline_mgpu` bodies: native only (the interpreter takes the same
arithmetic by `astype`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["SLAB", "KEY_PERM", "INT8_PRMT", "as_wgmma", "int8_as_f16"]

SLAB = 16  # k columns per WGMMA (fp16)
# key_perm: the 16-bit A layout holds columns (2c, 2c + 1) and (2c + 8, 2c + 9) of a 16-column slab in thread c
# of a row quad; the 8-bit layout's 32-bit register holds bytes 4c .. 4c + 3. Taking the second as the first,
# slab column j is byte KEY_PERM[j] of the slab.
KEY_PERM = tuple(4 * (j % 8 // 2) + j % 2 + 2 * (j // 8) for j in range(SLAB))
# `int8_as_f16`: prmt's byte selectors for code pairs 0 and 1 of a 32-bit word (bytes 4-7: the exponent bytes), the
# exponent bytes (fp16 0x64.. = 1024 + the low byte), the sign flips (c + 128) and the bias taken off (fp16 1152).
INT8_PRMT = dict(selectors=(0x4140, 0x4342), exponent=0x64646464, flip=0x00800080, bias=0x64806480)


def int8_as_f16(x, layout):
  """int8 [rows, 16] registers (any 8-bit layout) -> fp16, exactly, without one I2F per code (Mosaic's `astype`):
  per pair of codes one prmt puts each byte under an fp16 exponent byte 0x64, one xor flips the bytes' sign bits
  (c + 128 as unsigned) and one sub.f16x2 takes 1152 off (fp16 1024 + c + 128 - 1152 = c: integers below 2048
  are exact in fp16)."""
  from jax.experimental.mosaic.gpu import FragmentedArray, utils  # noqa: PLC0415 (kernel only)
  from jaxlib.mlir import ir  # noqa: PLC0415
  from jaxlib.mlir.dialects import arith, llvm  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(layout,), return_type=plgpu.ShapeDtypeStruct(x.shape, jnp.float16, layout=layout))
  def convert(ctx, a):
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    f16x2 = ir.VectorType.get((2,), ir.F16Type.get())
    regs = np.empty(a.registers.shape, dtype=object)
    for idx, r in np.ndenumerate(a.registers):
      n = ir.VectorType(r.type).shape[0]  # codes a register: 2 (16-bit layouts) or 4 (8-bit)
      word = utils.bitcast(r, ir.IntegerType.get_signless(8 * n))
      word = word if n == 4 else arith.extui(i32, word)
      c = INT8_PRMT
      ptx = [f"{{ .reg .b32 t, k; prmt.b32 t, $1, {c['exponent']:#x}, {sel:#x}; xor.b32 t, t, {c['flip']:#x}; "
             f"mov.b32 k, {c['bias']:#x}; sub.rn.f16x2 $0, t, k; }}" for sel in c["selectors"][:n // 2]]
      pairs = [utils.bitcast(llvm.inline_asm(i32, [word], text, "=r,r"), f16x2) for text in ptx]
      regs[idx] = pairs[0] if n == 2 else utils.vector_concat(pairs)
    return FragmentedArray(_registers=regs, _layout=a.layout, _is_signed=None)
  return convert(x)


def as_wgmma(x):
  """fp16 [rows, 16] in WGMMA's 8-bit layout (4 columns a register) -> the same registers in WGMMA's 16-bit A
  layout (2 a register: a register's first pair as the slab's column tile 0, its second as tile 1), so
  column j of the result is column KEY_PERM[j] of x. Registers are renamed, nothing moves."""
  from jax.experimental.mosaic.gpu import WGMMA_LAYOUT, FragmentedArray, utils  # noqa: PLC0415 (kernel only)

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA_8BIT,),
                     return_type=plgpu.ShapeDtypeStruct(x.shape, jnp.float16, layout=plgpu.Layout.WGMMA))
  def rename(ctx, a):
    del ctx
    regs = np.empty(WGMMA_LAYOUT.registers_shape(a.shape), dtype=object)
    for idx, r in np.ndenumerate(a.registers):
      for i in range(2):
        regs[(idx[0], 2 * idx[1] + i, *idx[2:])] = utils.vector_slice(r, slice(2 * i, 2 * i + 2))
    assert all(r is not None for r in regs.flat)
    return FragmentedArray(_registers=regs, _layout=WGMMA_LAYOUT, _is_signed=None)
  return rename(x)
