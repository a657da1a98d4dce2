"""The main job (README's first command): memory and accuracy of every format.

For keys with outlier channels (as in real LLMs) and ordinary values, prints
and writes as JSON, per format: bytes per token, compression vs bf16, how many
32k-token sequences of a Llama-3-8B-shaped model fit in 16 GiB, K/V
reconstruction error and attention-output error vs the bf16 cache.

Then generates with the embedded default model (or ``--checkpoint DIR``, a HF
checkpoint) in every format and prints cache memory, time per generated token
and agreement with the bf16 cache's tokens (`kvjax.demo_generate`).

  python -m kvjax.demo [--out benchmarks/results/memory_accuracy.json] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from kvjax import attention, calibration, formats, memory, synthetic
from kvjax.cache import append, init_cache, materialize

# FP8 is floating point: 2x headroom over the calibration absmax costs one binade
# at the bottom of e4m3's 2^15 range, and keeps later outliers from saturating.
CALIB_MARGIN = 2.0
DEMO_FORMATS = ("bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_static", "int8", "int4", "kivi4",
                "kivi2", "kivi2_g128")


def _rel(a, b, lengths) -> float:
  """Relative L2 error over valid tokens ([B, K, S, H] arrays)."""
  mask = (np.arange(a.shape[2])[None, :] < np.asarray(lengths)[:, None])[:, None, :, None]
  a, b = np.asarray(a, np.float64) * mask, np.asarray(b, np.float64) * mask
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def evaluate(batch: int = 2, num_kv_heads: int = 8, rep: int = 4, context: int = 4096,
             head_dim: int = 128, seed: int = 0, budget_gib: float = 16.0,
             fit_context: int = 32768) -> list[dict]:
  """Measures every format in `DEMO_FORMATS` on one synthetic draw; returns table rows."""
  key = jax.random.PRNGKey(seed)
  kk, kv, kq, kcal = jax.random.split(key, 4)
  shape = (batch, num_kv_heads, context, head_dim)
  k = synthetic.outlier_keys(kk, shape)
  v = synthetic.plain_values(kv, shape)
  q = synthetic.queries(kq, (batch, num_kv_heads * rep, 1, head_dim), keys=k)
  lengths = jnp.array([context - 37 * i for i in range(batch)], jnp.int32)  # ragged
  # Calibration draws from the same distribution, other samples.
  kc1, kc2 = jax.random.split(kcal)
  calib = calibration.calibrate(
      [(synthetic.outlier_keys(kc1, shape)[None], synthetic.plain_values(kc2, shape)[None])],
      1, num_kv_heads, head_dim)
  rows, bf16_out = [], None
  bf16_bpt = memory.bytes_per_token(formats.bf16(), fit_context)
  for name in DEMO_FORMATS:
    fmt = formats.preset(name)
    scales = None
    if fmt.has_static_scales:
      s = calibration.compute_scales(calib, fmt, method="absmax", margin=CALIB_MARGIN)
      scales = (None if s.k is None else s.k[0], None if s.v is None else s.v[0])
    cache = init_cache(fmt, batch, num_kv_heads, memory.round_capacity(fmt, context), head_dim,
                       scales=scales)
    cache = append(cache, jnp.pad(k, ((0, 0), (0, 0), (0, cache.capacity - context), (0, 0))),
                   jnp.pad(v, ((0, 0), (0, 0), (0, cache.capacity - context), (0, 0))), lengths)
    kh, vh = materialize(cache)
    out = attention.decode_attention(q, cache)
    if bf16_out is None:
      bf16_out = out
    exact = attention.attend(q, k, v, attention.decode_mask(lengths, 1, context))
    bpt = memory.bytes_per_token(fmt, fit_context)
    rows.append({
        "format": name,
        "bytes_per_token": round(bpt, 1),
        "compression_vs_bf16": round(bpt / bf16_bpt, 4),
        "seqs_in_budget": memory.sequences_that_fit(fmt, int(budget_gib * memory.GIB), fit_context),
        "key_rel_err": _rel(kh[:, :, :context], k, lengths),
        "value_rel_err": _rel(vh[:, :, :context], v, lengths),
        "attn_rel_err_vs_bf16": float(np.linalg.norm(np.asarray(out - bf16_out, np.float64))
                                      / np.linalg.norm(np.asarray(bf16_out, np.float64))),
        "attn_rel_err_vs_exact": float(np.linalg.norm(np.asarray(out - exact, np.float64))
                                       / np.linalg.norm(np.asarray(exact, np.float64))),
    })
  return rows


def format_table(rows: list[dict], budget_gib: float, fit_context: int) -> str:
  head = (f"| format | bytes/token (Llama-3-8B, all layers) | vs bf16 | seqs of {fit_context // 1024}k "
          f"in {budget_gib:g} GiB | K rel err | V rel err | attn err vs bf16 | attn err vs exact |")
  lines = [head, "|" + "---|" * 8]
  for r in rows:
    lines.append(f"| {r['format']} | {r['bytes_per_token']:.0f} | {r['compression_vs_bf16']:.3f}x | "
                 f"{r['seqs_in_budget']} | {r['key_rel_err']:.2e} | {r['value_rel_err']:.2e} | "
                 f"{r['attn_rel_err_vs_bf16']:.2e} | {r['attn_rel_err_vs_exact']:.2e} |")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="benchmarks/results/memory_accuracy.json")
  p.add_argument("--context", type=int, default=4096, help="tokens in the synthetic cache")
  p.add_argument("--budget-gib", type=float, default=16.0)
  p.add_argument("--fit-context", type=int, default=32768)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--checkpoint", default=None,
                 help="HF checkpoint dir (config.json + *.safetensors) for the generation table")
  p.add_argument("--gen-formats", default=",".join(DEMO_FORMATS),
                 help="comma-separated formats to generate with (bf16 first); empty: skip")
  p.add_argument("--max-new-tokens", type=int, default=56)
  args = p.parse_args(argv)
  t0 = time.perf_counter()
  rows = evaluate(context=args.context, seed=args.seed, budget_gib=args.budget_gib,
                  fit_context=args.fit_context)
  print(format_table(rows, args.budget_gib, args.fit_context))
  gen_rows = []
  gen_formats = [f for f in args.gen_formats.split(",") if f]
  if gen_formats:
    from kvjax import demo_generate  # the model stack loads only when generating
    if gen_formats[0] != "bf16":
      gen_formats.insert(0, "bf16")
    gen_rows = demo_generate.run(gen_formats, checkpoint=args.checkpoint, seed=args.seed,
                                 max_new_tokens=args.max_new_tokens)
    model = demo_generate.model_label(args.checkpoint, args.seed)
    print(f"\nGreedy generation, {model}: 4 ragged prompts of 120-200 tokens, "
          f"{args.max_new_tokens} new tokens")
    print(demo_generate.format_table(gen_rows, args.max_new_tokens))
  if args.out:
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    meta = {"command": "python -m kvjax.demo", "context": args.context, "seed": args.seed,
            "model_shape": "Llama-3-8B: 32 layers, 8 KV heads, head_dim 128",
            "budget_gib": args.budget_gib, "fit_context": args.fit_context,
            "jax": jax.__version__, "backend": jax.default_backend()}
    with open(args.out, "w") as f:
      json.dump({"meta": meta, "rows": rows,
                 "generate": {"model": demo_generate.model_label(args.checkpoint, args.seed) if gen_rows
                              else None, "rows": gen_rows}}, f, indent=1)
    print(f"wrote {args.out} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
  main()
