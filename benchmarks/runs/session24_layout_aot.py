"""Session 24: which KIVI Mosaic builds Mosaic GPU's layout inference can solve, compiled for an H200 on the CPU
(no GPU: `bash benchmarks/runs/aot_setup.sh`). Each case in a subprocess with a time limit; prints and writes
(--out) the compile seconds or the error. The native "hangs" of the in-kernel merge (sessions 22-23) were these
compiles: the search runs 20-260 s, then fails.

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session24_layout_aot.py \
      [--cases a,b] [--timeout 120] [--out F.json]

Cases: "states:ROWS:DTYPE[:merged]" (`kivi2_states` on a 2 x 1 x 512 G=128 cache, 2 splits, no window, the query
prepared by XLA; merged: the states merged in the kernel into rows of DTYPE) and "ops:FMT:HEADS:T[:q]"
(`mosaic_decode.decode_attention`, window in the kernel, default glue; q: the query read in the kernel at any row
count, session 24's `QUERY_IN_KERNEL_MAX_ROWS` lifted: since session 25 there is no limit and q changes nothing).
Session 25's run (the masked `load_query_t`): `decode_parts/session25/layout_aot_h200.json`.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("states:4:float32:merged", "states:8:bfloat16:merged", "ops:kivi2_g128:4:1", "ops:kivi2_g128:8:1",
         "ops:kivi2:4:4", "ops:kivi2_g128:8:1:q", "ops:kivi2_g128:4:2:q")


def one(case):
  sys.path.insert(0, os.path.join(HERE, "..", ".."))
  sys.path.insert(0, HERE)
  import jax
  import jax.numpy as jnp
  from aot_h200 import h200
  from kvjax import cache as cache_lib, formats
  from pallas_kernels import test_base
  from pallas_kernels.gpu import mosaic_decode as md, mosaic_kivi as mk
  kind, *p = case.split(":")
  if kind == "states":
    rows, dtype, merged = int(p[0]), jnp.dtype(p[1]), p[2:] == ["merged"]
    q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case((300, 2), num_kv_heads=1, capacity=512)
    args = (q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
    kw = dict(num_splits=2, variant=md.DEFAULT_VARIANT, interpret=False)
    if merged:
      kw.update(merged=(rows, dtype), merge_by="count")
    fn = lambda *a: mk.kivi2_states(*a, **kw)
  else:
    fmt, heads, t = formats.preset(p[0]), int(p[1]), int(p[2])
    args = (jax.ShapeDtypeStruct((2, heads, t, 128), jnp.bfloat16),
            jax.eval_shape(lambda: cache_lib.init_cache(fmt, 2, 1, 1024, 128, kivi_layout="words")))
    fn = lambda q, c: md.decode_attention(q, c, num_splits=2, window="kernel", interpret=False)
  with h200() as place:
    placed = place(args)
    t0 = time.perf_counter()
    jax.jit(fn).trace(*placed).lower().compile()
  return time.perf_counter() - t0


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--cases", default=",".join(CASES))
  ap.add_argument("--timeout", type=float, default=120)
  ap.add_argument("--one", default="")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  if args.one:
    print(json.dumps({"seconds": round(one(args.one), 1)}))
    return
  rows = []
  for case in args.cases.split(","):
    t0 = time.perf_counter()
    try:
      r = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True, text=True,
                         timeout=args.timeout)
      lines = r.stdout.strip().splitlines()
      err = [x for x in r.stderr.splitlines() if "Error" in x][-1:]
      row = json.loads(lines[-1]) if r.returncode == 0 and lines else {"error": (err or [r.stderr[-200:]])[0][:200]}
    except subprocess.TimeoutExpired:
      row = {"error": f"not built within {args.timeout:.0f} s"}
    rows.append({"case": case, **row, "wall": round(time.perf_counter() - t0, 1)})
    print(rows[-1], flush=True)
    if args.out:
      with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
  main()
