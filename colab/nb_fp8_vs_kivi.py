"""Cells of colab/fp8_vs_kivi.ipynb (built by colab/build_notebooks.py)."""

from __future__ import annotations

from nb_common import *  # noqa: F401,F403  (badge, INSTALL, FIND_RESULTS, md, code, new_notebook)


def fp8_vs_kivi():
  return [
      md(f"""
# FP8 vs KIVI: memory, speed, quality, calibration

{badge("fp8_vs_kivi")}

The cache formats side by side: memory computed live from the cache arrays,
decode speed (measured here on a GPU, otherwise the committed H200
measurements), quality on the reference code model (committed H200 run),
then a walk-through of calibrating static FP8 scales.
"""),
      md("## Install"),
      code(INSTALL),
      md("## Imports"),
      code("""
import json
import tempfile

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import kvjax
from kvjax import calibration, memory
from kvjax.quality import evaluate, reference_lm

print("jax", jax.__version__, "on", jax.default_backend())
"""),
      code(FIND_RESULTS),
      md("""
## Memory

Bytes per token over all layers of a Llama-3-8B-shaped model, from
`jax.eval_shape` of the real cache (scales, KIVI minimums and the two R-token
bf16 residual windows included). KIVI's windows are a fixed cost, so its
bytes per token fall with context; FP8 and INT formats are flat.
"""),
      code("""
FORMATS = ["bf16", "fp8_e4m3", "fp8_e4m3_static", "int8", "int4", "kivi4", "kivi2", "kivi2_g128"]
contexts = [512, 1024, 2048, 4096, 8192, 16384, 32768, 131072]
bpt = {f: [memory.bytes_per_token(kvjax.preset(f), c) for c in contexts] for f in FORMATS}

fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
for f in FORMATS:
  ax[0].plot(contexts, np.array(bpt[f]) / 1024, marker="o", ms=3, label=f)
ax[0].set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="KiB per token (32 layers)",
          title="Cache bytes per token, Llama-3-8B shape")
ax[0].legend(fontsize=7)
fit = [memory.sequences_that_fit(kvjax.preset(f), 16 << 30, 32768) for f in FORMATS]
ax[1].barh(FORMATS, fit, color="tab:blue")
ax[1].set(xlabel="32k-token sequences in 16 GiB", title="Batch that fits")
ax[1].invert_yaxis()
plt.tight_layout()
plt.show()
"""),
      md("""
## Speed

On a GPU this cell measures one decode-attention call per format (B=8,
Llama-3-8B heads, 8k context, one layer). Without a GPU it reads
`benchmarks/results/decode_h200.json`, measured on one H200 by
`benchmarks/decode_kernels.py` (B=8, 32k context, one layer): each cell the
latest run of the default kernel, against the bf16 peers' latest runs.
"""),
      code("""
def measure_gpu(formats, B=8, K=8, N=32, H=128, S=8192, iters=20):
  import time
  rows = []
  key = jax.random.PRNGKey(0)
  k, v = jax.random.normal(key, (2, B, K, S, H), jnp.bfloat16)
  q = jax.random.normal(key, (B, N, 1, H), jnp.bfloat16)
  for f in formats:
    cache = kvjax.prefill(kvjax.init_cache(kvjax.preset(f), B, K, S, H), k, v)
    fn = jax.jit(lambda q, c: kvjax.decode_attention(q, c))
    fn(q, cache).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(iters):
      out = fn(q, cache)
    out.block_until_ready()
    rows.append({"impl": "kvjax", "format": f, "us": 1e6 * (time.perf_counter() - t0) / iters})
  return rows, f"measured here ({jax.devices()[0].device_kind}, B={B}, {S // 1024}k context)"

if jax.default_backend() == "gpu":
  speed, source = measure_gpu(FORMATS)
else:
  committed = json.loads((RESULTS / "decode_h200.json").read_text())
  speed = [r for r in committed["rows"] if r["batch"] == 8 and r["context"] == 32768
           and r["impl"] in ("kvjax", "torch_sdpa", "cudnn", "xla_dequant")]
  source = "committed H200 measurements (B=8, 32k context)"

bf16_best = min(r["us"] for r in speed if r["format"] == "bf16")
print(source)
print(f"{'implementation':12s} {'format':11s} {'us':>7s} {'speed vs best bf16':>19s}")
for r in sorted(speed, key=lambda r: r["us"]):
  print(f"{r['impl']:12s} {r['format']:11s} {r['us']:7.0f} {bf16_best / r['us']:18.2f}x")
"""),
      code("""
kv = [r for r in speed if r["impl"] == "kvjax"]
plt.figure(figsize=(7, 3))
plt.bar([r["format"] for r in kv], [bf16_best / r["us"] for r in kv], color="tab:orange")
plt.axhline(1.0, color="k", lw=0.8, ls="--")
plt.ylabel("speed vs best bf16")
plt.title(f"kvjax decode attention, {source}", fontsize=9)
plt.xticks(rotation=30)
plt.tight_layout()
plt.show()
"""),
      md("""
**Read honestly:** in the committed H200 table (B=8, 32k, one layer) every
quantized format is faster than the best bf16 peer: FP8 about 1.7x, INT8
1.45x, INT4 1.56x, KIVI-2 1.84x (G=32) and 2.1x (G=128). That is short of
the bytes ratio: FP8 reads at ~0.9 of the read-only stream, the KIVI
kernels at ~0.35-0.4, bound by the per-byte instruction work of unpacking
and dequantizing, not by memory bandwidth. At short contexts (B=1, 1k-4k)
the KIVI calls are still a few microseconds slower than torch's. KIVI-4's
B=8 32k point ran on an H100 only, so this H200 table has no KIVI-4 bar.
What memory buys on top: more sequences per GPU (the cell above). See the
README's GPU section and `benchmarks/NOTES_gpu.md`.
"""),
      md("""
## Quality on the reference model

`benchmarks/results/quality.json`: perplexity of held-out code with every
scored token predicted by a real decode step from the quantized cache, exact
recall of a repeated span, and passkey lookup: contexts 1k, 4k and 8k, 16
samples per cell (16k not yet measured), including two KIVI-2 variants that
protect retrieval (4 bf16 sink tokens; the 2 most sensitive layers in KIVI-4).
"""),
      code("""
quality = json.loads((RESULTS / "quality.json").read_text())
rows = quality["rows"]
names = list(dict.fromkeys(r["format"] for r in rows))
cell = {(r["format"], r["task"], r["context"]): r for r in rows}
print(f"{'format':22s} {'ppl 1k':>7s} {'ppl 4k':>7s} {'vs bf16 4k':>10s} {'recall 4k':>9s} {'B/token':>8s}")
for n in names:
  p1, p4, rc = cell[n, "ppl", 1024], cell[n, "ppl", 4096], cell[n, "recall", 4096]
  print(f"{n:22s} {p1['value']:7.3f} {p4['value']:7.3f} {p4['value'] / p4['bf16_value'] - 1:+10.1%} "
        f"{rc['value']:9.3f} {p4['bytes_per_token']:8.0f}")
"""),
      code("""
plt.figure(figsize=(6.5, 3.8))
for n in names:
  r = cell[n, "ppl", 4096]
  plt.scatter(r["bytes_per_token"], 100 * (r["value"] / r["bf16_value"] - 1))
  plt.annotate(n, (r["bytes_per_token"], 100 * (r["value"] / r["bf16_value"] - 1)), fontsize=7,
               xytext=(3, 3), textcoords="offset points")
plt.axhline(0, color="k", lw=0.8)
plt.xscale("log")
plt.xlabel("cache bytes per token (reference LM, 6 layers, 4k context)")
plt.ylabel("perplexity vs bf16 (%)")
plt.title("Quality vs memory (16 samples per format)", fontsize=9)
plt.tight_layout()
plt.show()
"""),
      md("""
## Side by side

Memory at 32k (Llama-3-8B shape), speed against the best bf16 peer from
the cell above, perplexity change at 4k on the reference model ("-": not in
that run; the quality run measured static e4m3 and per-token e5m2).
"""),
      code("""
us = {r["format"]: r["us"] for r in speed if r["impl"] == "kvjax"}
qname = {"fp8_e4m3_static": "fp8_e4m3_calibrated"}
print(f"{'format':16s} {'KiB/token@32k':>13s} {'speed vs best bf16':>18s} {'ppl vs bf16 @4k':>15s}")
for f in ("bf16", "fp8_e4m3", "fp8_e4m3_static", "kivi4", "kivi2", "kivi2_g128"):
  q = cell.get((qname.get(f, f), "ppl", 4096))
  sp = f"{bf16_best / us[f]:.2f}x" if f in us else "-"
  dq = f"{q['value'] / q['bf16_value'] - 1:+.1%}" if q else "-"
  print(f"{f:16s} {bpt[f][contexts.index(32768)] / 1024:13.1f} {sp:>18s} {dq:>15s}")
"""),
      md("""
## Calibration walk-through: static FP8 scales

Static FP8 stores one scale per key channel and per value head, fixed at
load time, instead of a scale per token. Scales come from the model's own
keys and values on representative text. The pipeline is three pure
functions: `calibrate` (a jitted absmax + histogram reduction), then
`compute_scales` (clip choice), then `save_scales` / `load_scales`.

First, the model and some held-out code: 2 windows of 256 tokens to
calibrate on, 2 other windows to evaluate on.
"""),
      code("""
model, tokenizer = reference_lm.load()
held = np.load(f"{reference_lm.CHECKPOINT_DIR}/heldout_tokens.npy").astype(np.int32)
T = 256
calib_tokens = jnp.asarray(np.stack([held[i:i + T] for i in (0, 40000)]))
eval_tokens = jnp.asarray(np.stack([held[i:i + T] for i in (80000, 120000)]))
fmt = kvjax.preset("fp8_e4m3_static")
print(fmt.name, "| key:", fmt.key, "| value:", fmt.value)
"""),
      md("""
`evaluate.calibrate_model` runs the model over the tokens with a bf16 cache
and reduces its K/V to scales in one call (here absmax with 2x headroom, the
setting the quality run used).
"""),
      code("""
scales, info = evaluate.calibrate_model(model, calib_tokens, fmt, method="absmax", margin=2.0)
print("k_scale", scales.k.shape, "v_scale", scales.v.shape, "| calibration", info)
"""),
      md("""
The same by hand, to compare clip choices: capture K/V once, reduce to
statistics once, then choose clips from the same statistics. `absmax` never
clips, `percentile` clips the top 0.01% of |x|, `mse` picks the clip that
minimises the FP8 round-trip error over the histogram.
"""),
      code("""
caches = model.init_cache(2, T, kvjax.preset("bf16"))
_, caches = model(calib_tokens, caches)
kv = [kvjax.materialize(c) for c in caches]
k = jnp.stack([a for a, _ in kv])                 # [L, B, K, T, H]
v = jnp.stack([b for _, b in kv])
stats = calibration.calibrate([(k, v)], k.shape[0], k.shape[2], k.shape[4])

by_method = {m: calibration.compute_scales(stats, fmt, method=m, margin=1.0)
             for m in ("absmax", "percentile", "mse")}
for m, s in by_method.items():
  print(f"{m:10s} key clip (layer 0, mean over channels) {float(s.k[0].mean() * fmt.key.max):7.3f} "
        f"| value clip {float(s.v[0].mean() * fmt.value.max):7.3f}")
"""),
      md("""
Which is best is measured, not assumed: negative log-likelihood of the last
64 tokens of the evaluation windows, each predicted by a decode step from
the static-FP8 cache (`evaluate.score_tail`). Unit scales (no calibration)
and per-token FP8 are the baselines. All static runs share one compiled
program: scales are arrays, not static arguments. On 128 scored tokens
differences of a few thousandths of a nat are noise; the committed quality
run scores 16 x 128 tokens per cell at 1k, 4k and 8k context.
"""),
      code("""
split = T - 64
def nll(fmt, scales=None):
  n, _ = evaluate.score_tail(model, eval_tokens, split, fmt, scales=scales, chunk=split)
  return float(n.mean())

base = nll(kvjax.preset("bf16"))
runs = {"per-token fp8_e4m3": nll(kvjax.preset("fp8_e4m3")), "static, unit scales": nll(fmt)}
for m, s in by_method.items():
  runs[f"static, {m}"] = nll(fmt, s)
runs["static, absmax x2 (quality run)"] = nll(fmt, scales)
print(f"bf16 NLL {base:.4f} nats/token")
for name, val in runs.items():
  print(f"{name:32s} {val:.4f}  ({val - base:+.4f})")
"""),
      md("""
Saving and loading: safetensors, with the convention in the metadata
(`x ~= code * scale`). Checkpoints that store the inverse or the absmax
convert at load (`convention="inverse" | "absmax"`).
"""),
      code("""
path = f"{tempfile.mkdtemp()}/kv_scales.safetensors"
kvjax.save_scales(path, scales, fmt)
loaded = kvjax.load_scales(path)
print(path.split("/")[-1], "| equal after round trip:",
      bool(jnp.array_equal(loaded.k, scales.k) and jnp.array_equal(loaded.v, scales.v)))
caches = model.init_cache(2, T, fmt, scales=loaded)   # ready to serve with static FP8
print("layer 0 key scale in the cache:", caches[0].k.scale.shape)
"""),
      md("""
## Next steps

- `benchmarks/quality.py` for the full quality sweep (GPU recommended).
- `benchmarks/decode_kernels.py --check` to time the kernels on your GPU.
- `drop_into_gemma.ipynb` to use a calibrated cache inside a Flax decode loop.
"""),
  ]


# ---------------------------------------------------------------------------------------------
# drop_into_gemma
# ---------------------------------------------------------------------------------------------
