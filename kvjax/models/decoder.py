"""A Gemma-family decoder (Gemma 1/2/3, Llama-style) on `KVAttention`.

``logits, caches = model(tokens, caches, num_new=lengths)``: `caches` is a
tuple of per-layer `KVCache`s (from `Decoder.init_cache`), a gemma-style dict
``{'layer_0': LayerCache, ...}``, or None for the plain uncached forward.
T > 1 tokens prefill (or extend) the caches; T == 1 decodes. Layers are
unrolled in Python: local and global layers differ statically (window,
RoPE), and one cache per layer lets them differ in format too.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from kvjax import adapters, formats as formats_lib
from kvjax.cache import KVCache
from kvjax.formats import KVFormat
from kvjax.layers import MLP, Embedder, RMSNorm, softcap
from kvjax.models.config import DecoderConfig
from kvjax.module import KVAttention

__all__ = ["Block", "Decoder"]


class Block(nnx.Module):
  """Pre-norm block, with Gemma 2/3's optional post-attention / post-MLP norms."""

  def __init__(self, cfg: DecoderConfig, layer: int, *, fmt: KVFormat | None = None,
               implementation=None, rngs: nnx.Rngs):
    dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    norm = lambda: RMSNorm(cfg.embed_dim, style=cfg.norm_style, eps=cfg.norm_eps, param_dtype=pdt)
    base, scale = cfg.rope(layer)
    self.pre_attention_norm = norm()
    self.attn = KVAttention(
        features=cfg.embed_dim, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, sm_scale=cfg.sm_scale, logit_softcap=cfg.attn_logit_softcap,
        window=cfg.window(layer), rope_base=base, rope_scale_factor=scale,
        use_qk_norm=cfg.use_qk_norm, norm_style=cfg.norm_style, norm_eps=cfg.norm_eps, fmt=fmt,
        implementation=implementation, dtype=dt, param_dtype=pdt, rngs=rngs)
    self.post_attention_norm = norm() if cfg.use_post_attn_norm else nnx.data(None)
    self.pre_ffw_norm = norm()
    self.mlp = MLP(cfg.embed_dim, cfg.hidden_dim, activation=cfg.activation, dtype=dt,
                   param_dtype=pdt, rngs=rngs)
    self.post_ffw_norm = norm() if cfg.use_post_ffw_norm else nnx.data(None)

  def __call__(self, x, segment_pos, cache, *, num_new=None, implementation=None):
    h = self.pre_attention_norm(x)
    if cache is None:
      a = self.attn(h, segment_pos)
    else:
      cache, a = self.attn(h, segment_pos, cache, num_new=num_new, implementation=implementation)
    if self.post_attention_norm is not None:
      a = self.post_attention_norm(a)
    x = x + a
    m = self.mlp(self.pre_ffw_norm(x))
    if self.post_ffw_norm is not None:
      m = self.post_ffw_norm(m)
    return cache, x + m


class Decoder(nnx.Module):
  """Embedder -> blocks -> final norm -> (soft-capped) logits.

  Args:
    cfg: the architecture.
    fmt: default cache format of `init_cache`.
    implementation: decode backend(s) (see `kvjax.dispatch`).
    rngs: initialisation (random weights; loaders overwrite them).
  """

  def __init__(self, cfg: DecoderConfig, *, fmt: KVFormat | None = None, implementation=None,
               rngs: nnx.Rngs):
    self.cfg = cfg
    dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    self.embedder = Embedder(cfg.vocab_size, cfg.embed_dim, scale=cfg.scale_embeddings, dtype=dt,
                             param_dtype=pdt, rngs=rngs)
    self.layers = nnx.List([Block(cfg, i, fmt=fmt, implementation=implementation, rngs=rngs)
                            for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.embed_dim, style=cfg.norm_style, eps=cfg.norm_eps, param_dtype=pdt)
    if not cfg.tie_embeddings:
      self.lm_head = nnx.Param(nnx.initializers.lecun_normal()(
          rngs.params(), (cfg.embed_dim, cfg.vocab_size), pdt))
    else:
      self.lm_head = nnx.data(None)
    self.fmt = fmt or formats_lib.bf16()

  def init_cache(self, batch: int, capacity: int, fmt: KVFormat | Sequence[KVFormat] | None = None,
                 *, scales=None) -> tuple[KVCache, ...]:
    """One empty cache per layer.

    Args:
      fmt: one format for every layer, or a sequence with one format per layer
        (mixed precision, e.g. KIVI-4 on sensitive layers and KIVI-2 elsewhere).
      scales: a `KVScales` (stacked over layers) for static FP8.
    """
    fmt = fmt or self.fmt
    fmts = tuple(fmt) if isinstance(fmt, (list, tuple)) else (fmt,) * self.cfg.num_layers
    if len(fmts) != self.cfg.num_layers:
      raise ValueError(f"fmt must be one format or one per layer ({self.cfg.num_layers}), got {len(fmts)}")
    per_layer = [None] * self.cfg.num_layers
    if scales is not None:
      ks, vs = scales.as_tuple() if hasattr(scales, "as_tuple") else scales
      per_layer = [(None if ks is None else ks[i], None if vs is None else vs[i])
                   for i in range(self.cfg.num_layers)]
    return tuple(blk.attn.new_cache(batch, capacity, fmt=f, scales=s)
                 for blk, f, s in zip(self.layers, fmts, per_layer))

  def init_gemma_cache(self, cache_size: int, batch_size: int, fmt: KVFormat | None = None,
                       ) -> dict[str, adapters.LayerCache]:
    """gemma-style ``{'layer_i': {'k', 'v', 'positions', 'end_index'}}``."""
    return {f"layer_{i}": adapters.to_layer_cache(c)
            for i, c in enumerate(self.init_cache(batch_size, cache_size, fmt))}

  def __call__(self, tokens: Int[Array, "B T"],
               caches: Sequence[KVCache] | dict | None = None, *,
               num_new: Int[Array, "B"] | None = None, positions: Int[Array, "B T"] | None = None,
               implementation=None) -> tuple[Float[Array, "B T V"], object]:
    """Logits of `tokens`; with caches, appends them (the first `num_new[b]` per sequence).

    Returns ``(logits, caches)`` (caches of the input's type; None when None was given).
    """
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    x = self.embedder.encode(tokens)
    gemma_style = isinstance(caches, dict)
    if caches is not None:
      n = len(caches)
      if n != self.cfg.num_layers:
        raise ValueError(f"caches must hold one cache per layer ({self.cfg.num_layers}), got {n}")
    new = []
    for i, blk in enumerate(self.layers):
      c = None if caches is None else (caches[f"layer_{i}"] if gemma_style else caches[i])
      c, x = blk(x, positions, c, num_new=num_new, implementation=implementation)
      new.append(c)
    x = self.final_norm(x)
    if self.lm_head is None:
      logits = self.embedder.decode(x)
    else:
      logits = x @ self.lm_head[...].astype(x.dtype)
    logits = softcap(logits.astype(jnp.float32), self.cfg.final_logit_softcap)
    if caches is None:
      return logits, None
    if gemma_style:
      return logits, {f"layer_{i}": c for i, c in enumerate(new)}
    return logits, tuple(new)
