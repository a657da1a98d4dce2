"""Cache conventions of other libraries, converted at the boundary (never per step).

**gemma library** (google-deepmind/gemma ``gm.nn``): one dict per layer,
``{'k', 'v', 'positions', 'end_index'}``, passed into and returned from
``Attention.__call__(x, segment_pos, cache, attn_mask) -> (cache, out)``. The
kvjax version of that dict keeps the same keys, but ``'k'`` and ``'v'`` are
the cache's head-major `QArray`s (logical ``[B, K, S, H]``, not gemma's
token-major ``[B, S, K, H]``), KIVI adds ``'k_res'`` / ``'v_res'``, and
``'end_index'`` is per sequence (ragged). Converting between the dict and a
`KVCache` is a re-labelling of the same arrays: no copy, no transpose.

**Token-major caches** (gemma / Flax ``[B, S, K, H]``): `from_token_major`
transposes once, when an existing cache is imported, and `to_token_major`
once on export.

The flax NNX convention (``init_cache`` + ``nnx.Cache`` + ``decode=True``)
lives in `kvjax.module.KVAttention`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from kvjax import formats as formats_lib
from kvjax.cache import KVCache, append, init_cache, materialize
from kvjax.formats import KVFormat

__all__ = ["LayerCache", "init_layer_cache", "to_layer_cache", "from_layer_cache",
           "update_positions", "from_token_major", "to_token_major"]

LayerCache = dict  # {'k': QArray, 'v': QArray, ['k_res', 'v_res'], 'positions': [B, S], 'end_index': [B]}
_KEYS = ("k", "v", "positions", "end_index")


def init_layer_cache(cache_size: int, num_heads: int, head_dim: int, batch_size: int,
                     fmt: KVFormat | None = None, *, scales=None) -> LayerCache:
  """An empty gemma-style layer cache (same arguments as gemma's ``Attention.init_cache``).

  Args:
    cache_size: capacity S (a multiple of R for KIVI formats).
    num_heads: KV heads K.
    head_dim: H.
    batch_size: B.
    fmt: storage format (default bf16).
    scales: static FP8 ``(key_scale, value_scale)`` for this layer.
  """
  cache = init_cache(fmt or formats_lib.bf16(), batch_size, num_heads, cache_size, head_dim,
                     scales=scales)
  return to_layer_cache(cache)


def to_layer_cache(cache: KVCache, positions: Int[Array, "B S"] | None = None) -> LayerCache:
  """The gemma-style dict view of a single-layer `KVCache` (positions default to slot indices)."""
  if cache.num_layers is not None:
    raise ValueError("to_layer_cache takes one layer's cache; use cache.layer(i)")
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(cache.capacity, dtype=jnp.int32),
                                 (cache.batch, cache.capacity))
  d = {"k": cache.k, "v": cache.v, "positions": positions, "end_index": cache.lengths}
  if cache.k_res is not None:
    d["k_res"], d["v_res"] = cache.k_res, cache.v_res
  return d


def from_layer_cache(d: LayerCache, fmt: KVFormat) -> tuple[KVCache, Array]:
  """``(KVCache, positions)`` from a gemma-style dict made by `to_layer_cache` / `init_layer_cache`."""
  missing = [k for k in _KEYS if k not in d]
  if missing:
    raise KeyError(f"layer cache dict is missing {missing}; expected keys {_KEYS} (+ 'k_res', "
                   f"'v_res' for KIVI), got {sorted(d)}")
  if not hasattr(d["k"], "spec"):
    raise TypeError(f"cache['k'] must be a kvjax QArray (head-major [B, K, S, H]); got "
                    f"{type(d['k']).__name__} {getattr(d['k'], 'shape', '')}. Import a token-major "
                    "[B, S, K, H] cache once with kvjax.adapters.from_token_major")
  if d["k"].spec != fmt.key or d["v"].spec != fmt.value:
    raise ValueError(f"cache specs ({d['k'].spec}, {d['v'].spec}) do not match the format "
                     f"{fmt.name!r} ({fmt.key}, {fmt.value})")
  cache = KVCache(k=d["k"], v=d["v"], k_res=d.get("k_res"), v_res=d.get("v_res"),
                  lengths=d["end_index"], fmt=fmt)
  return cache, d["positions"]


def update_positions(positions: Int[Array, "B S"], lengths: Int[Array, "B"],
                     segment_pos: Int[Array, "B T"], num_new: Int[Array, "B"]) -> Array:
  """Writes ``segment_pos[b, j]`` at slot ``lengths[b] + j`` for ``j < num_new[b]``."""
  s = positions.shape[1]
  j = jnp.arange(segment_pos.shape[1])
  slot = jnp.where(j[None] < num_new[:, None], lengths[:, None] + j[None], s)
  rows = jnp.arange(positions.shape[0])[:, None]
  return positions.at[rows, slot].set(segment_pos.astype(positions.dtype), mode="drop")


def from_token_major(k: Float[Array, "B S K H"], v: Float[Array, "B S K H"], fmt: KVFormat, *,
                     lengths: Int[Array, "B"] | None = None, capacity: int | None = None,
                     scales=None) -> KVCache:
  """Imports a token-major ``[B, S, K, H]`` cache (gemma, Flax) into a kvjax cache: one transpose.

  Args:
    k, v: token-major keys and values (keys already rotated, as gemma stores them).
    fmt: target format.
    lengths: valid tokens per sequence (gemma's ``end_index``); default S.
    capacity: capacity of the new cache; default S (rounded up to R for KIVI).
    scales: static FP8 scales for this layer.
  """
  if k.ndim != 4 or k.shape != v.shape:
    raise ValueError(f"k and v must both be [B, S, K, H], got {k.shape} and {v.shape}")
  b, s, kh, h = k.shape
  cap = capacity or s
  if fmt.residual:
    cap = -(-cap // fmt.residual) * fmt.residual
  if cap < s:
    raise ValueError(f"capacity ({cap}) must be >= the imported length S ({s})")
  cache = init_cache(fmt, b, kh, cap, h, scales=scales)
  return append(cache, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2),
                None if lengths is None else jnp.asarray(lengths, jnp.int32))


def to_token_major(cache: KVCache, dtype=jnp.bfloat16) -> tuple[Array, Array]:
  """Exports what attention sees as token-major ``[B, S, K, H]`` keys and values (one transpose)."""
  k, v = materialize(cache, dtype)
  return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
