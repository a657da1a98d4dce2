"""Decoder configs: one frozen dataclass covers Gemma 1/2/3 and Llama-style models.

Presets give the published shapes (Gemma 2 2B, Gemma 3 1B, Llama 3.2 1B;
Llama 3's "llama3" RoPE frequency scaling is not implemented) and take
keyword overrides, e.g. ``gemma2_config(num_layers=2, embed_dim=64, ...)``
for a test-sized model. `default_config` is the embedded demo model.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["DecoderConfig", "gemma2_config", "gemma3_config", "llama_config", "default_config"]

AttentionType = Literal["global", "local"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DecoderConfig:
  """Shapes and architecture switches of a Gemma-family decoder.

  Attributes:
    vocab_size, embed_dim, hidden_dim (MLP), num_layers, num_heads,
      num_kv_heads, head_dim: the shapes (GQA when num_kv_heads < num_heads,
      MQA when 1).
    attention_types: per layer "global" or "local" (sliding window); None:
      all global.
    sliding_window: window of local layers (a token sees the last `window`
      positions, itself included), required when any layer is local.
    query_pre_attn_scalar: softmax scale is ``query_pre_attn_scalar ** -0.5``
      (Gemma 2/3); None: ``head_dim ** -0.5``.
    attn_logit_softcap, final_logit_softcap: ``cap * tanh(x / cap)`` (Gemma 2).
    use_post_attn_norm, use_post_ffw_norm: Gemma 2/3 sandwich norms.
    use_qk_norm: RMSNorm on queries and keys per head (Gemma 3).
    rope_base, rope_scale_factor: RoPE of global layers (linear scaling).
    local_rope_base, local_rope_scale_factor: RoPE of local layers (None: as global).
    norm_style: "gemma" (``x * (1 + w)``, zero init) or "llama" (``x * w``).
    norm_eps: RMSNorm epsilon.
    activation: "gelu_tanh" (Gemma) or "silu" (Llama), gated MLP.
    scale_embeddings: multiply embeddings by ``sqrt(embed_dim)`` (Gemma).
    tie_embeddings: logits use the embedding table (else a separate lm_head).
    dtype, param_dtype: activation and parameter dtypes.
  """

  vocab_size: int
  embed_dim: int
  hidden_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  attention_types: tuple[AttentionType, ...] | None = None
  sliding_window: int | None = None
  query_pre_attn_scalar: float | None = None
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  use_post_attn_norm: bool = False
  use_post_ffw_norm: bool = False
  use_qk_norm: bool = False
  rope_base: float = 10_000.0
  rope_scale_factor: float = 1.0
  local_rope_base: float | None = None
  local_rope_scale_factor: float = 1.0
  norm_style: Literal["gemma", "llama"] = "gemma"
  norm_eps: float = 1e-6
  activation: Literal["gelu_tanh", "silu"] = "gelu_tanh"
  scale_embeddings: bool = True
  tie_embeddings: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    for f in ("vocab_size", "embed_dim", "hidden_dim", "num_layers", "num_heads", "num_kv_heads",
              "head_dim"):
      v = getattr(self, f)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"DecoderConfig.{f} must be a positive int, got {v!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                       f"({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
    if self.attention_types is not None:
      if not isinstance(self.attention_types, tuple) or len(self.attention_types) != self.num_layers:
        raise ValueError(f"attention_types must be a tuple of num_layers ({self.num_layers}) "
                         f"entries, got {self.attention_types!r}")
      bad = [t for t in self.attention_types if t not in ("global", "local")]
      if bad:
        raise ValueError(f"attention_types entries must be 'global' or 'local', got {bad}")
      if "local" in self.attention_types and (self.sliding_window is None or self.sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive int when a layer is local, got "
                         f"{self.sliding_window!r}")
    for f in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
      v = getattr(self, f)
      if v is not None and not v > 0:
        raise ValueError(f"DecoderConfig.{f} must be > 0 or None, got {v!r}")
    if self.norm_style not in ("gemma", "llama"):
      raise ValueError(f"norm_style must be 'gemma' or 'llama', got {self.norm_style!r}")
    if self.activation not in ("gelu_tanh", "silu"):
      raise ValueError(f"activation must be 'gelu_tanh' or 'silu', got {self.activation!r}")
    for f in ("dtype", "param_dtype"):
      if getattr(self, f) not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"DecoderConfig.{f} must be 'float32', 'bfloat16' or 'float16', got "
                         f"{getattr(self, f)!r}")

  def layer_type(self, i: int) -> AttentionType:
    return "global" if self.attention_types is None else self.attention_types[i]

  def window(self, i: int) -> int | None:
    return self.sliding_window if self.layer_type(i) == "local" else None

  def rope(self, i: int) -> tuple[float, float]:
    """(base, scale_factor) of layer i."""
    if self.layer_type(i) == "local":
      return (self.local_rope_base or self.rope_base, self.local_rope_scale_factor)
    return (self.rope_base, self.rope_scale_factor)

  @property
  def sm_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  def replace(self, **kw) -> "DecoderConfig":
    return dataclasses.replace(self, **kw)


def _pattern(num_layers: int, local_per_global: int) -> tuple[str, ...]:
  """`local_per_global` local layers then one global, repeated."""
  return tuple("global" if (i + 1) % (local_per_global + 1) == 0 else "local" for i in range(num_layers))


def gemma2_config(**overrides) -> DecoderConfig:
  """Gemma 2 2B shapes: alternating local/global, soft-caps, sandwich norms."""
  num_layers = overrides.pop("num_layers", 26)
  base = dict(vocab_size=256_128, embed_dim=2304, hidden_dim=9216, num_layers=num_layers,
              num_heads=8, num_kv_heads=4, head_dim=256, attention_types=_pattern(num_layers, 1),
              sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcap=50.0,
              final_logit_softcap=30.0, use_post_attn_norm=True, use_post_ffw_norm=True)
  return DecoderConfig(**{**base, **overrides})


def gemma3_config(**overrides) -> DecoderConfig:
  """Gemma 3 1B shapes: 5 local : 1 global, QK-norm, 10k local / 1M global RoPE."""
  num_layers = overrides.pop("num_layers", 26)
  base = dict(vocab_size=262_144, embed_dim=1152, hidden_dim=6912, num_layers=num_layers,
              num_heads=4, num_kv_heads=1, head_dim=256, attention_types=_pattern(num_layers, 5),
              sliding_window=512, query_pre_attn_scalar=256, use_post_attn_norm=True,
              use_post_ffw_norm=True, use_qk_norm=True, rope_base=1_000_000.0,
              local_rope_base=10_000.0)
  return DecoderConfig(**{**base, **overrides})


def llama_config(**overrides) -> DecoderConfig:
  """Llama 3.2 1B shapes (without its "llama3" RoPE frequency scaling)."""
  base = dict(vocab_size=128_256, embed_dim=2048, hidden_dim=8192, num_layers=16, num_heads=32,
              num_kv_heads=8, head_dim=64, rope_base=500_000.0, norm_style="llama", norm_eps=1e-5,
              activation="silu", scale_embeddings=False, tie_embeddings=True)
  return DecoderConfig(**{**base, **overrides})


def default_config() -> DecoderConfig:
  """The embedded demo model: a small Gemma-2-style decoder (random init, seeded)."""
  return gemma2_config(vocab_size=512, embed_dim=256, hidden_dim=512, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=128, sliding_window=64, query_pre_attn_scalar=128,
                       tie_embeddings=False)
