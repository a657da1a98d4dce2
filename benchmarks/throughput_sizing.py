"""Sizing for benchmarks/throughput.py: the model shapes it runs and the byte counts behind its batches (the
largest batch whose caches fit the budget; `--plan`'s roofline tokens/s), from `jax.eval_shape` of the real
cache arrays (no device memory is touched)."""

from __future__ import annotations

import jax

from kvjax import formats, memory, quant
from kvjax.models.config import DecoderConfig, gemma2_config, llama_config

GIB = 1 << 30
HBM_TBPS = 4.3  # read-only stream measured on the H200 (DESIGN.md section 1), for --plan


def llama3_8b(**kw) -> DecoderConfig:
  """Llama-3-8B shapes (untied lm_head, 128k vocab; no llama3 RoPE scaling: speed is the same)."""
  return llama_config(vocab_size=128_256, embed_dim=4096, hidden_dim=14_336, num_layers=32,
                      num_heads=32, num_kv_heads=8, head_dim=128, tie_embeddings=False,
                      dtype="bfloat16", param_dtype="bfloat16", **kw)


def gemma2_2b(**kw) -> DecoderConfig:
  return gemma2_config(dtype="bfloat16", param_dtype="bfloat16", **kw)


def tiny(**kw) -> DecoderConfig:
  """CPU smoke-test size (head_dim 32 so KIVI groups of 32 divide it)."""
  return llama_config(vocab_size=64, embed_dim=32, hidden_dim=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=32, dtype="bfloat16", param_dtype="bfloat16", **kw)


MODELS = {"llama3_8b": llama3_8b, "gemma2_2b": gemma2_2b, "tiny": tiny}


# ----------------------------------------------------------------------------- bytes


def capacity_for(fmt, context: int) -> int:
  return memory.round_capacity(fmt, context)


def abstract_model(cfg: DecoderConfig):
  from flax import nnx
  from kvjax.models.decoder import Decoder
  return nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))


def cache_bytes_per_seq(cfg: DecoderConfig, fmt, context: int) -> int:
  """Bytes of one sequence's caches over all layers (codes, scales, residuals, lengths)."""
  model = abstract_model(cfg)
  return quant.nbytes(jax.eval_shape(lambda: model.init_cache(1, capacity_for(fmt, context), fmt)))


def weight_bytes(cfg: DecoderConfig) -> int:
  from flax import nnx
  return quant.nbytes(nnx.state(abstract_model(cfg)))


def max_batch_for(cfg: DecoderConfig, fmt, context: int, budget_bytes: int) -> int:
  return int(budget_bytes // cache_bytes_per_seq(cfg, fmt, context))


def plan(models, fmts, contexts, budget_bytes, tbps=HBM_TBPS):
  """Byte-count predictions: max batch and roofline tokens/s (weights + cache read once/step)."""
  rows = []
  for m in models:
    cfg = MODELS[m]()
    wb = weight_bytes(cfg)
    for c in contexts:
      base = None
      for f in fmts:
        fmt = formats.preset(f)
        per = cache_bytes_per_seq(cfg, fmt, c)
        b = int(budget_bytes // per)
        step_s = (wb + b * per) / (tbps * 1e12)
        tps = b / step_s if b else 0.0
        base = base or (b, tps)
        rows.append(dict(model=m, format=f, context=c, bytes_per_seq=per, max_batch=b,
                         ideal_step_ms=step_s * 1e3, ideal_tokens_per_s=tps,
                         batch_ratio=b / max(base[0], 1), ideal_tps_ratio=tps / max(base[1], 1e-9),
                         weights_gib=wb / GIB))
  return rows
