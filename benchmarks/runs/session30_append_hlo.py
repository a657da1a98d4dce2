"""Session 30: why the head_dim-256 G=32 writer's append (XLA quantizes the key block, the kernel stores it) costs
more than XLA's own scatters at B=64 (124.6 against 96.8 us on the H100, `decode_parts/session30/
decode_gemma_g32_step.json`) while it wins at B=8. Both appends, one token into Gemma-2-2B-shaped KIVI-2 32k "words"
caches, compiled for an H200 on the CPU (`bash benchmarks/runs/aot_setup.sh`); prints each program's top-level
fusions and custom calls with their output shapes and sizes.

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session30_append_hlo.py [B]
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from aot_h200 import h200  # noqa: E402
from kvjax import cache as cache_lib, formats  # noqa: E402
from pallas_kernels.gpu import write  # noqa: E402

B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
write.NATIVE_WIDE_WORDS_GROUPS = {128: None, 32: None}  # the writer at any batch, as session 30's call c ran it
SIZES = {"bf16": 2, "f32": 4, "u16": 2, "s32": 4, "u8": 1, "pred": 1}
fmt = formats.preset("kivi2")
for name, fn in [("xla", lambda c_, k_: cache_lib.append(c_, k_, k_)),
                 ("writer", lambda c_, k_: write.append(c_, k_, k_, interpret=False))]:
  with h200() as place:
    c = place(jax.eval_shape(lambda: cache_lib.init_cache(fmt, B, 4, 32768, 256, kivi_layout="words")))
    x = place(jax.ShapeDtypeStruct((B, 4, 1, 256), jnp.bfloat16))
    txt = jax.jit(fn, donate_argnums=0).trace(c, x).lower().compile().as_text()
  entry = txt[txt.index("\nENTRY"):]
  print(f"{name}, B={B}:")
  for line in entry.splitlines():
    m = re.match(r"\s*%([\w.\-]+) = (.*?) (?:fusion|custom-call|copy)\(", line)
    if not m:
      continue
    op, out = m.groups()
    mb = sum(SIZES.get(t, 0) * int(np.prod([int(d) for d in dims.split(",") if d]))
             for t, dims in re.findall(r"(\w+)\[([\d,]*)\]", out)) / 2 ** 20
    print(f"  {op:32s} {mb:9.1f} MiB  {out[:150]}")  # in-place scatters: the whole leaf, only rows written
