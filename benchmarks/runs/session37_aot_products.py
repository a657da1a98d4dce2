"""Session 37: `fp8_products.py`'s two key products compiled for an H200 on the CPU (registers, the loop's SASS mix).

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session37_aot_products.py OUT.json
"""
import sys, os, glob, shutil; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")); sys.path.insert(0, ".")
import jax, jax.numpy as jnp
from jax.experimental import topologies
import fp8_products as fp, ptx_registers
topo = topologies.get_topology_desc(platform="cuda", target_config=open("benchmarks/results/h200_target_config.txtpb").read(), topology="1x1x1")
on = jax.sharding.SingleDeviceSharding(topo.devices[0])
sd = lambda s, d: jax.ShapeDtypeStruct(s, d, sharding=on)
rows = []
KINDS = [tuple(x.split(":")) for x in (sys.argv[2] if len(sys.argv) > 2 else "fp16:16,e4m3:16,e4m3:8,e4m3_kb:16").split(",")]
for kind, n in ((k, int(n)) for k, n in KINDS):
    d = f"/tmp/prod_dump/{kind}{n}"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    os.environ.update(MOSAIC_GPU_DUMP_TO=d, MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_PTXAS="1")
    sdt = jnp.bfloat16 if kind == "e4m3_kb" else jnp.float16
    args = (sd((128, 16), jnp.uint16), sd((128,), sdt), sd((128,), sdt),
            sd(fp.b_shape(kind, n), {"e4m3": jnp.float8_e4m3fn, "fp16": jnp.float16, "e4m3_kb": jnp.float32}[kind]))
    try:
        jax.jit(fp.product_kernel(kind, n, 528, 64)).trace(*args).lower().compile()
    except Exception as e:
        print(kind, n, "FAILED", type(e).__name__, str(e)[:1500]); continue
    ptx = sorted(glob.glob(d + "/*.ptx"))[-1]
    s = ptx_registers.compile_ptx(ptx, "/tmp/cudaroot/bin/ptxas", "/tmp/cudaroot/bin/nvdisasm")
    rows.append({"kind": kind, "n": n, "iters_unrolled_note": "ptxas may unroll the loop", **{k: v for k, v in s.items() if not isinstance(v, (list, str))}}); print(rows[-1])
    print(open(ptx).read().count("wgmma.mma_async"), "wgmma in ptx")
import json
json.dump(rows, open(sys.argv[1], "w"), indent=1)
