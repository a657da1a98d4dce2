"""What the Mosaic GPU KIVI-2 kernel (`pallas_kernels.gpu.mosaic_kivi`; `--kernel fp8`: the FP8 one,
`pallas_kernels.gpu.mosaic_fp8`, builds named 'name:fp8[+field=value...]' over `Fp8Options`) compiles to, on a GPU: for each
build (a variant, with or without the residual window as one more program, or that and the merge in the
kernel: ":merged"), the registers per thread
and spills from ptxas, the resident programs per SM they allow, and the kernel's time alone (B=8, 32k,
8 splits, same caches as `mosaic_kivi_bench.py`); with --ptxas / --nvdisasm the tile loop's SASS (its
instruction count and mix per 128-token tile, `ptx_registers.py`). With --target-config it compiles for
an H200 on a machine without one (no timing).

    python3 benchmarks/mosaic_sass.py --builds 'base:dequant_mask_s16_bal;window:dequant_mask_s16_bal:window' \
        --out $OUT/mosaic_sass.json --dumps $OUT/dumps.tar.gz

Mosaic GPU writes its compiler dumps (PTX, the ptxas log) to the directory named by MOSAIC_GPU_DUMP_TO
when MOSAIC_GPU_DUMP_{PTX,PTXAS} are set (read at each compilation, so one directory per build here).
The raw dumps go into one tarball (`--dumps`).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import decode_kernels as dk  # noqa: E402
import ptx_registers  # noqa: E402
from mosaic_kivi_bench import caches_for  # noqa: E402
from pallas_kernels.gpu import decode, mosaic_decode as md, mosaic_fp8 as mf, mosaic_kivi as mk  # noqa: E402

REGS_PER_SM, THREADS = 65536, 128  # one warpgroup per program
SMEM_PER_SM = 228 * 1024  # H100 / H200


def pipeline_stages(text: str):
  """(the build's text without '+stages=N', N or 2): the KIVI kernel's pipeline depth, not an Options field
  (an FP8 build's `Fp8Options.stages` stays in its text)."""
  parts = text.split("+")
  if parts[0] == "fp8":
    return text, 2
  stages = [int(p.partition("=")[2]) for p in parts if p.startswith("stages=")]
  return "+".join(p for p in parts if not p.startswith("stages=")), stages[-1] if stages else 2


def variant_options(text: str):
  """'preset' or 'preset+field=value+...' (an `mk.Options` field over a preset: 'dequant_denorm+lag=2');
  'fp8[+field=value...]': an `mf.Fp8Options`."""
  base, *edits = text.split("+")
  if base == "fp8":
    return mf.Fp8Options.parse(text)
  if base not in mk.VARIANTS:
    raise ValueError(f"--builds: variant must be one of {tuple(mk.VARIANTS) + ('fp8',)}, got {base!r}")
  fields = {f.name: f for f in dataclasses.fields(mk.Options)}
  changes = {}
  for edit in edits:
    key, _, val = edit.partition("=")
    if key not in fields:
      raise ValueError(f"--builds: {key!r} is not an Options field (one of {tuple(fields)})")
    changes[key] = None if val == "None" else {"True": True, "False": False}.get(val, int(val) if val.isdigit() else val)
  return dataclasses.replace(mk.VARIANTS[base], **changes)


def parse_builds(text):
  """'name:variant[:window|:glue|:gemma|:merged|:merged_cluster];...' -> [(name, variant, window)], variant as
  `variant_options` reads it; window "" (none), "window" (the residual window as one more program), "glue" (that,
  the query read and the quantized lengths computed in the kernel: `mosaic_decode`'s default) or "merged"
  (that, and the states merged in the kernel, `kivi2_states(merged=...)`, by `mosaic_decode.MERGE_BY`;
  "merged_cluster": over a cluster); "gemma": "glue" with Gemma 2's logit soft-cap (50) and sliding window (4096)."""
  out = []
  for item in filter(None, text.split(";")):
    parts = item.split(":")
    kinds = ("window", "glue", "gemma", "merged", "merged_cluster")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in kinds):
      raise ValueError(f"--builds: each item must be name:variant[:{'|:'.join(kinds)}], got "
                       f"{item!r}")
    variant_options(pipeline_stages(parts[1])[0])
    out.append((parts[0], parts[1], parts[2] if len(parts) == 3 else ""))
  return out


def window_inputs(b, kh, lengths, key):
  """(full lengths, k_res, v_res) for `kivi2_states(window=...)`: random bf16 rings."""
  k1, k2 = jax.random.split(key)
  ring = lambda kk: jax.random.normal(kk, (b, kh, mk.TILE, 128), jnp.bfloat16)
  return lengths, ring(k1), ring(k2)


def fp8_caches(b, ctx, key, dtype=jnp.float8_e4m3fn):
  """Random FP8 (k, ks, v, vs) caches for `mf.fp8_states` (values as 64-token tiles) to rotate beyond L2,
  their bytes read at ctx - 256 tokens, lengths."""
  kh = dk.SHAPE.k_heads

  def one(kk):
    k1, k2, k3, k4 = jax.random.split(kk, 4)
    codes = lambda x: jnp.clip(jax.random.normal(x, (b, kh, ctx, dk.SHAPE.head_dim)) * 40, -127, 127).astype(dtype)
    scales = lambda x: jax.random.uniform(x, (b, kh, ctx), minval=0.002, maxval=0.03).astype(jnp.bfloat16)
    return codes(k1), scales(k2), codes(k3), scales(k4)
  c0 = one(key)
  nbytes = sum(x.nbytes for x in c0)
  caches = (c0,) + tuple(one(jax.random.fold_in(key, i)) for i in range(1, dk.n_sets(nbytes)))
  return caches, nbytes * (ctx - 256) / ctx, jnp.full((b,), ctx - 256, jnp.int32)


def states_fn(variant, splits, window, stages=2):
  """q [B, N, 1, H] + a cache -> [B, N, 1, H] through the kernel's states and the XLA merge, or the kernel
  alone where it preps q and merges (an FP8 build with fused=True: `fp8_attention`; window "merged")."""
  def f(q, lengths, cache, win):  # win: (full lengths, k_res, v_res); one query token
    b, n, _, h = q.shape
    kh = cache[0].shape[1]
    rep = n // kh
    scale = h ** -0.5 * decode.LOG2E
    if isinstance(variant, mf.Fp8Options) and variant.fused:
      out = mf.fp8_attention(q.reshape(b, kh, rep, h), scale, lengths, *cache, num_splits=splits, options=variant)
      return out.reshape(b, n, 1, h)
    q_t = (q.astype(jnp.float32).reshape(b, kh, rep, h) * scale).swapaxes(-1, -2)
    q_t = jnp.pad(q_t, ((0, 0), (0, 0), (0, 0), (0, mk.ROWS - rep)))
    if isinstance(variant, mf.Fp8Options):  # "gemma": Gemma 2's soft-cap and sliding window
      gemma = dict(softcap=50.0, sliding=4096) if window == "gemma" else {}
      o_t, m, l = mf.fp8_states(q_t, lengths, *cache, num_splits=splits, options=variant, live_rows=rep, **gemma)
      return decode.combine(o_t.swapaxes(-1, -2), m, l, rep).reshape(b, n, 1, h).astype(q.dtype)
    kern_len = jnp.maximum(lengths - mk.TILE, 0) if window else lengths
    if window in ("glue", "gemma"):  # as `mosaic_decode` calls it by default: q as given, the lengths from the window's
      gemma = dict(softcap=50.0, sliding=4096) if window == "gemma" else {}
      o_t, m, l = mk.kivi2_states(q.reshape(b, kh, rep, h), None, *cache, num_splits=splits, variant=variant,
                                  window=(*win, 1), q_scale=scale, stages=stages, **gemma)
      return decode.combine(o_t.swapaxes(-1, -2), m, l, rep).reshape(b, n, 1, h).astype(q.dtype)
    if window.startswith("merged"):  # as `mosaic_decode` calls it: q as given, prepared and merged in the kernel
      return mk.kivi2_states(q.reshape(b, kh, rep, h), kern_len, *cache, num_splits=splits, variant=variant,
                             window=(*win, 1), merged=(rep, q.dtype), q_scale=scale,
                             merge_by="cluster" if window == "merged_cluster" else md.MERGE_BY).reshape(b, n, 1, h)
    o_t, m, l = mk.kivi2_states(q_t, kern_len, *cache, num_splits=splits, variant=variant,
                                window=(*win, 1) if window else None, live_rows=rep, stages=stages)
    return decode.combine(o_t.swapaxes(-1, -2), m, l, rep).reshape(b, n, 1, h).astype(q.dtype)
  return f


def read_dumps(d):
  """The files of one build's dump directory, and ptxas's registers and spills from its log."""
  files = sorted(os.path.relpath(p, d) for p in glob.glob(os.path.join(d, "*")) if os.path.isfile(p))
  out = {"files": files}
  for name in files:
    if name.endswith("resources.txt") and (m := re.search(r"smem_scratch_bytes=(\d+)", open(os.path.join(d, name)).read())):
      out["smem_bytes"] = int(m.group(1))  # Mosaic's shared memory per program (+ 1 KB the CUDA runtime keeps)
      out["programs_per_sm_by_smem"] = SMEM_PER_SM // (out["smem_bytes"] + 1024)
    if not name.endswith(".ptxas"):
      continue
    t = open(os.path.join(d, name), errors="replace").read()
    if m := re.search(r"Used (\d+) registers", t):
      out["registers"] = int(m.group(1))
      sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", t)
      out["spill_store_bytes"], out["spill_load_bytes"] = (int(sp.group(1)), int(sp.group(2))) if sp else (None, None)
      out["ptxas_log"] = t[-2000:]
      out["programs_per_sm_by_registers"] = REGS_PER_SM // (-(-out["registers"] // 8) * 8 * THREADS)
  return out


def aot_args(target_config: str, b: int, ctx: int, scale_dtype=jnp.bfloat16, kernel="kivi2", group=128, bits=2,
             codes=jnp.float8_e4m3fn):
  """(q, lengths, cache, window) as shapes on one compile-only H200 of `target_config` (a GpuTargetConfig
  text proto): compiling for it needs no GPU, only the CUDA plugin and ptxas (CUDA_ROOT)."""
  from jax.experimental import topologies
  topo = topologies.get_topology_desc(platform="cuda", target_config=open(target_config).read(), topology="1x1x1")
  on = jax.sharding.SingleDeviceSharding(topo.devices[0])
  sd = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=on)
  kh, g, h = dk.SHAPE.k_heads, ctx // mk.TILE, dk.SHAPE.head_dim  # --shape
  per_token = (b, kh, ctx) if group == 128 and h == 128 else (b, kh, ctx, h // group)
  cache = (sd((b, kh, ctx, h * bits // 16), jnp.uint16), sd((b, kh, ctx // group, h), scale_dtype),
           sd((b, kh, ctx // group, h), scale_dtype), sd((b, kh, g, h, 8 * bits), jnp.uint16), sd(per_token, scale_dtype),
           sd(per_token, scale_dtype))
  if kernel == "fp8":
    cache = (sd((b, kh, ctx, h), codes), sd((b, kh, ctx), scale_dtype), sd((b, kh, ctx, h), codes),
             sd((b, kh, ctx), scale_dtype))
  ring = sd((b, kh, mk.TILE, h), jnp.bfloat16)
  lengths = sd((b,), jnp.int32)
  return sd((b, dk.SHAPE.n_heads, 1, dk.SHAPE.head_dim), jnp.bfloat16), lengths, cache, (lengths, ring, ring)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--builds", default="base:dequant_mask_s16_bal;window:dequant_mask_s16_bal:window")
  ap.add_argument("--point", default="8:32768", help="batch:context")
  ap.add_argument("--splits", type=int, default=8)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--dump-root", default="/tmp/mosaic_dumps")
  ap.add_argument("--dumps", default="", help="tarball of the raw dumps")
  ap.add_argument("--target-config", default="", help="compile only, for this GpuTargetConfig text proto "
                  "(no GPU: benchmarks/results/h200_target_config.txtpb); no timing")
  ap.add_argument("--ptxas", default="", help="with --nvdisasm: the tile loop's SASS and register life "
                  "ranges of each build (benchmarks/ptx_registers.py)")
  ap.add_argument("--nvdisasm", default="")
  ap.add_argument("--scale-dtype", default="bfloat16", choices=("bfloat16", "float16"),
                  help="the caches' scales and zeros (a kvjax cache holds bf16 by default)")
  ap.add_argument("--kernel", default="kivi2", choices=("kivi2", "fp8"), help="which Mosaic kernel's builds")
  ap.add_argument("--codes", default="float8_e4m3fn", choices=("float8_e4m3fn", "float8_e5m2", "int8"),
                  help="the code dtype of --kernel fp8's caches (int8: an INT8 cache)")
  ap.add_argument("--group", type=int, default=128, choices=(128, 32), help="KIVI's group size G (--kernel kivi2)")
  ap.add_argument("--bits", type=int, default=2, choices=(2, 4), help="KIVI's code width (--kernel kivi2)")
  ap.add_argument("--shape", default="llama3_8b", choices=tuple(dk.SHAPES),
                  help="the head shape (with --target-config; gemma2_2b: head_dim 256)")
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  dk.SHAPE = dk.SHAPES[args.shape]
  builds = parse_builds(args.builds)
  for name, variant, window in builds:
    if isinstance(variant_options(pipeline_stages(variant)[0]), mf.Fp8Options) != (args.kernel == "fp8") or \
        window not in ("", "gemma") and args.kernel == "fp8":
      raise ValueError(f"--builds: {name} ({variant}{', ' + window if window else ''}) is not a build of --kernel "
                       f"{args.kernel} (fp8 builds: 'name:fp8[+field=value...][:gemma]')")
  b, ctx = map(int, args.point.split(":"))
  key = jax.random.PRNGKey(0)
  if args.target_config:
    q, lengths, cache, win = aot_args(args.target_config, b, ctx, jnp.dtype(args.scale_dtype), args.kernel, args.group,
                                      args.bits, jnp.dtype(args.codes))
  else:
    if args.kernel == "fp8":
      caches, nbytes, lengths = fp8_caches(b, ctx, key, jnp.dtype(args.codes))
    else:
      caches, nbytes, lengths = caches_for(b, ctx, key, jnp.dtype(args.scale_dtype), group=args.group, bits=args.bits)
    cache = caches[0]
    win = window_inputs(b, dk.SHAPE.k_heads, lengths, jax.random.fold_in(key, 7))
    q = jax.random.normal(jax.random.fold_in(key, 99), (b, dk.SHAPE.n_heads, 1, dk.SHAPE.head_dim), jnp.bfloat16)
  rows = []
  for name, variant, window in builds:
    d = os.path.join(args.dump_root, name)
    shutil.rmtree(d, ignore_errors=True)  # an earlier run's dumps would be read as this build's
    os.makedirs(d)
    os.environ.update(MOSAIC_GPU_DUMP_TO=d, MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_PTXAS="1")
    text, stages = pipeline_stages(variant)
    f = states_fn(variant_options(text), args.splits, window, stages)
    if args.target_config:
      jax.jit(f).trace(q, lengths, cache, win).lower().compile()
    else:
      jax.block_until_ready(jax.jit(f)(q, lengths, cache, win))  # compiles (dumps) once
    for k in ("MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_PTX", "MOSAIC_GPU_DUMP_PTXAS"):
      os.environ.pop(k)
    row = {"build": name, "variant": variant, "window": window, "batch": b, "context": ctx, "splits": args.splits,
           "scale_dtype": args.scale_dtype, "group": args.group, "bits": args.bits, "shape": args.shape}
    if not args.target_config:
      row["device_kind"] = jax.devices()[0].device_kind
      def step(x, f=f):
        q, cs = x
        for c in cs:
          q = dk.chain(q, f(q, lengths, c, win))
        return q, cs
      row["us"] = round(dk.time_loop(step, (q, caches), max(1, dk.steps_for(nbytes / 2e6) // len(caches)),
                                     args.reps) / len(caches), 2)
    row.update(read_dumps(d))
    if args.ptxas and args.nvdisasm:
      ptx = sorted(glob.glob(os.path.join(d, "*.ptx")))[-1]
      sass = ptx_registers.compile_ptx(ptx, args.ptxas, args.nvdisasm)
      row.update({f"sass_{k}": v for k, v in sass.items() if k not in ("ptx", "registers", "spill_store_bytes")})
    print(json.dumps({k: v for k, v in row.items() if k not in ("ptxas_log", "files")}), flush=True)
    rows.append(row)
  with open(args.out, "w") as fh:
    json.dump(rows, fh, indent=1)
  if args.dumps:
    with tarfile.open(args.dumps, "w:gz") as tar:
      tar.add(args.dump_root, arcname="dumps")
  return rows


if __name__ == "__main__":
  main()
