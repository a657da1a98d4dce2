"""Session 23: the kernels XLA launches for one `ops.decode_attention` call, compiled for an H200 on the CPU
(no GPU: `bash benchmarks/runs/aot_setup.sh`), by format, batch and context:

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session23_hlo_kernels.py kivi4 1 1024
"""
import sys, re
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
import jax, jax.numpy as jnp
from jax.experimental import topologies
from kvjax import cache as cache_lib, formats
from pallas_kernels.gpu import ops
topo = topologies.get_topology_desc(platform="cuda", target_config=open("benchmarks/results/h200_target_config.txtpb").read(), topology="1x1x1")
on = jax.sharding.SingleDeviceSharding(topo.devices[0])
fmt_name, b, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fmt = formats.preset(fmt_name)
shapes = jax.eval_shape(lambda: cache_lib.init_cache(fmt, b, 8, ctx, 128, kivi_layout="words" if fmt.is_kivi else None))
cache = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on), shapes)
q = jax.ShapeDtypeStruct((b, 32, 1, 128), jnp.bfloat16, sharding=on)
from jax._src import mesh as mesh_lib
dev = mesh_lib.AbstractDevice(device_kind=topo.devices[0].device_kind, num_cores=None, platform="cuda")
with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=dev)):
  c = jax.jit(lambda q_, c_: ops.decode_attention(q_, c_, interpret=False)).trace(q, cache).lower().compile()
txt = c.as_text()
entry = txt[txt.index("ENTRY"):]
launches = []
for line in entry.splitlines():
  if re.search(r" (fusion|custom-call|copy|transpose|scatter|reduce)\(", line):
    m = re.search(r"(custom_call_target=\"[^\"]+\"|calls=%[\w.\-]+|kind=k\w+)", line)
    launches.append(f"   {line.split('=')[0].strip()[:40]} {m.group(1) if m else ''}")
print(fmt_name, b, ctx, "launches:", len(launches))
print("\n".join(launches))
