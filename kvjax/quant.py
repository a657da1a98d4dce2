"""Pure quantize / dequantize transforms over a quantized-array pytree.

`QArray` holds integer or FP8 `codes`, a `scale` and (KIVI) a `zero` (the
group minimum) as array leaves and the `QuantSpec` as static metadata, like
qwix's QArray. Arrays are ``[..., S, H]`` (tokens, channels).

Scale computation is separate from quantization (`compute_scale`), so static
scales from calibration and dynamic per-token scales share one code path.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
from flax import struct
from jaxtyping import Array, Float

from kvjax import packing
from kvjax.formats import FP8_DTYPES, FP8Spec, IntSpec, KIVISpec, Passthrough, QuantSpec

__all__ = ["QArray", "quantize", "dequantize", "compute_scale", "round_up", "round_down", "step_for",
           "div_round", "tile_tokens", "untile_tokens", "words_supported", "words_layout", "unwords_layout", "WORDS_TILE"]


@struct.dataclass
class QArray:
  """A quantized ``[..., S, H]`` array.

  Attributes:
    codes: FP8 / int8 codes ``[..., S, H]``; uint8 planar-packed sub-byte codes
      ``[..., S // n, H]`` (KIVI keys, packed along tokens) or ``[..., S, H // n]``
      (values and INT4, packed along channels); bf16 for `Passthrough`.
    scale: multiplier; broadcastable to the logical shape, or per KIVI group
      (``[..., S // G, H]`` keys, ``[..., S, H // G]`` values). None for passthrough.
    zero: KIVI group minimum, same shape as `scale`; None otherwise.
    spec: the static `QuantSpec`.
    block: static planar packing block along the packed axis.
    tile: static token tile of the codes' layout (8-bit per-token codes only). 0: token-major
      (``codes[..., t, :]`` holds token t). T > 0: channel-major within tiles of T tokens: the
      bytes of ``codes[..., i*T:(i+1)*T, :]`` are the ``[H, T]`` transpose of those tokens' codes
      (`tile_tokens`), so a decode kernel's p.v operand has adjacent token pairs. The array shape
      stays ``[..., S, H]``; `unpacked_codes` / `dequantize` undo the transpose.
    layout: static code layout of KIVI-2 / KIVI-4 with H = 128, G = 128 or 32. "" (planar,
      `kvjax.packing.pack`) or "words": uint16 ``[..., S, 16]`` (4-bit: ``[..., S, 32]``) as the Mosaic
      GPU kernel reads them (`packing.pack_words`: 8 (4) codes a word, packed across the group axis).
      Keys (``axis="token"``): row t is token t, its 128 channels in 16 (32) words. Values
      (``axis="channel"``): each 128-token tile stored transposed, row ``128 i + h`` holding channel h
      of tile i's 128 tokens in 16 (32) words (`words_layout` / `unwords_layout`).
  """

  codes: Array
  scale: Array | None
  zero: Array | None
  spec: Any = struct.field(pytree_node=False)
  block: int = struct.field(pytree_node=False, default=0)
  tile: int = struct.field(pytree_node=False, default=0)
  layout: str = struct.field(pytree_node=False, default="")

  @property
  def packed_axis(self) -> int | None:
    if self.layout == "words":
      return self.codes.ndim - 1
    bits = getattr(self.spec, "bits", 8)
    if bits >= 8:
      return None
    if isinstance(self.spec, KIVISpec) and self.spec.axis == "token":
      return self.codes.ndim - 2
    return self.codes.ndim - 1

  @property
  def shape(self) -> tuple[int, ...]:
    """Logical (unpacked) shape."""
    shape = list(self.codes.shape)
    if self.layout == "words":
      shape[-1] *= packing.word_planes(self.spec.bits)
    elif self.packed_axis is not None:
      shape[self.packed_axis] *= packing.codes_per_byte(self.spec.bits)
    return tuple(shape)

  @property
  def ndim(self) -> int:
    return self.codes.ndim

  def dequantize(self, dtype=jnp.float32) -> Array:
    return dequantize(self, dtype)


def _finfo_tiny(dtype) -> float:
  return float(jnp.finfo(dtype).tiny)


def round_up(x: Array, dtype) -> Array:
  """Rounds positive f32 `x` to `dtype`, never down, never to zero."""
  r = x.astype(dtype)
  r = jnp.where(r.astype(jnp.float32) < x, jnp.nextafter(r, jnp.array(jnp.inf, dtype)), r)
  return jnp.maximum(r, jnp.array(_finfo_tiny(dtype), dtype))


def round_down(x: Array, dtype) -> Array:
  """Rounds f32 `x` to `dtype`, never up."""
  r = x.astype(dtype)
  return jnp.where(r.astype(jnp.float32) > x, jnp.nextafter(r, jnp.array(-jnp.inf, dtype)), r)


def step_for(span: Array, qmax: int, dtype) -> Array:
  """The smallest `dtype` value s (>= tiny) with ``s * qmax >= span``, for ``span >= 0``.

  Defined by exact comparisons (``s * qmax`` is exact in f32 for 16-bit s and
  qmax < 2^8), so it does not depend on how a backend rounds division: XLA
  on CPU divides with up to 1 ulp of error.
  """
  s = round_up(span / qmax, dtype)
  down = jnp.nextafter(s, jnp.array(-jnp.inf, dtype))
  s = jnp.where((down > 0) & (down.astype(jnp.float32) * qmax >= span), down, s)
  s = jnp.where(s.astype(jnp.float32) * qmax < span, jnp.nextafter(s, jnp.array(jnp.inf, dtype)), s)
  return jnp.maximum(s, jnp.array(_finfo_tiny(dtype), dtype))


def div_round(t: Array, s: Array) -> Array:
  """``round_half_even(t / s)`` for f32 `t` and 16-bit-valued `s`, exact.

  One division, then a correction by exact remainders (``c * s`` is exact for
  the small integers c of 8-bit-or-narrower codes).
  """
  c = jnp.round(t / s)
  r = t - c * s
  half = s * 0.5
  c = jnp.where(r > half, c + 1, jnp.where(r < -half, c - 1, c))
  r = t - c * s
  odd = jnp.mod(c, 2) != 0
  c = jnp.where((r == half) & odd, c + 1, c)
  c = jnp.where((r == -half) & odd, c - 1, c)
  return c


def fp8_div(x: Array, s: Array, spec: FP8Spec) -> Array:
  """``clip(x / s, -max, max)`` rounded to `spec`'s FP8 dtype (to nearest, ties to even), exact for
  a positive 16-bit-valued `s` (the dynamic scales): one division, then one correction step by
  exact comparisons with the midpoints to the neighbouring codes (a midpoint has <= 5 significant
  bits, so ``mid * s`` is exact in f32). So it does not depend on how a backend rounds division:
  XLA on CPU divides with up to 1 ulp of error, Triton's f32 division is approximate. Only
  comparisons, selects, converts and 8/32-bit bit patterns: the GPU writer runs it in-kernel."""
  f8, f32 = FP8_DTYPES[spec.dtype], jnp.float32
  a = jnp.abs(x)
  c = jnp.minimum(a / s, spec.max).astype(f8)  # within one code of the exact rounding
  u = lax.bitcast_convert_type(c, jnp.uint8)  # non-negative codes are ordered as their bits
  cf = c.astype(f32)
  lo = lax.bitcast_convert_type(jnp.maximum(u, jnp.uint8(1)) - jnp.uint8(1), f8).astype(f32)
  hi = lax.bitcast_convert_type(jnp.minimum(u + jnp.uint8(1), jnp.uint8(0x7F)), f8).astype(f32)
  m_lo, m_hi = (lo + cf) * 0.5 * s, (cf + hi) * 0.5 * s
  odd = (u & jnp.uint8(1)) != 0  # neighbours differ in the last bit: the even one of a tie
  down = (u > 0) & ((a < m_lo) | ((a == m_lo) & odd))
  up = (cf < spec.max) & ((a > m_hi) | ((a == m_hi) & odd))
  u = jnp.where(down, u - jnp.uint8(1), jnp.where(up, u + jnp.uint8(1), u))
  sign = (lax.bitcast_convert_type(x.astype(f32), jnp.uint32) >> 31).astype(jnp.uint8) << 7
  return lax.bitcast_convert_type(u | sign, f8)


def exact_rounding(spec: QuantSpec) -> bool:
  """Whether `quantize` rounds `spec`'s codes exactly whatever the backend's division does: per-token
  FP8 and integer specs with 16-bit scales (`fp8_div`, `div_round`); f32 or static FP8 scales divide."""
  if isinstance(spec, FP8Spec) and spec.static:
    return False
  return isinstance(spec, (FP8Spec, IntSpec, KIVISpec)) and jnp.dtype(spec.scale_dtype).itemsize == 2


def compute_scale(x: Float[Array, "... S H"], spec: QuantSpec) -> tuple[Array | None, Array | None]:
  """Dynamic scale (and zero) of `x` for `spec`, as stored (rounded to its scale_dtype).

  Returns ``(scale, zero)``. Static FP8 granularities have no dynamic scale:
  pass calibrated scales to `quantize` instead.
  """
  x = x.astype(jnp.float32)
  if isinstance(spec, Passthrough):
    return None, None
  sd = jnp.dtype(spec.scale_dtype)
  if isinstance(spec, FP8Spec):
    if spec.static:
      raise ValueError(f"FP8 granularity {spec.granularity!r} uses static scales: pass `scale=` "
                       "(from kvjax.calibrate) instead of computing it per call")
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    return step_for(jnp.where(amax > 0, amax, spec.max), spec.max, sd), None
  if isinstance(spec, IntSpec):
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    return step_for(jnp.where(amax > 0, amax, spec.qmax), spec.qmax, sd), None
  if isinstance(spec, KIVISpec):
    g = spec.group_size
    if spec.axis == "token":
      if x.shape[-2] % g:
        raise ValueError(f"token count ({x.shape[-2]}) must be a multiple of group_size ({g}) "
                         "to quantize keys per channel")
      grouped = x.reshape(x.shape[:-2] + (x.shape[-2] // g, g, x.shape[-1]))
      red = -2
    else:
      if x.shape[-1] % g:
        raise ValueError(f"group_size ({g}) must divide head_dim ({x.shape[-1]})")
      grouped = x.reshape(x.shape[:-1] + (x.shape[-1] // g, g))
      red = -1
    mn = round_down(jnp.min(grouped, axis=red), sd)
    mx = jnp.max(grouped, axis=red)
    span = mx - mn.astype(jnp.float32)
    # A constant group (max == stored min) gets a unit scale: codes are 0, no 0/0.
    scale = jnp.where(span > 0, step_for(span, spec.qmax, sd), jnp.ones_like(span, sd))
    return scale, mn
  raise TypeError(f"spec must be a QuantSpec, got {type(spec).__name__}")


def _expand_groups(a: Array, spec: KIVISpec) -> Array:
  """Repeats per-group scale / zero back to one entry per element."""
  axis = -2 if spec.axis == "token" else -1
  return jnp.repeat(a.astype(jnp.float32), spec.group_size, axis=axis)


def quantize(x: Float[Array, "... S H"], spec: QuantSpec, *, scale: Array | None = None,
             block: int | None = None, layout: str = "") -> QArray:
  """Quantizes `x` according to `spec`.

  Args:
    x: activations ``[..., S, H]``.
    spec: how to quantize.
    scale: static FP8 scale broadcastable to `x` (per tensor, head or channel);
      required for static FP8 granularities, ignored otherwise.
    block: planar packing block along the packed axis (default: the whole axis).
      The cache packs keys in blocks of R tokens.
    layout: "" (planar) or "words" (KIVI-2, G = 128 or 32, H = 128, S a multiple of 128; `QArray.layout`).

  Returns:
    A `QArray` whose `dequantize` approximates `x`.
  """
  if x.ndim < 2:
    raise ValueError(f"x must have rank >= 2 ([..., S, H]), got shape {x.shape}")
  if layout not in ("", "words") or layout and not isinstance(spec, KIVISpec):
    raise ValueError(f"layout must be '' or 'words' (KIVI only), got {layout!r} for {spec}")
  if isinstance(spec, Passthrough):
    return QArray(codes=x.astype(spec.dtype), scale=None, zero=None, spec=spec, block=0)
  xf = x.astype(jnp.float32)
  if isinstance(spec, FP8Spec):
    if spec.static:
      if scale is None:
        raise ValueError(f"FP8 granularity {spec.granularity!r} needs a static `scale` (e.g. from "
                         "kvjax.calibrate); got None")
      s = jnp.asarray(scale, jnp.float32)
    else:
      s, _ = compute_scale(xf, spec)
    if not exact_rounding(spec):  # static or f32 scales: divide
      q = jnp.clip(xf / s.astype(jnp.float32), -spec.max, spec.max).astype(FP8_DTYPES[spec.dtype])
    else:
      q = fp8_div(xf, s.astype(jnp.float32), spec)
    stored = s if not spec.static else jnp.asarray(scale)
    return QArray(codes=q, scale=stored, zero=None, spec=spec, block=0)
  s, zero = compute_scale(xf, spec)
  if isinstance(spec, IntSpec):
    codes = jnp.clip(div_round(xf, s.astype(jnp.float32)), -spec.qmax, spec.qmax)
    if spec.bits == 8:
      return QArray(codes=codes.astype(jnp.int8), scale=s, zero=None, spec=spec, block=0)
    blk = block or x.shape[-1]
    biased = (codes + 8).astype(jnp.uint8)
    return QArray(codes=packing.pack(biased, 4, axis=-1, block=blk), scale=s, zero=None,
                  spec=spec, block=blk)
  assert isinstance(spec, KIVISpec)
  sf = _expand_groups(s, spec)
  zf = _expand_groups(zero, spec)
  codes = jnp.clip(div_round(xf - zf, sf), 0, spec.qmax).astype(jnp.uint8)
  if layout == "words":
    if (why := words_supported(spec, x.shape[-1], x.shape[-2])) is not None:
      raise ValueError(f"layout='words' {why} (x shape {x.shape})")
    return QArray(codes=words_layout(codes, spec), scale=s, zero=zero, spec=spec, layout="words")
  axis = -2 if spec.axis == "token" else -1
  blk = block or x.shape[axis]
  return QArray(codes=packing.pack(codes, spec.bits, axis=axis, block=blk), scale=s, zero=zero,
                spec=spec, block=blk)


def _check_tile(x: Array, tile: int) -> None:
  if x.ndim < 2 or tile < 1 or x.shape[-2] % tile:
    raise ValueError(f"tile ({tile}) must be a positive divisor of the token axis of [..., S, H], "
                     f"got shape {x.shape}")


def tile_tokens(x: Float[Array, "... S H"], tile: int) -> Array:
  """``[..., S, H]`` token-major -> the same shape holding each T-token tile's ``[H, T]`` transpose."""
  _check_tile(x, tile)
  *lead, s, h = x.shape
  t = jnp.swapaxes(x.reshape(*lead, s // tile, tile, h), -1, -2)
  return t.reshape(x.shape)


def untile_tokens(x: Array, tile: int) -> Array:
  """Inverse of `tile_tokens`."""
  _check_tile(x, tile)
  *lead, s, h = x.shape
  return jnp.swapaxes(x.reshape(*lead, s // tile, h, tile), -1, -2).reshape(x.shape)


WORDS_TILE = packing.WORD_BLOCK  # tokens per transposed value tile of the "words" layout (= H)
WORDS_GROUPS = (WORDS_TILE, 32)  # the group sizes it takes (the codes do not depend on G)
WORDS_BITS = (2, 4)  # the code widths it takes (`packing.pack_words`)


def words_supported(spec: QuantSpec, head_dim: int, capacity: int) -> str | None:
  """None when `spec` codes of a ``[.., capacity, head_dim]`` array can take the "words" layout, else why."""
  if not (isinstance(spec, KIVISpec) and spec.bits in WORDS_BITS and spec.group_size in WORDS_GROUPS):
    return f"needs KIVI with bits in {WORDS_BITS} and group_size in {WORDS_GROUPS}, got {spec}"
  if head_dim % WORDS_TILE:
    return f"needs a head_dim that is a multiple of {WORDS_TILE}, got {head_dim}"
  if capacity % WORDS_TILE:
    return f"needs a capacity that is a multiple of {WORDS_TILE}, got {capacity}"
  return None


def words_layout(codes: Array, spec: KIVISpec) -> Array:
  """Unpacked KIVI codes ``[..., S, H]`` -> the "words" layout ``[..., S, H bits / 16]`` uint16 (`QArray.layout`; values:
  each 128-token tile's ``[H, 128]`` transpose, so the leaf viewed ``[..., S / 128, H, 128 bits / 16]``)."""
  if spec.axis == "channel":  # values: 128-token tiles transposed, words along the tile's tokens
    codes = tile_tokens(codes, WORDS_TILE)
  return packing.pack_words(codes, spec.bits)


def unwords_layout(words: Array, spec: KIVISpec) -> Array:
  """Inverse of `words_layout`: codes ``[..., S, H]`` uint8."""
  codes = packing.unpack_words(words, spec.bits)
  return untile_tokens(codes, WORDS_TILE) if spec.axis == "channel" else codes


def unpacked_codes(q: QArray) -> Array:
  """Integer codes with the packing (and any token tiling) undone (int4 bias removed)."""
  if q.layout == "words":
    return unwords_layout(q.codes, q.spec)
  if q.tile:
    return untile_tokens(q.codes, q.tile)
  spec = q.spec
  if isinstance(spec, IntSpec) and spec.bits == 4:
    return packing.unpack(q.codes, 4, axis=-1, block=q.block).astype(jnp.int32) - 8
  if isinstance(spec, KIVISpec):
    axis = -2 if spec.axis == "token" else -1
    return packing.unpack(q.codes, spec.bits, axis=axis, block=q.block)
  return q.codes


def dequantize(q: QArray, dtype=jnp.float32) -> Array:
  """Reconstructs ``[..., S, H]`` values from a `QArray`."""
  spec = q.spec
  if isinstance(spec, Passthrough):
    return q.codes.astype(dtype)
  codes = unpacked_codes(q).astype(jnp.float32)
  if isinstance(spec, KIVISpec):
    out = codes * _expand_groups(q.scale, spec) + _expand_groups(q.zero, spec)
  else:
    out = codes * jnp.asarray(q.scale, jnp.float32)
  return out.astype(dtype)


def nbytes(tree) -> int:
  """Total bytes of the array leaves of `tree` (shapes only; works on ShapeDtypeStructs)."""
  return int(sum(np.prod(l.shape, dtype=np.int64) * jnp.dtype(l.dtype).itemsize
                 for l in jax.tree_util.tree_leaves(tree)))
