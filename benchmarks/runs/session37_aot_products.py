"""Session 37: `benchmarks/fp8_products.py`'s builds compiled for an H200 on the CPU: registers and the loop's
SASS mix (ptxas may unroll the loop: e4m3's 4x).

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session37_aot_products.py \
      OUT.json [fp16:16,e4m3:16,e4m3:8,e4m3_kb:16]
"""

import glob
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402

import fp8_products as fp  # noqa: E402
import ptx_registers  # noqa: E402

TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "h200_target_config.txtpb")
B_DTYPES = {"fp16": jnp.float16, "e4m3": jnp.float8_e4m3fn, "e4m3_kb": jnp.float32}


def main(out, builds="fp16:16,e4m3:16,e4m3:8,e4m3_kb:16", ptxas="/tmp/cudaroot/bin/ptxas",
         nvdisasm="/tmp/cudaroot/bin/nvdisasm"):
  topo = topologies.get_topology_desc(platform="cuda", target_config=open(TARGET).read(), topology="1x1x1")
  on = jax.sharding.SingleDeviceSharding(topo.devices[0])
  sd = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=on)
  rows = []
  for text in builds.split(","):
    kind, n = text.split(":")
    n = int(n)
    d = f"/tmp/prod_dump/{kind}{n}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    os.environ.update(MOSAIC_GPU_DUMP_TO=d, MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_PTXAS="1")
    sdt = jnp.bfloat16 if kind == "e4m3_kb" else jnp.float16
    args = (sd((fp.ROWS, fp.WORDS), jnp.uint16), sd((fp.K,), sdt), sd((fp.K,), sdt),
            sd(fp.b_shape(kind, n), B_DTYPES[kind]))
    row = {"kind": kind, "n": n}
    try:
      jax.jit(fp.product_kernel(kind, n, 528, 64)).trace(*args).lower().compile()
      sass = ptx_registers.compile_ptx(sorted(glob.glob(d + "/*.ptx"))[-1], ptxas, nvdisasm)
      row.update({k: v for k, v in sass.items() if not isinstance(v, (list, str))})
    except Exception as e:  # noqa: BLE001 (a build that fails is a row)
      row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(row), flush=True)
    rows.append(row)
  with open(out, "w") as fh:
    json.dump(rows, fh, indent=1)


if __name__ == "__main__":
  main(*sys.argv[1:])
