"""Cells of colab/quickstart.ipynb (built by colab/build_notebooks.py)."""

from __future__ import annotations

from nb_common import *  # noqa: F401,F403  (badge, INSTALL, FIND_RESULTS, md, code, new_notebook)


def quickstart():
  return [
      md(f"""
# kvjax quickstart

{badge("quickstart")}

Quantize a KV cache, decode from it, and decode a real (small, trained) code
model through it in each format: how much memory each format takes and how
closely its tokens agree with the bf16 cache. Runs on a CPU in about a minute.
"""),
      md("## Install"),
      code(INSTALL),
      md("## Imports"),
      code("""
import time

import jax
import jax.numpy as jnp
import numpy as np

import kvjax
from kvjax import models
from kvjax.quality import reference_lm

print("jax", jax.__version__, "on", jax.default_backend(), "| kvjax", kvjax.__version__)
"""),
      md("""
## Formats

A format is a frozen config: how keys and values are stored. Nine presets
cover FP8 (per-token dynamic or calibrated static scales), symmetric INT8/INT4
per token, and KIVI (asymmetric 2/4-bit, keys per channel and values per
token in groups of G, the last R tokens kept in bf16).
"""),
      code("""
for name in kvjax.PRESETS:
  fmt = kvjax.preset(name)
  print(f"{name:16s} key {type(fmt.key).__name__:11s} {fmt.key.bits:2d} bits | "
        f"value {type(fmt.value).__name__:11s} {fmt.value.bits:2d} bits | residual R={fmt.residual}")
"""),
      md("""
## Quantize one tensor

`kvjax.quantize` returns a `QArray` (codes, scale, zero, static spec);
`kvjax.dequantize` maps it back. Keys are `[..., S, H]`.
"""),
      code("""
x = jax.random.normal(jax.random.PRNGKey(0), (2, 256, 128))    # [heads, tokens, head_dim]
for name in ("fp8_e4m3", "int4", "kivi2"):
  spec = kvjax.preset(name).key
  q = kvjax.quantize(x, spec)
  err = jnp.linalg.norm(kvjax.dequantize(q) - x) / jnp.linalg.norm(x)
  print(f"{name:9s} codes {str(q.codes.dtype):14s} {str(q.codes.shape):15s} rel err {err:.3f}")
"""),
      md("""
## A cache, a prefill and a decode step

The cache is head-major `[B, K, S, H]` with per-sequence lengths (ragged
batches). `append` is functional; under `jit` with the cache donated it
updates in place. `kvjax.decode_attention` runs the fused kernel where the
platform has one, else the XLA reference.
"""),
      code("""
B, K, N, H = 2, 8, 32, 128                     # batch, KV heads, query heads, head_dim
fmt = kvjax.preset("kivi2")
cache = kvjax.init_cache(fmt, batch=B, num_kv_heads=K, capacity=512, head_dim=H)
k, v = jax.random.normal(jax.random.PRNGKey(1), (2, B, K, 300, H))
cache = kvjax.prefill(cache, k, v, jnp.array([300, 171]))   # ragged prompt lengths

@jax.jit
def step(cache, k_new, v_new, q):
  cache = kvjax.append(cache, k_new, v_new)
  return cache, kvjax.decode_attention(q, cache)

cache, out = step(cache, k[:, :, :1], v[:, :, :1], jnp.ones((B, N, 1, H)))
print("out", out.shape, "| lengths", cache.lengths, "| cache bytes", cache.nbytes)
"""),
      md("""
## Memory of every format

Bytes come from `jax.eval_shape` of the real cache arrays (codes, scales,
KIVI minimums and residual windows), here for a Llama-3-8B-shaped model
(32 layers, 8 KV heads, head_dim 128) at 32k tokens.
"""),
      code("""
ctx, budget = 32768, 16 << 30
bf16_bpt = kvjax.bytes_per_token(kvjax.preset("bf16"), ctx)
print(f"{'format':16s} {'bytes/token':>11s} {'vs bf16':>8s} {'32k seqs in 16 GiB':>19s}")
for name in kvjax.PRESETS:
  f = kvjax.preset(name)
  bpt = kvjax.bytes_per_token(f, ctx)
  print(f"{name:16s} {bpt:11.0f} {bpt / bf16_bpt:7.3f}x {kvjax.sequences_that_fit(f, budget, ctx):19d}")
"""),
      md("""
## The reference model

No pretrained weights ship with a JAX library, so kvjax ships its own: an
8.1M-parameter Gemma-architecture code model (6 layers, 2 KV heads of
head_dim 128) trained on real Python source, with its BPE tokenizer and
held-out code for prompts.
"""),
      code("""
model, tokenizer = reference_lm.load()
held = np.load(f"{reference_lm.CHECKPOINT_DIR}/heldout_tokens.npy").astype(np.int32)
P = 192
prompts = jnp.asarray(np.stack([held[30000:30000 + P], held[70000:70000 + P]]))
prompt_lengths = jnp.array([192, 160])           # ragged: the second prompt is right-padded
print(model.cfg.num_layers, "layers,", model.cfg.num_kv_heads, "KV heads of", model.cfg.head_dim)
print(tokenizer.decode(held[30000:30000 + P].tolist())[-240:])
"""),
      md("""
## Decode in each format

`models.generate` compiles prefill plus a `while_loop` of decode steps into
one program per format. Greedy decoding; agreement is the fraction of
generated tokens equal to the bf16 cache's, and "first divergence" the step
where a sequence first differs (greedy decoding rarely re-converges, so one
near-tie flipped early shows as low agreement; perplexity in
`fp8_vs_kivi.ipynb` is the steadier quality measure).
Static FP8 needs calibrated scales (see `fp8_vs_kivi.ipynb`), so it is
left out here; set `DECODE_FORMATS = list(kvjax.PRESETS)` minus it to run the
rest (each format compiles once, a few seconds on a CPU).
"""),
      code("""
DECODE_FORMATS = ["bf16", "fp8_e4m3", "int8", "kivi4", "kivi2"]
NEW = 24
results = {}
for name in DECODE_FORMATS:
  t0 = time.perf_counter()
  out = models.generate(model, prompts, prompt_lengths, max_new_tokens=NEW,
                        fmt=kvjax.preset(name), capacity=256)
  toks = np.asarray(out.tokens)
  results[name] = dict(tokens=toks, bytes=sum(c.nbytes for c in out.caches),
                       seconds=time.perf_counter() - t0)

ref = results["bf16"]["tokens"]
print(f"{'format':10s} {'cache KiB':>9s} {'agree':>6s} {'first div':>9s} {'compile+run s':>13s}")
for name, r in results.items():
  same = r["tokens"] == ref
  first = np.where(same.all(1), NEW, np.argmin(same, axis=1)).mean()
  print(f"{name:10s} {r['bytes'] / 1024:9.0f} {same.mean():6.1%} {first:9.1f} {r['seconds']:13.1f}")
"""),
      md("""
The prompts (192 and 160 tokens) are longer than KIVI's R=128-token bf16
window, so KIVI decodes over quantized keys here. At this toy capacity (256
tokens) its two bf16 windows are half the cache, so KIVI is larger than FP8
here; at 32k they are 3% of it (the memory table above).
"""),
      md("## The continuations, decoded"),
      code("""
for name in ("bf16", "kivi2"):
  print(f"--- {name} ---")
  print(tokenizer.decode(results[name]["tokens"][0].tolist()))
"""),
      md("""
## Next steps

- `fp8_vs_kivi.ipynb`: memory, GPU speed and model quality side by side, and
  calibrating static FP8 scales.
- `drop_into_gemma.ipynb`: kvjax inside Flax / gemma-style decode loops.
- `python -m kvjax.demo`: the full memory/accuracy and generation tables.
"""),
  ]


# ---------------------------------------------------------------------------------------------
# fp8_vs_kivi
# ---------------------------------------------------------------------------------------------
