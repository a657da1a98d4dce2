"""Session 24: the kernels XLA launches for one decode step (`write.decode_step`-shaped: the one-kernel
append, then `ops.decode_attention`), compiled for an H200 on the CPU (no GPU: `bash benchmarks/runs/
aot_setup.sh`), by format, batch and context, appending bf16 tokens (`--f32-tokens`: float32);
`--xla-append` for kvjax's XLA scatters instead; `--show-copies`: the HLO lines of copies and parameters.

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session24_hlo_step.py kivi2 8 32768
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from aot_h200 import h200, launches  # noqa: E402
from kvjax import cache as cache_lib, formats  # noqa: E402
from pallas_kernels.gpu import ops, write  # noqa: E402

fmt_name, b, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fmt = formats.preset(fmt_name)
append = cache_lib.append if "--xla-append" in sys.argv else (lambda c, k, v: write.append(c, k, v, interpret=False))


def step(q_, k_, v_, c_):
  c_ = append(c_, k_, v_)
  return ops.decode_attention(q_, c_, interpret=False), c_


with h200() as place:
  cache = place(jax.eval_shape(lambda: cache_lib.init_cache(fmt, b, 8, ctx, 128,
                                                            kivi_layout="words" if fmt.is_kivi else None)))
  q = place(jax.ShapeDtypeStruct((b, 32, 1, 128), jnp.bfloat16))
  kv = place(jax.ShapeDtypeStruct((b, 8, 1, 128), jnp.float32 if "--f32-tokens" in sys.argv else jnp.bfloat16))
  c = jax.jit(step, donate_argnums=3).trace(q, kv, kv, cache).lower().compile()
found = launches(c, shapes=True)
print(fmt_name, b, ctx, "launches:", len(found))
print("\n".join(found))
if "--show-copies" in sys.argv:
  txt = c.as_text()
  for line in txt[txt.index("ENTRY"):].splitlines():
    if "copy" in line or "ROOT" in line or "parameter(" in line:
      print(line.strip()[:400])
