"""`KVAttention`: a Flax NNX attention layer that decodes from the quantized KV cache.

GQA / MQA, RoPE, optional QK-norm, sliding-window layers, logit soft-capping,
prefill (also chunked, into a partly filled cache) and decode, any
`KVFormat`, decode through `kvjax.dispatch.decode_attention` (kernels or the
XLA reference via ``implementation=``). Projections write queries, keys and
values head-major ``[B, N|K, T, H]`` directly, so nothing is transposed to
reach the cache.

Three ways to call it, matching the conventions of the libraries it drops
into:

* **Functional (kvjax / gemma)**: pass a cache, get it back.
  ``cache, out = attn(x, segment_pos, cache, attn_mask)`` where `cache` is a
  `KVCache` or a gemma-style layer dict (`kvjax.adapters`), and the return
  has the same type. This is gemma's ``Attention.__call__`` signature.
* **flax NNX**: ``attn.init_cache((B, max_length, D))`` stores a `KVCache` in
  an ``nnx.Cache`` variable; ``out = attn(x, decode=True)`` appends and
  attends (T = 1 decode, or T > 1 prefill chunks), as
  ``nnx.MultiHeadAttention`` does; ``nnx.view(model, decode=True,
  batch_size=B, max_length=S)`` also works.
* **No cache**: ``out = attn(x)``: causal self-attention over `x` (training,
  or the uncached reference forward).

Which path runs is static: T == 1 decodes (append, then attend through the
dispatcher); T > 1 prefills (`kvjax.attention.prefill_attention`: the chunk
sees earlier tokens as the cache stores them and itself unquantized). Masks
come from the cache's per-sequence lengths (causal + window); gemma's
`attn_mask` argument is accepted for signature compatibility and is not
applied (a fused kernel masks by length, not by an arbitrary mask).
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from kvjax import adapters, attention, dispatch, formats as formats_lib, rope
from kvjax.cache import KVCache, init_cache
from kvjax.formats import KVFormat
from kvjax.layers import RMSNorm

__all__ = ["KVAttention"]


class KVAttention(nnx.Module):
  """Multi-head attention (GQA / MQA) over a quantized KV cache.

  Args:
    features: model width D.
    num_heads: query heads N.
    num_kv_heads: KV heads K (N % K == 0; K = 1 is MQA).
    head_dim: H.
    sm_scale: softmax scale (default ``head_dim ** -0.5``).
    logit_softcap: Gemma 2 attention soft-cap, or None.
    window: sliding window (a query sees its last `window` positions), or None.
    rope_base, rope_scale_factor: RoPE frequency base and linear position scaling.
    use_qk_norm: RMSNorm queries and keys per head before RoPE (Gemma 3).
    norm_style, norm_eps: style of the QK norms.
    fmt: cache format used by `init_cache` (default bf16).
    implementation: decode backend(s) for `kvjax.dispatch` (None: platform order).
    decode: default of the ``decode`` call argument (flax NNX convention).
    dtype, param_dtype: activation / parameter dtypes.
    rngs: parameter initialisation.

  Parameters: ``q [D, N, H]``, ``k [D, K, H]``, ``v [D, K, H]``, ``o [N, H, D]``.
  """

  def __init__(self, *, features: int, num_heads: int, num_kv_heads: int, head_dim: int,
               sm_scale: float | None = None, logit_softcap: float | None = None,
               window: int | None = None, rope_base: float = 10_000.0,
               rope_scale_factor: float = 1.0, use_qk_norm: bool = False,
               norm_style: str = "gemma", norm_eps: float = 1e-6, fmt: KVFormat | None = None,
               implementation: str | Sequence[str] | None = None, decode: bool = False,
               dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if num_heads % num_kv_heads:
      raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})")
    if window is not None and window < 1:
      raise ValueError(f"window must be a positive int or None, got {window!r}")
    init = nnx.initializers.lecun_normal()
    self.q = nnx.Param(init(rngs.params(), (features, num_heads, head_dim), param_dtype))
    self.k = nnx.Param(init(rngs.params(), (features, num_kv_heads, head_dim), param_dtype))
    self.v = nnx.Param(init(rngs.params(), (features, num_kv_heads, head_dim), param_dtype))
    self.o = nnx.Param(nnx.initializers.lecun_normal(in_axis=(0, 1), out_axis=2)(
        rngs.params(), (num_heads, head_dim, features), param_dtype))
    if use_qk_norm:
      self.q_norm = RMSNorm(head_dim, style=norm_style, eps=norm_eps, param_dtype=param_dtype)
      self.k_norm = RMSNorm(head_dim, style=norm_style, eps=norm_eps, param_dtype=param_dtype)
    self.features, self.num_heads, self.num_kv_heads, self.head_dim = (
        features, num_heads, num_kv_heads, head_dim)
    self.sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
    self.logit_softcap, self.window = logit_softcap, window
    self.rope_base, self.rope_scale_factor = rope_base, rope_scale_factor
    self.use_qk_norm = use_qk_norm
    self.fmt = fmt or formats_lib.bf16()
    self.implementation = implementation
    self.decode = decode
    self.dtype = dtype
    self.cache = nnx.data(None)  # nnx.Cache[KVCache] after init_cache

  # ---- cache creation, in each ecosystem's spelling -------------------------------------------

  def init_cache(self, input_shape: tuple[int, ...], dtype=None, *, fmt: KVFormat | None = None,
                 scales=None) -> None:
    """flax NNX: allocates ``self.cache`` for inputs ``(B, max_length, D)`` (`dtype` is unused:
    the format decides storage). KIVI capacities round up to a multiple of R."""
    del dtype
    self.cache = nnx.Cache(self.new_cache(input_shape[0], input_shape[1], fmt=fmt, scales=scales))

  def set_view(self, deterministic=None, decode: bool | None = None, batch_size=None,
               max_length: int | None = None):
    """Hook for ``nnx.view(module, decode=True, batch_size=B, max_length=S)``."""
    del deterministic
    if decode is not None:
      self.decode = decode
      if decode and self.cache is None:
        if batch_size is None or max_length is None:
          raise TypeError("batch_size and max_length are needed to create the cache")
        b = batch_size if isinstance(batch_size, int) else int(batch_size[0])
        self.init_cache((b, max_length, self.features))

  def new_cache(self, batch: int, capacity: int, *, fmt: KVFormat | None = None,
                scales=None) -> KVCache:
    """A fresh functional `KVCache` for this layer."""
    fmt = fmt or self.fmt
    if fmt.residual:
      capacity = -(-capacity // fmt.residual) * fmt.residual
    return init_cache(fmt, batch, self.num_kv_heads, capacity, self.head_dim, scales=scales)

  def init_layer_cache(self, cache_size: int, batch_size: int, *, fmt: KVFormat | None = None,
                       scales=None) -> adapters.LayerCache:
    """gemma: the per-layer dict ``{'k', 'v', 'positions', 'end_index'}`` (see `kvjax.adapters`)."""
    return adapters.to_layer_cache(self.new_cache(batch_size, cache_size, fmt=fmt, scales=scales))

  # ---- forward -------------------------------------------------------------------------------

  def __call__(self, x: Float[Array, "B T D"], segment_pos: Int[Array, "B T"] | None = None,
               cache: KVCache | adapters.LayerCache | None = None, attn_mask: Array | None = None,
               *, decode: bool | None = None, num_new: Int[Array, "B"] | None = None,
               implementation: str | Sequence[str] | None = None):
    """Attention of `x` (see the module docstring for the three calling conventions).

    Args:
      x: inputs ``[B, T, D]``.
      segment_pos: absolute positions ``[B, T]`` for RoPE; default: each
        sequence's cache length + ``arange(T)`` (``arange(T)`` without a cache).
      cache: a `KVCache` or gemma-style layer dict; returned updated.
      attn_mask: ignored (gemma compatibility); masks come from lengths.
      decode: flax NNX: use and update ``self.cache``.
      num_new: tokens of `x` that are real per sequence (right padding); default T.
      implementation: overrides the module's decode backend for this call.

    Returns:
      ``(cache, out)`` when `cache` was given (same type), else ``out [B, T, D]``.
    """
    del attn_mask
    if x.ndim != 3 or x.shape[-1] != self.features:
      raise ValueError(f"x must be [B, T, D={self.features}], got shape {x.shape}")
    impl = implementation if implementation is not None else self.implementation
    if cache is not None:
      if isinstance(cache, dict):
        kv, positions = adapters.from_layer_cache(cache, self._fmt_of(cache))
        count = self._count(x, num_new)
        seg = self._positions(x, kv, segment_pos)
        kv_new, out = self._attend_cached(x, seg, kv, count, impl)
        d = adapters.to_layer_cache(kv_new, adapters.update_positions(positions, kv.lengths, seg,
                                                                      count))
        return d, out
      if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or a gemma-style dict, got {type(cache).__name__}")
      return self._attend_cached(x, self._positions(x, cache, segment_pos), cache,
                                 self._count(x, num_new), impl)
    decode = self.decode if decode is None else decode
    if decode:
      if self.cache is None:
        raise ValueError("Autoregressive cache not initialized: call init_cache((B, max_length, D)) "
                         "or nnx.view(module, decode=True, batch_size=B, max_length=S) first")
      kv = self.cache.get_value()
      kv, out = self._attend_cached(x, self._positions(x, kv, segment_pos), kv,
                                    self._count(x, num_new), impl)
      self.cache.set_value(kv)
      return out
    return self._attend_uncached(x, segment_pos)

  def _fmt_of(self, d) -> KVFormat:
    """The module's format when it matches the dict's specs, else one rebuilt from them."""
    ks, vs = getattr(d.get("k"), "spec", None), getattr(d.get("v"), "spec", None)
    if ks is None or vs is None or (ks == self.fmt.key and vs == self.fmt.value):
      return self.fmt  # (from_layer_cache reports malformed dicts)
    res = d.get("k_res")
    return KVFormat(name="custom", key=ks, value=vs,
                    residual=0 if res is None else res.shape[-2],
                    residual_dtype=str(res.dtype) if res is not None else "bfloat16")

  @staticmethod
  def _count(x, num_new) -> Array:
    b, t = x.shape[:2]
    return jnp.full((b,), t, jnp.int32) if num_new is None else jnp.asarray(num_new, jnp.int32)

  @staticmethod
  def _positions(x, cache: KVCache, segment_pos) -> Array:
    if segment_pos is not None:
      return jnp.asarray(segment_pos, jnp.int32)
    return cache.lengths[:, None] + jnp.arange(x.shape[1], dtype=jnp.int32)[None]

  def _project(self, x: Array, positions: Array) -> tuple[Array, Array, Array]:
    """Head-major ``q [B, N, T, H]``, ``k, v [B, K, T, H]`` with QK-norm and RoPE applied."""
    dt = self.dtype
    x = x.astype(dt)
    q = jnp.einsum("btd,dnh->bnth", x, self.q[...].astype(dt))
    k = jnp.einsum("btd,dkh->bkth", x, self.k[...].astype(dt))
    v = jnp.einsum("btd,dkh->bkth", x, self.v[...].astype(dt))
    if self.use_qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = rope.apply_rope(q, positions, base=self.rope_base, scale_factor=self.rope_scale_factor)
    k = rope.apply_rope(k, positions, base=self.rope_base, scale_factor=self.rope_scale_factor)
    return q, k, v

  def _out(self, o: Float[Array, "B N T H"]) -> Float[Array, "B T D"]:
    return jnp.einsum("bnth,nhd->btd", o.astype(self.dtype), self.o[...].astype(self.dtype))

  def _attend_cached(self, x, positions, cache: KVCache, count, impl) -> tuple[KVCache, Array]:
    if cache.num_layers is not None:
      raise ValueError("KVAttention takes one layer's cache; got a stacked cache (use .layer(i))")
    q, k, v = self._project(x, positions)
    opts = dict(sm_scale=self.sm_scale, logit_softcap=self.logit_softcap, window=self.window)
    if x.shape[1] == 1:  # decode: append, then attend over the cache through the dispatcher
      cache = dispatch.append(cache, k, v, count, implementation=impl)
      o = dispatch.decode_attention(q, cache, implementation=impl, **opts)
    else:  # prefill / chunked prefill: earlier tokens as stored, this chunk unquantized
      o, cache = attention.prefill_attention(q, k, v, cache, count, **opts)
    return cache, self._out(o)

  def _attend_uncached(self, x, segment_pos) -> Array:
    b, t, _ = x.shape
    positions = (jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)) if segment_pos is None
                 else jnp.asarray(segment_pos, jnp.int32))
    q, k, v = self._project(x, positions)
    i = jnp.arange(t)
    mask = i[None, :] <= i[:, None]
    if self.window is not None:
      mask &= i[None, :] > i[:, None] - self.window
    o = attention.attend(q, k, v, mask, sm_scale=self.sm_scale, logit_softcap=self.logit_softcap)
    return self._out(o.astype(q.dtype))
