"""Session 23: the kernels XLA launches for one `ops.decode_attention` call, compiled for an H200 on the CPU
(no GPU: `bash benchmarks/runs/aot_setup.sh`), by format, batch and context:

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session23_hlo_kernels.py kivi4 1 1024
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from aot_h200 import h200, launches  # noqa: E402
from kvjax import cache as cache_lib, formats  # noqa: E402
from pallas_kernels.gpu import ops  # noqa: E402

fmt_name, b, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fmt = formats.preset(fmt_name)
with h200() as place:
  cache = place(jax.eval_shape(lambda: cache_lib.init_cache(fmt, b, 8, ctx, 128,
                                                            kivi_layout="words" if fmt.is_kivi else None)))
  q = place(jax.ShapeDtypeStruct((b, 32, 1, 128), jnp.bfloat16))
  c = jax.jit(lambda q_, c_: ops.decode_attention(q_, c_, interpret=False)).trace(q, cache).lower().compile()
found = launches(c)
print(fmt_name, b, ctx, "launches:", len(found))
print("\n".join(found))
