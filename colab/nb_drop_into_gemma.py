"""Cells of colab/drop_into_gemma.ipynb (built by colab/build_notebooks.py)."""

from __future__ import annotations

from nb_common import *  # noqa: F401,F403  (badge, INSTALL, FIND_RESULTS, md, code, new_notebook)


def drop_into_gemma():
  return [
      md(f"""
# Drop kvjax into a Flax / Gemma-style decode loop

{badge("drop_into_gemma")}

`kvjax.KVAttention` speaks the conventions of the libraries it drops into:
the gemma library's per-layer cache dict and `Attention` signature, and flax
NNX's `init_cache` / `decode=True`. This notebook runs each loop with a
quantized cache and checks it against the same loop with a bf16 cache.
"""),
      md("## Install"),
      code(INSTALL),
      md("## Imports"),
      code("""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import kvjax
from kvjax import adapters
from kvjax.quality import reference_lm

def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / np.linalg.norm(b)
"""),
      md("""
## One attention layer

Gemma-shaped: 4 query heads sharing 2 KV heads (GQA), head_dim 64, RoPE. The
weights are random; the point is the plumbing and the agreement with bf16.
The prompt is 144 tokens, longer than KIVI's R=128 bf16 residual window, so
KIVI has quantized tokens to attend over (shorter contexts are exact in KIVI).
"""),
      code("""
B, D, T_PROMPT, STEPS = 2, 128, 144, 8
attn = kvjax.KVAttention(features=D, num_heads=4, num_kv_heads=2, head_dim=64, rngs=nnx.Rngs(0))
x = jax.random.normal(jax.random.PRNGKey(1), (B, T_PROMPT + STEPS, D))
FORMATS = ["fp8_e4m3", "int8", "kivi4"]
"""),
      md("""
## 1. gemma-style: a per-layer dict in, the same dict out

`attn.init_layer_cache(cache_size, batch_size)` returns gemma's layer dict
(`k`, `v`, `positions`, `end_index`; `k`/`v` are head-major `QArray`s) and
`cache, out = attn(x, segment_pos, cache, attn_mask)` is gemma's
`Attention.__call__`. A prompt of T > 1 tokens prefills; T == 1 decodes.
"""),
      code("""
@nnx.jit
def gemma_step(attn, x, segment_pos, cache):
  return attn(x, segment_pos, cache, None)       # attn_mask: accepted, masks come from lengths

def gemma_loop(fmt):
  cache = attn.init_layer_cache(cache_size=256, batch_size=B, fmt=fmt)
  pos = jnp.broadcast_to(jnp.arange(T_PROMPT), (B, T_PROMPT))
  cache, out = gemma_step(attn, x[:, :T_PROMPT], pos, cache)        # prefill
  outs = []
  for t in range(T_PROMPT, T_PROMPT + STEPS):                        # decode
    cache, out = gemma_step(attn, x[:, t:t + 1], jnp.full((B, 1), t), cache)
    outs.append(out)
  return cache, jnp.concatenate(outs, axis=1)

cache, ref = gemma_loop(kvjax.preset("bf16"))
print(sorted(cache), "| end_index", cache["end_index"], "| k", type(cache["k"]).__name__, cache["k"].shape)
for name in FORMATS:
  _, out = gemma_loop(kvjax.preset(name))
  print(f"{name:9s} decode outputs vs bf16 cache: rel err {rel_err(out, ref):.2e}")
"""),
      md("""
## 2. flax NNX: `init_cache` and `decode=True`

The cache lives in an `nnx.Cache` variable on the module, as in
`nnx.MultiHeadAttention`. `nnx.view(attn, decode=True, batch_size=B,
max_length=S)` works too.
"""),
      code("""
@nnx.jit
def nnx_step(attn, x):
  return attn(x, decode=True)

def nnx_loop(fmt):
  attn.init_cache((B, 256, D), fmt=fmt)            # (batch, max_length, features)
  nnx_step(attn, x[:, :T_PROMPT])                  # prefill
  out = [nnx_step(attn, x[:, t:t + 1]) for t in range(T_PROMPT, T_PROMPT + STEPS)]
  return jnp.concatenate(out, axis=1)

ref_nnx = nnx_loop(kvjax.preset("bf16"))
print("same as the gemma-style loop:", bool(jnp.allclose(ref_nnx, ref, atol=1e-5)))
for name in FORMATS:
  print(f"{name:9s} rel err vs bf16 {rel_err(nnx_loop(kvjax.preset(name)), ref_nnx):.2e}")
attn.cache = nnx.data(None)                        # back to the uncached layer
"""),
      md("""
## 3. Import an existing token-major cache once

gemma and Flax store caches token-major `[B, S, K, H]`. Convert at the
boundary with `kvjax.adapters.from_token_major` (one transpose and one
quantization), then keep decoding from the quantized, head-major cache. Here
the token-major cache is what the bf16 loop built for the prompt.
"""),
      code("""
cache = attn.init_layer_cache(cache_size=256, batch_size=B)
pos = jnp.broadcast_to(jnp.arange(T_PROMPT), (B, T_PROMPT))
cache, _ = gemma_step(attn, x[:, :T_PROMPT], pos, cache)
kvc, _ = adapters.from_layer_cache(cache, kvjax.preset("bf16"))
k_tm, v_tm = adapters.to_token_major(kvc)                           # [B, S, K, H], like gemma's
k_tm, v_tm = k_tm[:, :T_PROMPT], v_tm[:, :T_PROMPT]
print("token-major k", k_tm.shape, k_tm.dtype)

for name in FORMATS:
  fmt = kvjax.preset(name)
  imported = adapters.from_token_major(k_tm, v_tm, fmt, lengths=jnp.full((B,), T_PROMPT),
                                       capacity=256)
  cache = adapters.to_layer_cache(imported)        # gemma dict view: no copy
  outs = []
  for t in range(T_PROMPT, T_PROMPT + STEPS):
    cache, out = gemma_step(attn, x[:, t:t + 1], jnp.full((B, 1), t), cache)
    outs.append(out)
  print(f"{name:9s} continued from the import: rel err vs bf16 {rel_err(jnp.concatenate(outs, 1), ref):.2e}")
"""),
      md("""
## 4. A whole decoder: `init_gemma_cache`

`kvjax.models.Decoder` builds Gemma 1/2/3 and Llama-style models on
`KVAttention`; `init_gemma_cache` gives gemma's `{'layer_i': dict}` cache for
the whole model, and `logits, cache = model(tokens, cache)` threads it. Here
with the shipped reference code model (a `Decoder`), greedy, on held-out
code.
"""),
      code("""
model, tokenizer = reference_lm.load()
held = np.load(f"{reference_lm.CHECKPOINT_DIR}/heldout_tokens.npy").astype(np.int32)
prompt = jnp.asarray(np.stack([held[49936:50096], held[149936:150096]]))   # 160 tokens
NEW = 16

@nnx.jit
def model_step(model, tokens, cache):
  logits, cache = model(tokens, cache)
  return jnp.argmax(logits[:, -1], axis=-1), cache

def greedy(fmt):
  cache = model.init_gemma_cache(cache_size=256, batch_size=2, fmt=fmt)
  tok, cache = model_step(model, prompt, cache)                     # prefill
  out = [tok]
  for _ in range(NEW - 1):                                          # decode
    tok, cache = model_step(model, tok[:, None], cache)
    out.append(tok)
  return np.stack(out, axis=1), cache

ref_toks, cache = greedy(kvjax.preset("bf16"))
print(list(cache)[:2], "...", len(cache), "layers; layer_0 end_index", cache["layer_0"]["end_index"])
for name in ("fp8_e4m3", "kivi4"):
  toks, _ = greedy(kvjax.preset(name))
  print(f"{name:9s} greedy tokens equal to bf16: {(toks == ref_toks).mean():.0%}")
print(tokenizer.decode(ref_toks[0].tolist()))
"""),
      md("""
## Next steps

- `models.generate` compiles prefill and the whole decode loop into one
  program (see `quickstart.ipynb`).
- `models.load_hf(dir)` / `models.load_gemma_params(params)` load real Gemma
  and Llama weights into the same `Decoder`.
- `fp8_vs_kivi.ipynb` to pick a format and calibrate static FP8 scales.
"""),
  ]
