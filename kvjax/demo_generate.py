"""Generation in every cache format with the embedded default model (part of the main job).

The default model is the project's reference code LM (`kvjax.quality.reference_lm`,
trained on real Python source, shipped in kvjax/assets) prompted with held-out
code; without it, `kvjax.models.default_config()` with seeded random weights
and random prompts. ``--checkpoint DIR`` loads a HF
checkpoint directory (``config.json`` + ``*.safetensors``) or a kvjax
checkpoint (`kvjax.models.checkpoint`, e.g. ``kvjax/assets/reference_lm``)
instead. For each format: cache bytes, time
per decode step, and agreement of the greedy tokens with the bf16 cache.
Static-FP8 scales are calibrated on the model's own keys and values.

  python -m kvjax.demo                      # memory/accuracy table, then this
  python -m kvjax.demo --checkpoint DIR     # the same with real weights
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax import calibration, formats, quant
from kvjax.cache import materialize
from kvjax.models import config as config_lib, decoder, generation, loaders

CALIB_MARGIN = 2.0


def load_model(checkpoint: str | None = None, seed: int = 0) -> decoder.Decoder:
  from kvjax.quality import reference_lm
  if checkpoint is None and reference_lm.available():
    checkpoint = reference_lm.CHECKPOINT_DIR
  if checkpoint:
    import json
    import os
    with open(os.path.join(checkpoint, "config.json")) as f:
      is_kvjax = "kvjax_decoder_config" in json.load(f)
    if is_kvjax:  # kvjax's own format (kvjax.models.checkpoint), e.g. kvjax/assets/reference_lm
      from kvjax.models import checkpoint as ckpt
      return ckpt.load(checkpoint)
    return loaders.load_hf(checkpoint)  # Hugging Face Gemma / Llama directory
  return decoder.Decoder(config_lib.default_config(), rngs=nnx.Rngs(seed))


def model_label(checkpoint: str | None, seed: int) -> str:
  from kvjax.quality import reference_lm
  if checkpoint is None and reference_lm.available():
    return "the reference code LM (kvjax/assets/reference_lm), prompts from held-out code"
  return checkpoint or f"embedded random-init model (seed {seed}), random prompts"


def _prompts(checkpoint, vocab_size, batch, prompt_len, rng) -> np.ndarray:
  """Held-out code windows for the reference LM; random tokens otherwise."""
  from kvjax.quality import reference_lm
  if checkpoint is None and reference_lm.available():
    held = np.load(f"{reference_lm.CHECKPOINT_DIR}/heldout_tokens.npy").astype(np.int32)
    starts = rng.integers(0, len(held) - prompt_len, batch)
    return np.stack([held[s:s + prompt_len] for s in starts])
  return rng.integers(0, vocab_size, (batch, prompt_len))


def _static_scales(model, bf16_caches, fmt):
  """Calibrated static FP8 scales from the bf16 run's keys and values (all layers)."""
  kv = [materialize(c) for c in bf16_caches]  # per layer ([B, K, S, H], [B, K, S, H])
  n = int(jnp.min(bf16_caches[0].lengths))  # tokens every sequence has
  k = jnp.stack([a[0][:, :, :n] for a in kv])
  v = jnp.stack([a[1][:, :, :n] for a in kv])
  stats = calibration.calibrate([(k, v)], len(kv), k.shape[2], k.shape[-1])
  return calibration.compute_scales(stats, fmt, method="absmax", margin=CALIB_MARGIN)


def run(format_names, *, checkpoint: str | None = None, batch: int = 4, prompt_len: int = 200,
        max_new_tokens: int = 56, seed: int = 0) -> list[dict]:
  """Greedy generation per format; returns table rows (first format must be bf16)."""
  model = load_model(checkpoint, seed)
  cfg = model.cfg
  rng = np.random.default_rng(seed)
  prompts = jnp.asarray(_prompts(checkpoint, cfg.vocab_size, batch, prompt_len, rng), jnp.int32)
  plen = jnp.asarray(np.linspace(prompt_len, prompt_len * 0.6, batch).astype(np.int32))
  rows, ref, ref_caches = [], None, None
  for name in format_names:
    fmt = formats.preset(name)
    try:
      fmt.validate_head_dim(cfg.head_dim)
    except ValueError as e:
      print(f"skipping {name}: {e}")
      continue
    scales = _static_scales(model, ref_caches, fmt) if fmt.has_static_scales else None
    kw = dict(max_new_tokens=max_new_tokens, fmt=fmt, scales=scales)
    t0 = time.perf_counter()
    out = generation.generate(model, prompts, plen, **kw)
    jax.block_until_ready(out.tokens)
    compile_s = time.perf_counter() - t0
    run_s = float("inf")
    for _ in range(2):  # steady state: best of two compiled runs
      t0 = time.perf_counter()
      out = generation.generate(model, prompts, plen, **kw)
      jax.block_until_ready(out.tokens)
      run_s = min(run_s, time.perf_counter() - t0)
    toks = np.asarray(out.tokens)
    if ref is None:
      ref, ref_caches = toks, out.caches
    same = toks == ref
    first = np.where(same.all(1), max_new_tokens, np.argmin(same, axis=1))
    cache_bytes = sum(quant.nbytes(c) for c in out.caches)
    cap = out.caches[0].capacity
    rows.append({
        "format": name, "cache_bytes": cache_bytes,
        "bytes_per_token": round(cache_bytes / (batch * cap), 1),
        "ms_per_step": round(1e3 * run_s / max_new_tokens, 3),
        "compile_and_run_s": round(compile_s, 2),
        "token_agreement_vs_bf16": round(float(same.mean()), 4),
        "mean_first_divergence": round(float(first.mean()), 2),
    })
  return rows


def format_table(rows: list[dict], max_new_tokens: int) -> str:
  lines = ["| format | cache KiB | bytes/token (all layers) | ms per generated token (whole "
           "batch, prefill included) | tokens equal to bf16 | first divergence (of "
           f"{max_new_tokens}) |", "|" + "---|" * 6]
  for r in rows:
    lines.append(f"| {r['format']} | {r['cache_bytes'] / 1024:.0f} | {r['bytes_per_token']:.0f} | "
                 f"{r['ms_per_step']:.2f} | {100 * r['token_agreement_vs_bf16']:.1f}% | "
                 f"{r['mean_first_divergence']:.1f} |")
  return "\n".join(lines)
