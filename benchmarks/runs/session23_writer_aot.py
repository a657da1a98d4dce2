"""Session 23: the one-kernel writer (`pallas_kernels.gpu.write.append`, interpret=False) over a "words" cache,
compiled for an H200 on the CPU (no GPU: the CUDA plugin and ptxas, `bash benchmarks/runs/aot_setup.sh`), per
format and T: the compile time, or the error. On the H100 the 4-bit words writer's native test and step
timing did not finish within their limits (`decode_parts/session23/e_pytest.txt`); this tells a compile
that does not end from a kernel that does not.

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session23_writer_aot.py \
      --target-config benchmarks/results/h200_target_config.txtpb [--formats kivi2,kivi4] [--timeout 300]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def one(fmt_name, t, target_config, g128):
  import jax
  import jax.numpy as jnp
  sys.path.insert(0, os.path.dirname(__file__))
  from aot_h200 import h200
  from kvjax import cache as cache_lib, formats
  from pallas_kernels.gpu import write
  write.NATIVE_WORDS_BITS = (2, 4)  # what is compiled here is the kernel the gate held back (session 23)
  fmt = formats.kivi(int(fmt_name[4]), 128, 128) if g128 else formats.preset(fmt_name)
  b, kh, s = 8, 8, 32768
  with h200(target_config) as place:
    cache = place(jax.eval_shape(lambda: cache_lib.init_cache(fmt, b, kh, s, 128, kivi_layout="words")))
    kv = place(jax.ShapeDtypeStruct((b, kh, t, 128), jnp.bfloat16))
    t0 = time.perf_counter()
    jax.jit(lambda c, k, v: write.append(c, k, v, interpret=False), donate_argnums=0).trace(cache, kv, kv).lower().compile()
  return time.perf_counter() - t0


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--target-config", required=True)
  ap.add_argument("--formats", default="kivi2,kivi4,kivi2_g128,kivi4_g128")
  ap.add_argument("--ts", default="1,3")
  ap.add_argument("--timeout", type=float, default=300)
  ap.add_argument("--one", default="")
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  if a.one:
    name, t = a.one.split(":")
    print(json.dumps({"seconds": one(name.removesuffix("_g128"), int(t), a.target_config, name.endswith("_g128"))}))
    return
  rows = []
  for name in a.formats.split(","):
    for t in a.ts.split(","):
      t0 = time.perf_counter()
      try:
        r = subprocess.run([sys.executable, __file__, "--target-config", a.target_config, "--one", f"{name}:{t}"],
                           capture_output=True, text=True, timeout=a.timeout)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        errs = [x for x in r.stderr.splitlines() if "Error" in x and "For simplicity" not in x]
        row = json.loads(last) if r.returncode == 0 else {"error": (errs or ["rc %d" % r.returncode])[-1][:300]}
      except subprocess.TimeoutExpired:
        row = {"error": f"no compile within {a.timeout:.0f} s"}
      row.update(format=name, t=int(t), wall=round(time.perf_counter() - t0, 1))
      print(row, flush=True)
      rows.append(row)
  if a.out:
    json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
  main()
