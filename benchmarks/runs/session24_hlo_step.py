"""Session 24: the kernels XLA launches for one decode step (`write.decode_step`-shaped: the one-kernel
append, then `ops.decode_attention`), compiled for an H200 on the CPU (no GPU: `bash benchmarks/runs/
aot_setup.sh`), by format, batch and context, appending bf16 tokens (`--f32-tokens`: float32); `--xla-append` for kvjax's XLA scatters instead:

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session24_hlo_step.py kivi2 8 32768
"""
import re
import sys

sys.path.insert(0, "/work/main")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax._src import mesh as mesh_lib  # noqa: E402
from jax.experimental import topologies  # noqa: E402

from kvjax import cache as cache_lib, formats  # noqa: E402
from pallas_kernels.gpu import ops, write  # noqa: E402

topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                    target_config=open("benchmarks/results/h200_target_config.txtpb").read())
on = jax.sharding.SingleDeviceSharding(topo.devices[0])
fmt_name, b, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fmt = formats.preset(fmt_name)
shapes = jax.eval_shape(lambda: cache_lib.init_cache(fmt, b, 8, ctx, 128, kivi_layout="words" if fmt.is_kivi else None))
cache = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on), shapes)
q = jax.ShapeDtypeStruct((b, 32, 1, 128), jnp.bfloat16, sharding=on)
kv = jax.ShapeDtypeStruct((b, 8, 1, 128), jnp.float32 if "--f32-tokens" in sys.argv else jnp.bfloat16, sharding=on)
append = cache_lib.append if "--xla-append" in sys.argv else (lambda c, k, v: write.append(c, k, v, interpret=False))


def step(q_, k_, v_, c_):
  c_ = append(c_, k_, v_)
  return ops.decode_attention(q_, c_, interpret=False), c_


dev = mesh_lib.AbstractDevice(device_kind=topo.devices[0].device_kind, num_cores=None, platform="cuda")
with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=dev)):
  c = jax.jit(step, donate_argnums=3).trace(q, kv, kv, cache).lower().compile()
txt = c.as_text()
entry = txt[txt.index("ENTRY"):]
launches = []
for line in entry.splitlines():
  if re.search(r" (fusion|custom-call|copy|transpose|scatter|reduce|dynamic-update-slice)\(", line):
    m = re.search(r"(custom_call_target=\"[^\"]+\"|calls=%[\w.\-]+|kind=k\w+)", line)
    shape = re.search(r"= (\S+\[[^\]]*\]|\([^)]*\))", line)
    launches.append(f"   {line.split('=')[0].strip()[:40]} {m.group(1) if m else ''} -> {shape.group(1)[:150] if shape else ''}")
print(fmt_name, b, ctx, "launches:", len(launches))
print("\n".join(launches))
if "--show-copies" in sys.argv:
  for line in entry.splitlines():
    if "copy" in line or "ROOT" in line or "parameter(" in line:
      print(line.strip()[:400])
