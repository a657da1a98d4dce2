"""Reference attention in plain jnp: the oracle for every kernel and the fallback everywhere.

Queries are head-major ``[B, N, T, H]`` with ``N = K * rep`` query heads; query
head ``n`` reads KV head ``n // rep`` (GQA; MQA when K = 1). Decode queries are
the last T tokens already appended to the cache: query ``i`` of sequence ``b``
sits at position ``lengths[b] - T + i`` and sees every cached token up to and
including itself (causal among the T, for speculative verification).
A sequence with no visible token gets a zero output, never NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from kvjax.cache import KVCache, append, materialize

__all__ = ["attend", "decode_attention", "prefill_attention"]

_NEG = -1e30


def _check_q(q: Array, num_kv_heads: int, head_dim: int, batch: int) -> int:
  if q.ndim != 4:
    raise ValueError(f"q must have rank 4 [B, N, T, H], got shape {q.shape}")
  if q.shape[0] != batch:
    raise ValueError(f"q batch ({q.shape[0]}) must equal the cache batch ({batch})")
  if q.shape[-1] != head_dim:
    raise ValueError(f"q head_dim ({q.shape[-1]}) must equal the cache head_dim ({head_dim})")
  if q.shape[1] % num_kv_heads:
    raise ValueError(f"query heads ({q.shape[1]}) must be divisible by KV heads ({num_kv_heads})")
  return q.shape[1] // num_kv_heads


def attend(q: Float[Array, "B N T H"], k: Float[Array, "B K S H"], v: Float[Array, "B K S H"],
           mask: Array, *, sm_scale: float | None = None,
           logit_softcap: float | None = None) -> Float[Array, "B N T H"]:
  """Masked GQA softmax attention in f32. `mask` broadcasts to ``[B, K, rep, T, S]``."""
  b, n, t, h = q.shape
  kh = k.shape[1]
  rep = n // kh
  sm_scale = h ** -0.5 if sm_scale is None else sm_scale
  qg = q.astype(jnp.float32).reshape(b, kh, rep, t, h)
  logits = jnp.einsum("bkrth,bksh->bkrts", qg, k.astype(jnp.float32)) * sm_scale
  if logit_softcap is not None:
    logits = logit_softcap * jnp.tanh(logits / logit_softcap)
  logits = jnp.where(mask, logits, _NEG)
  m = jnp.max(logits, axis=-1, keepdims=True)
  p = jnp.where(mask, jnp.exp(logits - m), 0.0)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  out = jnp.einsum("bkrts,bksh->bkrth", p, v.astype(jnp.float32))
  out = out / jnp.where(denom > 0, denom, 1.0)
  return out.reshape(b, n, t, h)


def decode_mask(lengths: Int[Array, "B"], num_queries: int, capacity: int,
                window: int | None = None) -> Array:
  """``[B, 1, 1, T, S]`` visibility of cached tokens for the last T queries."""
  qpos = lengths[:, None] - num_queries + jnp.arange(num_queries)[None]  # [B, T]
  kpos = jnp.arange(capacity)
  mask = (kpos[None, None] <= qpos[..., None]) & (qpos[..., None] >= 0)
  if window is not None:
    mask &= kpos[None, None] > qpos[..., None] - window
  return mask[:, None, None]


def decode_attention(q: Float[Array, "B N T H"], cache: KVCache, *, sm_scale: float | None = None,
                     logit_softcap: float | None = None,
                     window: int | None = None) -> Float[Array, "B N T H"]:
  """Attention of T query tokens over a (single-layer) quantized cache.

  One softmax spans quantized and full-precision (residual) tokens: the
  cache's `materialize` view is exactly what a fused kernel must compute.
  """
  if cache.num_layers is not None:
    raise ValueError("decode_attention takes one layer's cache; use cache.layer(i) or scan over layers")
  _check_q(q, cache.num_kv_heads, cache.head_dim, cache.batch)
  k, v = materialize(cache)
  mask = decode_mask(cache.lengths, q.shape[2], cache.capacity, window)
  return attend(q, k, v, mask, sm_scale=sm_scale, logit_softcap=logit_softcap).astype(q.dtype)


def prefill_attention(q: Float[Array, "B N T H"], k: Float[Array, "B K T H"],
                      v: Float[Array, "B K T H"], cache: KVCache,
                      lengths: Int[Array, "B"] | None = None, *, sm_scale: float | None = None,
                      logit_softcap: float | None = None,
                      window: int | None = None) -> tuple[Array, KVCache]:
  """Causal attention of a (chunk of a) prompt; returns the output and the filled cache.

  The chunk attends to the tokens already in `cache` as the cache stores them
  (chunked prefill) and to its own keys and values unquantized (KIVI's
  prefill). `lengths[b]` <= T valid tokens per sequence (right padding);
  padded queries produce arbitrary outputs.
  """
  if cache.num_layers is not None:
    raise ValueError("prefill_attention takes one layer's cache")
  b, _, t, _ = q.shape
  _check_q(q, cache.num_kv_heads, cache.head_dim, cache.batch)
  if k.shape != (b, cache.num_kv_heads, t, cache.head_dim) or v.shape != k.shape:
    raise ValueError(f"k and v must have shape {(b, cache.num_kv_heads, t, cache.head_dim)}, got "
                     f"{k.shape} and {v.shape}")
  count = jnp.full((b,), t, jnp.int32) if lengths is None else jnp.asarray(lengths, jnp.int32)
  old_k, old_v = materialize(cache)
  start = cache.lengths  # [B]
  cat_k = jnp.concatenate([old_k, k.astype(jnp.float32)], axis=2)
  cat_v = jnp.concatenate([old_v, v.astype(jnp.float32)], axis=2)
  s = cache.capacity
  kpos = jnp.concatenate([jnp.broadcast_to(jnp.arange(s), (b, s)),
                          start[:, None] + jnp.arange(t)[None]], axis=1)  # [B, S + T]
  kvalid = jnp.concatenate([jnp.arange(s)[None] < start[:, None],
                            jnp.arange(t)[None] < count[:, None]], axis=1)
  qpos = start[:, None] + jnp.arange(t)[None]  # [B, T]
  mask = kvalid[:, None, :] & (kpos[:, None, :] <= qpos[..., None])
  if window is not None:
    mask &= kpos[:, None, :] > qpos[..., None] - window
  out = attend(q, cat_k, cat_v, mask[:, None, None], sm_scale=sm_scale, logit_softcap=logit_softcap)
  return out.astype(q.dtype), append(cache, k, v, count)
