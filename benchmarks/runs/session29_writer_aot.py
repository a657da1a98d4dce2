"""Session 29: the one-kernel writer's compile time by format, head_dim and where the KIVI key flush is quantized
(in the kernel, `flush.py`, or by XLA first), compiled for an H200 on the CPU (no GPU: `bash benchmarks/runs/
aot_setup.sh`): one decode token appended to B=8, 4 KV heads, 32k "words" caches with abstract lengths (the flush
branch is in the program). Session 29's Gemma throughput row with the head_dim-256 G=32 writer did not finish.

    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session29_writer_aot.py
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from aot_h200 import h200  # noqa: E402
from kvjax import cache as cache_lib, formats  # noqa: E402
from pallas_kernels.gpu import write  # noqa: E402

write.NATIVE_WIDE_WORDS_GROUPS = {128: None, 32: None}  # compiled here: the writer the gate holds back at G=32
for name, h, flush_in_kernel in [("kivi2", 128, True), ("kivi2", 256, True), ("kivi2", 256, False),
                                 ("kivi2_g128", 256, True), ("kivi4", 256, True), ("kivi4", 256, False)]:
  fmt = formats.preset(name)
  with h200() as place:
    c = place(jax.eval_shape(lambda: cache_lib.init_cache(fmt, 8, 4, 32768, h, kivi_layout="words")))
    x = place(jax.ShapeDtypeStruct((8, 4, 1, h), jnp.bfloat16))
    f = jax.jit(lambda c_, k_: write.append(c_, k_, k_, interpret=False, flush_in_kernel=flush_in_kernel),
                donate_argnums=0)
    t0 = time.perf_counter()
    lowered = f.trace(c, x).lower()
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
  print(dict(format=name, head_dim=h, flush_in_kernel=flush_in_kernel, lower_s=round(t1 - t0, 1),
             compile_s=round(t2 - t1, 1)), flush=True)
