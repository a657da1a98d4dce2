"""TPU decode roofline: a MODEL, not a measurement (no TPU was used).

Bytes one decode step must move from HBM, per format, computed from kvjax's
own byte accounting of the real cache arrays (`jax.eval_shape` of
`init_cache`: codes, scales, zero points, residual windows; `kvjax.quant.nbytes`),
plus the small extra traffic the TPU wrapper adds (class-ordered per-token
scales for packed formats, the KIVI tail keys), at every sequence full.
Step time = bytes / HBM bandwidth: the floor a memory-bound kernel could reach.

Shape: Llama-3-8B attention (32 layers, 32 query heads, 8 KV heads,
head_dim 128), batch 8, 32k context. Bandwidths (Google Cloud TPU docs,
system architecture pages): v5e 819 GB/s, v6e (Trillium) 1640 GB/s per chip.

  .venv/bin/python benchmarks/tpu_roofline.py   # writes benchmarks/results/tpu_roofline.json
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp

from kvjax import cache as cache_lib, formats, quant

BATCH, CONTEXT, LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = 8, 32768, 32, 32, 8, 128
HBM = {"v5e": 819e9, "v6e": 1640e9}
HBM_GIB = {"v5e": 16, "v6e": 32}  # capacity per chip
SOURCES = {
    "v5e": "https://cloud.google.com/tpu/docs/v5e (819 GB/s HBM2 bandwidth per chip)",
    "v6e": "https://cloud.google.com/tpu/docs/v6e (1640 GB/s HBM bandwidth per chip)",
    "model": "Llama-3-8B config: 32 layers, 32 heads, 8 KV heads, head_dim 128",
}
FORMATS = ("bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_static", "int8", "int4", "kivi4", "kivi2",
           "kivi2_g128")


def _size(x) -> int:
  return int(x.size) * jnp.dtype(x.dtype).itemsize


def layer_bytes(fmt_name: str) -> dict:
  """HBM bytes of one layer's decode step with every sequence at full context."""
  fmt = formats.preset(fmt_name)
  c = jax.eval_shape(lambda: cache_lib.init_cache(fmt, BATCH, KV_HEADS, CONTEXT, HEAD_DIM))
  cache_bytes = quant.nbytes(c)  # everything the kernel streams: codes, scales, zeros, residuals
  extra = 0
  packed = fmt.is_kivi or getattr(fmt.key, "bits", 8) == 4
  if packed:  # wrapper re-lays per-token scales class-ordered: read + write, read by the kernel
    per_token = [a for a in (c.v.scale, c.v.zero) + ((c.k.scale,) if not fmt.is_kivi else ())
                 if a is not None]
    extra += 2 * sum(_size(a) for a in per_token)
  if fmt.is_kivi:  # tail keys: gather one packing block, write R x H f32, kernel reads it
    r = fmt.residual
    tail_f32 = BATCH * KV_HEADS * r * HEAD_DIM * 4
    extra += 2 * tail_f32 + _size(c.k_res)
  q_out = 2 * BATCH * Q_HEADS * HEAD_DIM * 2  # bf16 q in, out
  return {"cache_bytes": cache_bytes, "wrapper_extra_bytes": extra, "q_out_bytes": q_out,
          "total_bytes": cache_bytes + extra + q_out}


def main(path: str = "benchmarks/results/tpu_roofline.json") -> dict:
  rows = {}
  base = None
  for name in FORMATS:
    lb = layer_bytes(name)
    step = lb["total_bytes"] * LAYERS
    base = base or step
    rows[name] = {
        **{f"layer_{k}": v for k, v in lb.items()},
        "step_bytes_all_layers": step,
        "bytes_per_token_per_layer": lb["cache_bytes"] / (BATCH * CONTEXT),
        "vs_bf16": round(base / step, 3),
        **{f"step_us_{chip}": round(step / bw * 1e6, 1) for chip, bw in HBM.items()},
        "step_us_v5e_cache_only": round(lb["cache_bytes"] * LAYERS / HBM["v5e"] * 1e6, 1),
        "cache_gib_all_layers": round(lb["cache_bytes"] * LAYERS / 2**30, 2),
        **{f"fits_one_{chip}": lb["cache_bytes"] * LAYERS < gib * 2**30
           for chip, gib in HBM_GIB.items()},
    }
  result = {
      "kind": "MODEL (bytes / HBM bandwidth; not a measurement: no TPU was used)",
      "shape": {"batch": BATCH, "context": CONTEXT, "layers": LAYERS, "q_heads": Q_HEADS,
                "kv_heads": KV_HEADS, "head_dim": HEAD_DIM},
      "hbm_bytes_per_s": HBM,
      "sources": SOURCES,
      "formats": rows,
  }
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  print("MODEL, not a measurement. B=8, 32k context, Llama-3-8B attention, 32 layers")
  print(f"{'format':16s} {'MB/step':>9s} {'vs bf16':>8s} {'v5e us':>9s} {'v6e us':>9s} {'GiB':>6s}")
  for name, r in rows.items():
    print(f"{name:16s} {r['step_bytes_all_layers'] / 1e6:9.1f} {r['vs_bf16']:8.2f} "
          f"{r['step_us_v5e']:9.1f} {r['step_us_v6e']:9.1f} {r['cache_gib_all_layers']:6.1f}")
  return result


if __name__ == "__main__":
  main()
