"""Compiling for an H200 on a machine without a GPU (the CUDA plugin and ptxas: `bash benchmarks/runs/aot_setup.sh`):
the topology's device as a sharding for abstract inputs, the abstract mesh the Triton lowering reads the GPU kind
from, and the kernels a compiled program launches (read from its optimized HLO)."""
import contextlib
import re

import jax
from jax._src import mesh as mesh_lib
from jax.experimental import topologies

TARGET_CONFIG = "benchmarks/results/h200_target_config.txtpb"
_LAUNCH = re.compile(r" (fusion|custom-call|copy|transpose|scatter|reduce|dynamic-update-slice)\(")
_WHAT = re.compile(r"(custom_call_target=\"[^\"]+\"|calls=%[\w.\-]+|kind=k\w+)")
_SHAPE = re.compile(r"= (\S+\[[^\]]*\]|\([^)]*\))")


@contextlib.contextmanager
def h200(target_config: str = TARGET_CONFIG):
  """Yields a function placing a pytree of jax.ShapeDtypeStruct (or arrays' shapes) on the H200 topology's
  device; inside, `jax.jit(...).trace(...).lower().compile()` compiles for it."""
  topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1", target_config=open(target_config).read())
  on = jax.sharding.SingleDeviceSharding(topo.devices[0])
  place = lambda tree: jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on), tree)
  dev = mesh_lib.AbstractDevice(device_kind=topo.devices[0].device_kind, num_cores=None, platform="cuda")
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=dev)):
    yield place


def launches(compiled, shapes: bool = False) -> list[str]:
  """The kernels of the compiled program's entry computation, one line each: the instruction's name, what it
  runs (a fusion's kind, a custom call's target) and (shapes) its result's shape."""
  txt = compiled.as_text()
  out = []
  for line in txt[txt.index("ENTRY"):].splitlines():
    if _LAUNCH.search(line):
      what, shape = _WHAT.search(line), _SHAPE.search(line)
      out.append(f"   {line.split('=')[0].strip()[:40]} {what.group(1) if what else ''}"
                 + (f" -> {shape.group(1)[:150] if shape else ''}" if shapes else ""))
  return out
