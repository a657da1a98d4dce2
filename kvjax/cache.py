"""The quantized KV cache: a head-major pytree updated functionally.

Layout (one layer; a stacked cache adds a leading layer axis to every leaf):
  k, v       `QArray`s of logical shape ``[B, K, S, H]`` (S = capacity).
  k_res      KIVI only, ``[B, K, R, H]``: full-precision keys not yet
             quantized. With ``L`` tokens cached, ``r = L % R`` and
             ``Lq = L - r``: slot ``i < r`` holds token ``Lq + i``; other
             slots are zero.
  v_res      KIVI only, ``[B, K, R, H]``: ring of the last R values; token
             ``t`` in ``[L - R, L)`` sits in slot ``t % R``.
  lengths    ``[B]`` int32 tokens cached per sequence (ragged).
  k_sink, v_sink  ``[B, K, sink, H]`` full-precision copies of the first
             `fmt.sink` tokens (None when the format keeps no sink tokens).

KIVI keys are quantized R tokens at a time (when the residual fills), in R/G
groups per channel; key codes are packed planar along tokens in blocks of R.
Values get their per-token codes as soon as they arrive (per-token
quantization of a token does not depend on when it happens), and the ring
keeps the last R in full precision: eviction is free. Because ``Lq % R == 0``
both residuals line up with ``t % R``, so ``materialize`` tiles them.

Value-code layout: FP8 / INT8 value codes may be stored channel-major within
tiles of T tokens (``QArray.tile``; `init_cache`'s ``value_tile``, default
`default_value_tile`: 64 on GPU). The array keeps its ``[B, K, S, H]`` shape;
each tile's bytes are its ``[H, T]`` transpose, which the GPU decode kernel
reads faster (adjacent token pairs for p.v). Appends store a token's H codes
at stride T (`RowWrite.tile`); `materialize` undoes the transpose.

KIVI code layout: with H = 128, G = 128 or 32 (R a multiple of 128), KIVI-2 / KIVI-4 codes may be
stored as the Mosaic GPU kernel reads them (``QArray.layout == "words"``;
`init_cache`'s ``kivi_layout``; `default_kivi_layout` picks "words" on GPU
where that kernel is the default: KIVI-2, R = 128 and no sink tokens): uint16 words ``[B, K, S, 16]`` holding 8 codes each (word j of a
128-code row: elements j + 16 m at bits 2 m, `packing.pack_words`; 4-bit: ``[B, K, S, 32]``, 4 a word); key rows
are tokens (words along channels), value rows are 128-token tiles transposed
(row 128 i + h is channel h of tile i, words along its tokens). Appends write
a value's codes into its tile's bit planes (`rows._scatter_planes`) and a
flushed key block as whole rows; `quant.unpacked_codes` and `materialize`
read both layouts alike.

Capacity: appending beyond S is an error when lengths are concrete; under jit
(where Python cannot raise) tokens beyond capacity are dropped, lengths stop
at S and stored tokens are never overwritten. `append(..., checked=True)`
adds a `checkify` check instead, for `checkify.checkify`-wrapped callers.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import checkify
from jaxtyping import Array, Float, Int

from kvjax import packing, quant
from kvjax.formats import FP8Spec, IntSpec, KIVISpec, KVFormat, QuantSpec
from kvjax.quant import QArray
from kvjax.rows import (KeyFlush, QuantRows, RowWrite, per_token_writes, flush_rows,  # noqa: F401
                        get_leaf, lower_flushes, lower_quants, scatter_writes, set_leaves, writer_quantizes)

__all__ = ["KVCache", "RowWrite", "KeyFlush", "QuantRows", "init_cache", "append", "scatter_writes", "flush_rows", "prefill",
           "materialize", "stack", "unstack", "static_scale_shape", "default_value_tile", "with_value_tile",
           "default_kivi_layout", "with_kivi_layout",
           "VALUE_TILE"]

# Tokens per tile of the tiled value layout `init_cache` picks on GPU: the Pallas decode kernel's
# block (pallas_kernels.gpu.ops.QUANT_BLOCK). H200, B=8, 32k, Llama-3-8B heads, same run (session 8,
# benchmarks/results/decode_parts/decode_s8_b8.json): fp8 e4m3 171.1 -> 147.8 us, int8 180.7 -> 172.1
# against token-major codes; Gemma-2-2B heads (decode_gemma_s8.json) fp8 543 -> 426 us.
VALUE_TILE = 64


@struct.dataclass
class KVCache:
  """Quantized KV cache of one layer (or a stack of layers, leading axis)."""

  k: QArray
  v: QArray
  k_res: Array | None
  v_res: Array | None
  lengths: Array
  fmt: KVFormat = struct.field(pytree_node=False)
  k_sink: Array | None = None
  v_sink: Array | None = None

  @property
  def batch(self) -> int:
    return self.lengths.shape[-1]

  @property
  def num_kv_heads(self) -> int:
    return self.k.shape[-3]

  @property
  def capacity(self) -> int:
    return self.k.shape[-2]

  @property
  def head_dim(self) -> int:
    return self.k.shape[-1]

  @property
  def num_layers(self) -> int | None:
    """Number of stacked layers, or None for a single-layer cache."""
    return self.lengths.shape[0] if self.lengths.ndim == 2 else None

  @property
  def nbytes(self) -> int:
    """Bytes of every array in the cache: codes, scales, residuals, lengths."""
    return quant.nbytes(self)

  def layer(self, i: int) -> "KVCache":
    if self.num_layers is None:
      raise ValueError("layer() needs a stacked cache (lengths of rank 2); this cache has one layer")
    return jax.tree_util.tree_map(lambda a: a[i], self)

  def append(self, k, v, num_new=None, *, checked: bool = False) -> "KVCache":
    return append(self, k, v, num_new, checked=checked)

  def materialize(self, dtype=jnp.float32):
    return materialize(self, dtype)


def static_scale_shape(spec: QuantSpec, num_kv_heads: int, head_dim: int) -> tuple[int, ...] | None:
  """Shape of a static FP8 scale inside the cache (broadcasts against [B, K, S, H])."""
  if not (isinstance(spec, FP8Spec) and spec.static):
    return None
  return {"tensor": (1, 1, 1, 1), "head": (1, num_kv_heads, 1, 1),
          "channel": (1, num_kv_heads, 1, head_dim)}[spec.granularity]


def _tileable(spec: QuantSpec) -> bool:
  """Values whose codes are one byte per element and per-token or static scaled: FP8, INT8."""
  return isinstance(spec, FP8Spec) or (isinstance(spec, IntSpec) and spec.bits == 8)


def default_value_tile(fmt: KVFormat, capacity: int, backend: str | None = None) -> int:
  """The value layout `init_cache` picks: `VALUE_TILE`-token tiles for FP8 / INT8 values on GPU
  (whose kernel reads them faster) when `capacity` is a multiple of it; else 0 (token-major:
  what the TPU kernel and other backends read). `backend`: default `jax.default_backend()`."""
  backend = jax.default_backend() if backend is None else backend
  if backend == "gpu" and _tileable(fmt.value) and capacity % VALUE_TILE == 0:
    return VALUE_TILE
  return 0


def _check_value_tile(fmt: KVFormat, capacity: int, tile) -> None:
  if not isinstance(tile, (int, np.integer)) or tile < 0:
    raise ValueError(f"value_tile must be a non-negative int (0: token-major), got {tile!r}")
  if tile and not _tileable(fmt.value):
    raise ValueError(f"value_tile={tile} needs FP8 or INT8 values (one byte per code); format "
                     f"{fmt.name!r} stores values as {fmt.value}")
  if tile and capacity % tile:
    raise ValueError(f"value_tile ({tile}) must divide the capacity ({capacity})")


def with_value_tile(cache: "KVCache", tile: int) -> "KVCache":
  """`cache` with its value codes re-laid out in tiles of `tile` tokens (0: token-major); same
  attention. For caches saved in one layout and read by a kernel that wants another."""
  _check_value_tile(cache.fmt, cache.capacity, tile)
  v = cache.v
  if v.tile == tile:
    return cache
  codes = quant.untile_tokens(v.codes, v.tile) if v.tile else v.codes
  codes = quant.tile_tokens(codes, tile) if tile else codes
  return cache.replace(v=v.replace(codes=codes, tile=int(tile)))


def with_kivi_layout(cache: "KVCache", layout: str) -> "KVCache":
  """`cache` with its KIVI codes re-laid out: "" planar or "words" (`QArray.layout`); same tokens, same
  attention (a pass over the codes). For caches saved in one layout and read by a kernel that wants
  another."""
  _check_kivi_layout(cache.fmt, cache.capacity, cache.head_dim, layout)
  if not layout and not cache.fmt.is_kivi:
    raise ValueError(f"with_kivi_layout: format {cache.fmt.name!r} is not KIVI")

  def one(q: QArray, block: int) -> QArray:
    if q.layout == layout:
      return q
    codes = quant.unpacked_codes(q)  # [..., S, H]
    if layout == "words":
      return q.replace(codes=quant.words_layout(codes, q.spec), layout="words", block=0)
    axis = -2 if q.spec.axis == "token" else -1
    return q.replace(codes=packing.pack(codes, q.spec.bits, axis=axis, block=block), layout="", block=block)
  return cache.replace(k=one(cache.k, cache.fmt.residual), v=one(cache.v, cache.head_dim))


def _words_ok(fmt: KVFormat, capacity: int, head_dim: int) -> str | None:
  """None when `fmt`'s KIVI codes can take the "words" layout (`QArray.layout`), else why not."""
  if not fmt.is_kivi:
    return f"format {fmt.name!r} is not KIVI"
  for role, spec in (("keys", fmt.key), ("values", fmt.value)):
    if (why := quant.words_supported(spec, head_dim, capacity)) is not None:
      return f"{role}: {why}"
  if fmt.residual % quant.WORDS_TILE:
    return f"needs a residual length that is a multiple of {quant.WORDS_TILE}, got {fmt.residual}"
  return None


# The KIVI group sizes `default_kivi_layout` gives the "words" layout on GPU, so the Mosaic kernel: G=128, and
# since session 22 G=32 (`pallas_kernels.gpu.mosaic_groups`; H200, through ops against Triton's planar kernel
# in the same run: B=8 32k 130.0 against 352.0 us, B=64 32k 914.9 against 2727.6, B=1 32k 32.0 against 63.6;
# only B=1 at 1k / 4k is slower, 14.0 / 18.7 against 11.8 / 15.1: benchmarks/NOTES_gpu.md).
WORDS_DEFAULT_GROUPS = (quant.WORDS_TILE, 32)
# KIVI-4 too since session 23 (H100, through ops, Mosaic against Triton's planar kernel in the same run, us:
# B=8 32k 204.6 / 350.4, B=64 32k 1537.6 / 2719.3, B=1 32k 34.7 / 63.6, B=8 4k 39.8 / 60.8; only B=1 4k is
# slower, 19.9 / 16.1: `benchmarks/results/decode_parts/session23/d_decode_s22d_kivi4.json`).
WORDS_DEFAULT_BITS = (2, 4)
# Head_dim 256 (Gemma 2) since session 28 (`pallas_kernels.gpu.mosaic_kivi`: a 128-channel value accumulator a
# half). H100, Gemma-2-2B heads, Mosaic against Triton's planar kernel in the same run, us: B=8 32k KIVI-2 G=128
# 142.1 / 528.2, G=32 161.2 / 518.1, KIVI-4 182.4 / 586.9; only B=1 4k is slower, 22.8 / 18.5, 24.6 / 16.8,
# 26.7 / 17.2 (`benchmarks/results/decode_parts/session28/gemma_{h256,g32}.json`).
WORDS_WIDE_HEAD_DIMS = (256,)


def default_kivi_layout(fmt: KVFormat, capacity: int, head_dim: int, backend: str | None = None) -> str:
  """The KIVI code layout `init_cache` picks: "words" on GPU where the Mosaic KIVI kernel reads it
  (bits in WORDS_DEFAULT_BITS, G in WORDS_DEFAULT_GROUPS, R = 128, H = 128 or in WORDS_WIDE_HEAD_DIMS, no sink
  tokens;
  `pallas_kernels.gpu.mosaic_decode`), else "" (planar: what the Triton and TPU kernels read).
  `backend`: default `jax.default_backend()`."""
  backend = jax.default_backend() if backend is None else backend
  if (backend == "gpu" and _words_ok(fmt, capacity, head_dim) is None and fmt.residual == quant.WORDS_TILE
      and not fmt.sink and fmt.key.group_size in WORDS_DEFAULT_GROUPS and fmt.key.bits in WORDS_DEFAULT_BITS
      and (head_dim == quant.WORDS_TILE or head_dim in WORDS_WIDE_HEAD_DIMS)):
    return "words"
  return ""


def _check_kivi_layout(fmt: KVFormat, capacity: int, head_dim: int, layout) -> None:
  if layout not in ("", "words"):
    raise ValueError(f"kivi_layout must be '' (planar) or 'words', got {layout!r}")
  if layout and (why := _words_ok(fmt, capacity, head_dim)) is not None:
    raise ValueError(f"kivi_layout='words' {why}")


def _empty_qarray(spec: QuantSpec, batch: int, heads: int, capacity: int, head_dim: int,
                  static_scale: Array | None, block: int) -> QArray:
  """All-zero storage with the shapes `quant.quantize` produces."""
  x = jax.ShapeDtypeStruct((batch, heads, capacity, head_dim), jnp.bfloat16)
  if isinstance(spec, FP8Spec) and spec.static:
    shape = static_scale_shape(spec, heads, head_dim)
    scale = jnp.ones(shape, jnp.float32) if static_scale is None else jnp.asarray(static_scale, jnp.float32)
    if scale.shape != shape:
      raise ValueError(f"static scale for granularity {spec.granularity!r} must have shape {shape}, "
                       f"got {scale.shape}")
    codes = jax.eval_shape(lambda a: quant.quantize(a, spec, scale=scale).codes, x)
    return QArray(codes=jnp.zeros(codes.shape, codes.dtype), scale=scale, zero=None, spec=spec)
  shapes = jax.eval_shape(lambda a: quant.quantize(a, spec, block=block), x)
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def init_cache(fmt: KVFormat, batch: int, num_kv_heads: int, capacity: int, head_dim: int, *,
               scales: tuple[Array | None, Array | None] | None = None,
               num_layers: int | None = None, value_tile: int | None = None,
               kivi_layout: str | None = None) -> KVCache:
  """An empty cache.

  Args:
    fmt: storage format.
    batch, num_kv_heads, capacity, head_dim: B, K, S, H.
    scales: static FP8 ``(key_scale, value_scale)`` or a `KVScales` for this layer (or stacked
      with a leading layer axis when `num_layers` is set), shaped as
      `static_scale_shape`; unit scales when None.
    num_layers: when set, returns a stacked cache for scan-over-layers.
    value_tile: layout of FP8 / INT8 value codes (see the module docstring): 0 token-major, T > 0
      tiles of T tokens; None: `default_value_tile` (VALUE_TILE on GPU).
    kivi_layout: layout of KIVI codes (`QArray.layout`): "" planar, "words" the Mosaic GPU
      kernel's uint16 words (KIVI-2 / KIVI-4, G = 128 or 32, R a multiple of 128, H = 128); None:
      `default_kivi_layout` ("words" on GPU where the kernel takes the format).
  """
  for name, val in (("batch", batch), ("num_kv_heads", num_kv_heads), ("capacity", capacity),
                    ("head_dim", head_dim)):
    if not isinstance(val, (int, np.integer)) or val < 1:
      raise ValueError(f"{name} must be a positive int, got {val!r}")
  fmt.validate_head_dim(head_dim)
  if hasattr(scales, "as_tuple"):  # calibration.KVScales
    scales = scales.as_tuple()
  r = fmt.residual
  if r and capacity % r:
    raise ValueError(f"capacity ({capacity}) must be a multiple of the residual length R ({r}) "
                     f"for {fmt.name!r}")
  value_tile = default_value_tile(fmt, capacity) if value_tile is None else value_tile
  _check_value_tile(fmt, capacity, value_tile)
  kivi_layout = default_kivi_layout(fmt, capacity, head_dim) if kivi_layout is None else kivi_layout
  _check_kivi_layout(fmt, capacity, head_dim, kivi_layout)
  if num_layers is not None:
    ks, vs = scales if scales is not None else (None, None)
    layers = [init_cache(fmt, batch, num_kv_heads, capacity, head_dim,
                         scales=(None if ks is None else ks[i], None if vs is None else vs[i]),
                         value_tile=value_tile, kivi_layout=kivi_layout)
              for i in range(num_layers)]
    return stack(layers)
  ks, vs = scales if scales is not None else (None, None)
  key_block = r if isinstance(fmt.key, KIVISpec) else head_dim
  k = _empty_qarray(fmt.key, batch, num_kv_heads, capacity, head_dim, ks, block=key_block)
  v = _empty_qarray(fmt.value, batch, num_kv_heads, capacity, head_dim, vs, block=head_dim)
  # Separate buffers for k_res and v_res (one shared array could not be donated twice).
  res = lambda: jnp.zeros((batch, num_kv_heads, r, head_dim), fmt.residual_dtype) if r else None
  sink = (lambda: jnp.zeros((batch, num_kv_heads, fmt.sink, head_dim), fmt.residual_dtype)
          if fmt.sink else None)
  if fmt.sink > capacity:
    raise ValueError(f"sink ({fmt.sink}) must be <= capacity ({capacity})")
  v = v.replace(tile=int(value_tile))
  if kivi_layout == "words":  # uint16 [B, K, S, 16] (4-bit: 32); scales and zeros as planar
    words = lambda spec: jnp.zeros((batch, num_kv_heads, capacity, head_dim * spec.bits // 16), jnp.uint16)
    k = k.replace(codes=words(fmt.key), layout="words", block=0)
    v = v.replace(codes=words(fmt.value), layout="words", block=0)
  return KVCache(k=k, v=v, k_res=res(), v_res=res(), lengths=jnp.zeros((batch,), jnp.int32), fmt=fmt,
                 k_sink=sink(), v_sink=sink())


def stack(caches: Sequence[KVCache]) -> KVCache:
  """Stacks per-layer caches along a new leading axis (for `jax.lax.scan`)."""
  return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *caches)


def unstack(cache: KVCache) -> list[KVCache]:
  return [cache.layer(i) for i in range(cache.num_layers)]


def _check_new(cache: KVCache, k: Array, v: Array) -> None:
  for name, x in (("k", k), ("v", v)):
    if x.ndim != 4:
      raise ValueError(f"{name} must have rank 4 [B, K, T, H], got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
    want = (cache.batch, cache.num_kv_heads, x.shape[2], cache.head_dim)
    if x.shape != want:
      raise ValueError(f"{name} must have shape [B={want[0]}, K={want[1]}, T, H={want[3]}], "
                       f"got {x.shape}")
  if k.shape != v.shape:
    raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")


def _round_to(x: Array, dtype) -> Array:
  """`x.astype(dtype)` whose rounding survives jit: XLA GPU's default excess precision elides
  ``convert(convert(x, bf16), f32)`` (openxla/xla#41605), so a jitted append quantized the f32
  values while an eager one quantized the bf16 ones the residual stores (codes 1 step apart on the
  H200, session 8). `lax.reduce_precision` is the op XLA keeps."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(x.dtype, jnp.floating) and jnp.finfo(x.dtype).bits > jnp.finfo(dtype).bits:
    fi = jnp.finfo(dtype)
    x = jax.lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
  return x.astype(dtype)


def append(cache: KVCache, k: Float[Array, "B K T H"], v: Float[Array, "B K T H"],
           num_new: Int[Array, "B"] | None = None, *, checked: bool = False,
           write_rows: Callable[[KVCache, Sequence[RowWrite | KeyFlush]], KVCache] = scatter_writes) -> KVCache:
  """Appends T tokens to every sequence (or `num_new[b]` <= T of them) and returns the new cache.

  Prefill, chunked prefill, decode (T = 1) and speculative verification
  (small T) all go through here. Token j of sequence b lands at position
  ``lengths[b] + j``. See the module docstring for what happens at capacity.
  `write_rows` stores the quantized rows into the cache leaves (default: XLA
  scatters; `pallas_kernels.gpu.write.write_rows` does them in one kernel). KIVI
  keys reach it unquantized, as a `KeyFlush` (the writer quantizes full blocks).
  """
  stacked = cache.num_layers is not None
  want = 5 if stacked else 4
  for name, x in (("k", k), ("v", v)):
    if x.ndim != want:
      raise ValueError(f"{name} must have rank {want} ({'[L, ' if stacked else '['}B, K, T, H]), "
                       f"got shape {x.shape}")
  b, n = k.shape[-4], k.shape[-2]
  s_cap = cache.capacity
  count = jnp.full((b,), n, jnp.int32) if num_new is None else jnp.asarray(num_new, jnp.int32)
  if count.shape != (b,):
    raise ValueError(f"num_new must have shape [B={b}], got {count.shape}")
  lengths = cache.lengths[0] if stacked else cache.lengths
  if checked:
    checkify.check(jnp.all(lengths + count <= s_cap),
                   "append past capacity: lengths {l} + new {c} > capacity " + str(s_cap),
                   l=lengths, c=count)
  elif not isinstance(lengths, jax.core.Tracer) and not isinstance(count, jax.core.Tracer):
    c = np.asarray(count)
    if (np.asarray(lengths) + c > s_cap).any() or (c > n).any() or (c < 0).any():
      raise ValueError(f"append past capacity or bad num_new: lengths {np.asarray(lengths)} + "
                       f"num_new {c} must be <= capacity ({s_cap}), with 0 <= num_new <= T ({n})")
  if stacked:
    return jax.vmap(lambda c_, a, b_: append(c_, a, b_, count, write_rows=write_rows))(cache, k, v)
  _check_new(cache, k, v)
  lengths = cache.lengths
  count = jnp.clip(jnp.minimum(count, s_cap - lengths), 0, n)
  j = jnp.arange(n)
  valid = j[None] < count[:, None]
  pos = jnp.where(valid, lengths[:, None] + j[None], s_cap)  # s_cap: dropped
  fmt = cache.fmt
  if fmt.is_kivi:  # quantized from exactly what the residual stores
    k = _round_to(k, fmt.residual_dtype)
    v = _round_to(v, fmt.residual_dtype)
  writes = per_token_writes(cache.v, v, pos, "v")
  if fmt.is_kivi:
    r_len = fmt.residual
    end = lengths + count
    in_window = valid & (pos >= (end - r_len)[:, None])
    slot = jnp.where(in_window, pos % r_len, r_len)
    writes.append(RowWrite("v_res", cache.v_res.shape, v, slot))
    writes.append(KeyFlush(k, count, lengths))
  else:
    writes += per_token_writes(cache.k, k, pos, "k")
  if fmt.sink:
    slot = jnp.where(valid & (pos < fmt.sink), pos, fmt.sink)  # others dropped
    writes += [RowWrite("k_sink", cache.k_sink.shape, k, slot),
               RowWrite("v_sink", cache.v_sink.shape, v, slot)]
  return write_rows(cache.replace(lengths=lengths + count), writes)


def prefill(cache: KVCache, k: Float[Array, "B K T H"], v: Float[Array, "B K T H"],
            lengths: Int[Array, "B"] | None = None) -> KVCache:
  """Fills an (empty or partly filled) cache with a right-padded prompt; `lengths` are valid tokens."""
  return append(cache, k, v, lengths)


def materialize(cache: KVCache, dtype=jnp.float32) -> tuple[Array, Array]:
  """What attention sees: keys and values ``[B, K, S, H]`` (positions >= length are arbitrary).

  This is the reference semantics every kernel must match: tokens before
  ``Lq`` use dequantized keys, later ones the residual; tokens in the last R
  use full-precision values, earlier ones dequantized values.
  """
  if cache.num_layers is not None:
    return jax.vmap(lambda c: materialize(c, dtype))(cache)
  k = quant.dequantize(cache.k, dtype)
  v = quant.dequantize(cache.v, dtype)
  if cache.fmt.sink:
    n = cache.fmt.sink
    k = k.at[:, :, :n].set(cache.k_sink.astype(dtype))
    v = v.at[:, :, :n].set(cache.v_sink.astype(dtype))
  if not cache.fmt.is_kivi:
    return k, v
  r_len = cache.fmt.residual
  reps = cache.capacity // r_len
  t = jnp.arange(cache.capacity)[None, None, :, None]
  lengths = cache.lengths[:, None, None, None]
  lq = lengths - lengths % r_len
  k = jnp.where(t < lq, k, jnp.tile(cache.k_res.astype(dtype), (1, 1, reps, 1)))
  v = jnp.where(t < lengths - r_len, v, jnp.tile(cache.v_res.astype(dtype), (1, 1, reps, 1)))
  return k, v
