"""Planar packing of 2- and 4-bit codes into bytes.

Along the packed axis, elements come in blocks of `block` elements. With
``n = 8 // bits`` codes per byte, a block occupies ``block // n`` bytes and
byte ``j`` of the block holds elements ``j + i * (block // n)`` for ``i`` in
``[0, n)``, the i-th at bits ``[i * bits, (i + 1) * bits)``.

Unpacking is therefore one shift and one mask per slice, and slice ``i`` of
a block is the contiguous range ``[i * block // n, (i + 1) * block // n)``:
kernels never interleave inside registers (DESIGN.md section 5).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, UInt8

__all__ = ["pack", "unpack", "codes_per_byte", "pack_words", "unpack_words", "WORD_BLOCK", "word_planes", "word_block"]


def codes_per_byte(bits: int) -> int:
  if bits not in (2, 4, 8):
    raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
  return 8 // bits


def _check(length: int, bits: int, block: int, what: str) -> int:
  n = codes_per_byte(bits)
  if block % n:
    raise ValueError(f"block ({block}) must be a multiple of {n} to pack {bits}-bit codes")
  if length % block:
    raise ValueError(f"{what} length ({length}) must be a multiple of block ({block})")
  return n


def pack(codes: UInt8[Array, "..."], bits: int, axis: int, block: int) -> UInt8[Array, "..."]:
  """Packs unsigned codes (< 2**bits) planar along `axis`; that axis shrinks 8/bits times."""
  axis = axis % codes.ndim
  length = codes.shape[axis]
  n = _check(length, bits, block, "packed axis")
  if n == 1:
    return codes.astype(jnp.uint8)
  shape = codes.shape
  x = codes.astype(jnp.uint8).reshape(shape[:axis] + (length // block, n, block // n) + shape[axis + 1:])
  out = jnp.zeros(shape[:axis] + (length // block, block // n) + shape[axis + 1:], jnp.uint8)
  for i in range(n):
    out = out | (jnp.take(x, i, axis=axis + 1) << (i * bits)).astype(jnp.uint8)
  return out.reshape(shape[:axis] + (length // n,) + shape[axis + 1:])


def unpack(packed: UInt8[Array, "..."], bits: int, axis: int, block: int) -> UInt8[Array, "..."]:
  """Inverse of `pack`: the packed axis grows 8/bits times."""
  axis = axis % packed.ndim
  n = codes_per_byte(bits)
  length = packed.shape[axis] * n
  _check(length, bits, block, "unpacked axis")
  if n == 1:
    return packed
  shape = packed.shape
  x = packed.reshape(shape[:axis] + (length // block, 1, block // n) + shape[axis + 1:])
  shifts = (jnp.arange(n, dtype=jnp.uint8) * bits).reshape((n, 1) + (1,) * (len(shape) - axis - 1))
  mask = jnp.uint8(2 ** bits - 1)
  out = (x >> shifts) & mask
  return out.reshape(shape[:axis] + (length,) + shape[axis + 1:])


# The uint16 word layout of 2-bit (and 4-bit) codes that the Mosaic GPU KIVI kernel reads
# (`pallas_kernels.gpu.mosaic_kivi`; `QArray.layout == "words"`): each run of
# WORD_BLOCK = 128 2-bit codes becomes 16 uint16 words, word j holding codes
# ``j + 16 m`` (m = 0..7) at bits ``[2 m, 2 m + 2)``. Plane m of a word tile is
# then one contiguous 16-wide slab of the contraction axis. 4-bit codes: runs of
# 64 (`word_block(4)`), word j holding codes j + 16 m (m = 0..3) at bits [4 m, 4 m + 4).
WORD_BLOCK = 128
WORD_PLANES = 8


def word_planes(bits: int = 2) -> int:
  """Codes per uint16 word (planes of a word tile): 8 for 2-bit, 4 for 4-bit."""
  if bits not in (2, 4):
    raise ValueError(f"the words layout holds 2- or 4-bit codes, got bits={bits}")
  return 16 // bits


def word_block(bits: int = 2) -> int:
  """Codes per run of 16 words: 128 for 2-bit, 64 for 4-bit."""
  return 16 * word_planes(bits)


def pack_words(codes: UInt8[Array, "... n"], bits: int = 2) -> Array:
  """`bits`-bit codes ``[..., n]`` (n a multiple of `word_block(bits)`) -> uint16 words
  ``[..., n bits / 16]`` (see `WORD_BLOCK`)."""
  n, planes, block = codes.shape[-1], word_planes(bits), word_block(bits)
  if n % block:
    raise ValueError(f"pack_words: the last axis ({n}) must be a multiple of {block}")
  x = codes.astype(jnp.uint16).reshape(codes.shape[:-1] + (n // block, planes, 16))
  out = x[..., 0, :]
  for m in range(1, planes):
    out = out | (x[..., m, :] << (bits * m))
  return out.reshape(codes.shape[:-1] + (n // planes,))


def unpack_words(words: Array, bits: int = 2) -> UInt8[Array, "..."]:
  """Inverse of `pack_words`: uint16 ``[..., 16 w]`` -> codes ``[..., 16 w x 16 / bits]`` uint8."""
  n, planes = words.shape[-1], word_planes(bits)
  if n % 16:
    raise ValueError(f"unpack_words: the last axis ({n}) must be a multiple of 16")
  x = words.reshape(words.shape[:-1] + (n // 16, 1, 16))
  shifts = (jnp.arange(planes, dtype=jnp.uint16) * bits).reshape(planes, 1)
  out = (x >> shifts) & jnp.uint16(2 ** bits - 1)
  return out.reshape(words.shape[:-1] + (n * planes,)).astype(jnp.uint8)
