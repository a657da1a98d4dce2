"""The project's reference code LM: its config, where its files live, how to load it.

A small Gemma-architecture decoder trained by `benchmarks/train_reference_lm.py`
on real third-party Python source (see `kvjax.quality.corpus`). Its head_dim
is 128, like Llama/Gemma-class models, so the cache formats and kernels see
the shapes they see in production.
"""

from __future__ import annotations

import os

from kvjax.models.config import DecoderConfig

__all__ = ["reference_config", "ASSET_DIR", "TOKENIZER_PATH", "CHECKPOINT_DIR", "available", "load", "heldout_kv"]

ASSET_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
TOKENIZER_PATH = os.path.join(ASSET_DIR, "code_bpe_4096.json")
CHECKPOINT_DIR = os.path.join(ASSET_DIR, "reference_lm")


def reference_config(**overrides) -> DecoderConfig:
  """~8M parameters: 6 layers, width 256, 4 query heads and 2 KV heads of 128, vocab 4096."""
  base = dict(vocab_size=4096, embed_dim=256, hidden_dim=1024, num_layers=6, num_heads=4,
              num_kv_heads=2, head_dim=128, rope_base=500_000.0, norm_style="gemma",
              activation="gelu_tanh", scale_embeddings=True, tie_embeddings=True,
              dtype="bfloat16", param_dtype="float32")
  return DecoderConfig(**{**base, **overrides})


def available() -> bool:
  return os.path.exists(os.path.join(CHECKPOINT_DIR, "model.safetensors"))


def load(**config_overrides):
  """(model, tokenizer) of the shipped reference LM."""
  from kvjax.models import checkpoint
  from kvjax.quality import tokenizer
  if not available():
    raise FileNotFoundError(f"no reference LM checkpoint in {CHECKPOINT_DIR}: train it with "
                            "`python benchmarks/train_reference_lm.py`")
  return checkpoint.load(CHECKPOINT_DIR, **config_overrides), tokenizer.load(TOKENIZER_PATH)


def heldout_kv(tokens: int, windows: int, seed: int = 0):
  """Every layer's post-RoPE keys and values on held-out code: `windows` random windows of `tokens`
  tokens run through the shipped model into a bf16 cache; a list of (k, v) [windows, K, tokens, H]
  float32 numpy arrays, one per layer."""
  import jax.numpy as jnp
  import numpy as np
  from kvjax import formats
  from kvjax.cache import materialize
  model, _ = load()
  held = np.load(os.path.join(CHECKPOINT_DIR, "heldout_tokens.npy")).astype(np.int32)
  starts = np.random.default_rng(seed).integers(0, len(held) - tokens, windows)
  batch = jnp.asarray(np.stack([held[s:s + tokens] for s in starts]))
  _, caches = model(batch, model.init_cache(windows, tokens, formats.bf16()))
  return [tuple(np.asarray(a, np.float32) for a in materialize(c)) for c in caches]
