"""Session 13, CPU: lowering time of `mosaic_decode.decode_attention` for CUDA, one call against four
in one program (NOTES_gpu.md "Sessions 12-13": 4 layers lowered in 8.1 s before `_decode` had its own
jit, 2.2 s after). Run from the repository root: .venv/bin/python benchmarks/runs/session13_lower_time.py"""
import sys
import time

sys.path.insert(0, ".")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kvjax import cache as kvcache, formats  # noqa: E402
from pallas_kernels.gpu import lowering_check, mosaic_decode as md  # noqa: E402

c = kvcache.init_cache(formats.preset("kivi2_g128"), 8, 8, 32768, 128, kivi_layout="words")
q = jnp.zeros((8, 32, 1, 128), jnp.bfloat16)
for n in (1, 4):
  def f(q, c):
    for _ in range(n):
      q = md.decode_attention(q, c)
    return q
  tr = jax.jit(f).trace(q, c)
  t0 = time.time()
  with lowering_check.triton_modules():
    tr.lower(lowering_platforms=("cuda",))
  print(f"{n} call(s): lowered in {time.time() - t0:.1f} s", flush=True)
