"""Session 39: the kernels of `decode_kernels.append_only` over 3 KIVI-2 G=128 B=8 32k cache sets with the placed
writer, compiled for an H200 on the CPU (`bash benchmarks/runs/aot_setup.sh`), for two ways of wrapping the sets'
lengths: `decode_kernels.wrapped` (all sets stacked, one op) and one `jnp.where` a set.

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session39_wrap_hlo.py
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, ".."), HERE]
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import decode_kernels as dk  # noqa: E402
from aot_h200 import h200  # noqa: E402
from kvjax import cache as cache_lib, formats  # noqa: E402
from pallas_kernels.gpu import write  # noqa: E402

B, CTX, NS = 8, 32768, 3
fmt = formats.preset("kivi2_g128")


def per_set(cs, ctx, length):
  return [c.replace(lengths=jnp.where(c.lengths >= ctx - 1, length, c.lengths)) for c in cs]


for name, wrap in [("stack", dk.wrapped), ("per_set", per_set)]:
  dk.wrapped = wrap
  app = dk.append_only(lambda c, k, v: write.append(c, k, v, interpret=False), B, CTX, CTX - 256)
  with h200() as place:
    c = place(jax.eval_shape(lambda: cache_lib.init_cache(fmt, B, 8, CTX, 128, kivi_layout="words")))
    q = place(jax.ShapeDtypeStruct((B, 32, 1, 128), jnp.bfloat16))
    txt = jax.jit(app, donate_argnums=0).trace((q, (c,) * NS)).lower().compile().as_text()
  entry = txt[txt.index("\nENTRY"):]
  ops = [re.match(r"\s*%([\w.\-]+) = ", ln).group(1) for ln in entry.splitlines()
         if " fusion(" in ln or "custom-call(" in ln or " copy(" in ln]  # the launches
  print(name, len(ops), ops)
