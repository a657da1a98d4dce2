"""The Mosaic kernels' arithmetic on real activations: the shipped reference LM's keys and values.

Session 17 made the kernel's default read the 2-bit planes as fp16 subnormals (`Options(unpack="denorm")`:
the scales carry 2^(10 - 2j), the dequantized values sit in A as (c s + z) / 2^14, a subnormal floor of
2^-11 on values under 1). Random test data says little about real caches, so this runs the reference LM
over held-out code, stores each layer's post-RoPE keys and values in a KIVI-2 G=128 "words" cache
(`kvjax.cache.prefill`: the library's own quantization), and compares, per layer, on the same cache:

  * the kernel (Mosaic GPU's CPU interpreter: the same arithmetic as the device, fp16 subnormals included)
    with the default preset and with session 16's (`dequant_mask_s16_bal_om`, the 0x6400 path), against
  * the library's reference (`kvjax.attention.decode_attention`, f32 over the same quantized cache),

and, for scale, the quantization's own error (the reference against bf16 attention over the unquantized
keys and values), and the largest key / value scale against the denorm bound 2^(DENORM_LOG2 - 8).
Queries: each KV head's own keys at the last positions (real channel structure; the model's queries are
not in the cache). Output relative L2 errors over all heads and query rows.

  python benchmarks/mosaic_precision.py            # CPU, about two minutes

`--kernel fp8` does the same for the Mosaic FP8 kernel (`pallas_kernels.gpu.mosaic_fp8`, session 18): an
FP8 cache (`--format`, values in 64-token tiles), its builds (`Fp8Options` as text: fp16 keys, and the
8-bit key products against q in 2 or 3 e4m3 terms) against the same reference
(results/mosaic_precision_fp8.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kvjax import attention, cache as kvcache, formats  # noqa: E402
from kvjax.quality import reference_lm  # noqa: E402
from pallas_kernels import test_base  # noqa: E402
from pallas_kernels.gpu import mosaic_decode as md, mosaic_fp8 as mf, mosaic_kivi as mk  # noqa: E402

OLD_DEFAULT = "dequant_mask_s16_bal_om"  # session 16's


def layer_row(k, v, queries: int, variants, fmt_name: str = "kivi2_g128") -> dict:
  """Errors of each variant, the quantization's error and the largest scales for one layer's k, v.
  A KIVI format runs the KIVI-2 kernel's presets (`variants`), an FP8 one the FP8 kernel's builds."""
  b, kh, t, h = k.shape
  fmt = formats.preset(fmt_name)
  fp8 = not fmt.is_kivi
  c = kvcache.init_cache(fmt, b, kh, t, h, **({"value_tile": 64} if fp8 else {"kivi_layout": "words"}))
  c = kvcache.prefill(c, k, v, jnp.full((b,), t, jnp.int32))
  q = k[:, :, t - queries:].reshape(b, kh * queries, 1, h)  # query head i of KV head i // queries
  ref = np.asarray(attention.decode_attention(q, c))
  dense = np.asarray(attention.decode_attention(
      q, kvcache.prefill(kvcache.init_cache(formats.bf16(), b, kh, t, h), k, v, jnp.full((b,), t, jnp.int32))))
  row = {"quantization_rel_err": test_base.relative_error(ref, dense),
         "key_scale_max": float(jnp.max(c.k.scale.astype(jnp.float32))),
         "value_scale_max": float(jnp.max(c.v.scale.astype(jnp.float32))),
         "key_abs_max": float(jnp.max(jnp.abs(k))), "value_abs_max": float(jnp.max(jnp.abs(v)))}
  for name in variants:
    out = np.asarray(mf.decode_attention(q, c, options=mf.Fp8Options.parse(name), interpret=True) if fp8
                     else md.decode_attention(q, c, variant=name, interpret=True))
    row[f"{name}_rel_err"] = test_base.relative_error(out, ref)
  return row


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tokens", type=int, default=1024, help="context per window (a multiple of 128)")
  ap.add_argument("--windows", type=int, default=2, help="held-out windows (the batch)")
  ap.add_argument("--queries", type=int, default=2, help="query heads per KV head (the model's: 2)")
  ap.add_argument("--layers", default="", help="comma-separated layers (default: all)")
  ap.add_argument("--variants", default=None, help="KIVI-2 presets (default: the default and session 16's) or, "
                  "with --kernel fp8, Fp8Options builds (default: fp8, fp8+key_terms=2, fp8+key_terms=3)")
  ap.add_argument("--kernel", default="kivi2", choices=("kivi2", "fp8"))
  ap.add_argument("--format", default=None, help="the cache's format (default kivi2_g128, or fp8_e4m3 with --kernel fp8)")
  ap.add_argument("--out", default=None, help="default benchmarks/results/mosaic_precision[_fp8].json")
  args = ap.parse_args(argv)
  fp8 = args.kernel == "fp8"
  fmt_name = args.format or ("fp8_e4m3" if fp8 else "kivi2_g128")
  if args.variants is None:
    args.variants = "fp8,fp8+key_terms=2,fp8+key_terms=3" if fp8 else f"{md.DEFAULT_VARIANT},{OLD_DEFAULT}"
  args.out = args.out or f"benchmarks/results/mosaic_precision{'_fp8' if fp8 else ''}.json"
  if args.tokens % mk.TILE:
    raise ValueError(f"--tokens must be a multiple of {mk.TILE}, got {args.tokens}")
  variants = [v for v in args.variants.split(",") if v]
  kv = [tuple(map(jnp.asarray, pair)) for pair in reference_lm.heldout_kv(args.tokens, args.windows)]
  layers = [int(x) for x in args.layers.split(",") if x] or list(range(len(kv)))
  rows = []
  for layer in layers:
    row = {"layer": layer, **layer_row(*kv[layer], args.queries, variants, fmt_name)}
    rows.append(row)
    print(json.dumps(row), flush=True)
  result = {"command": "python benchmarks/mosaic_precision.py " + " ".join(argv or sys.argv[1:]),
            "tokens": args.tokens, "windows": args.windows, "format": fmt_name,
            **({} if fp8 else {"denorm_scale_bound": 2.0 ** (mk.DENORM_LOG2 - 8)}),
            "variants": variants, "rows": rows}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as fh:
    json.dump(result, fh, indent=1)
  head = " | ".join(f"{v} vs reference" for v in variants)
  print(f"| layer | {head} | quantization (reference vs bf16) | key / value scale max |")
  print("|---" * (3 + len(variants)) + "|")
  for r in rows:
    errs = " | ".join(f"{r[f'{v}_rel_err']:.2e}" for v in variants)
    print(f"| {r['layer']} | {errs} | {r['quantization_rel_err']:.2e} | {r['key_scale_max']:.2f} / "
          f"{r['value_scale_max']:.2f} |")
  return result


if __name__ == "__main__":
  main()
