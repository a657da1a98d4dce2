"""Session 29: where the compile time of issue 7's generate program goes. Session 29's Gemma-2-2B KIVI-2 (G=32) 32k
row did not finish within 200 s on an H100 (session 28's G=128 row: 90 s of its 109 s compiling). For a model cut
to each layer count, times trace, lower (jaxpr -> StableHLO, which runs the Pallas lowerings), compile (XLA) of
`kvjax.models.generation`'s jitted program and, on a GPU, its first and second runs (the first loads the
executable: Mosaic GPU kernels are built to cubin then), and counts its kernels by custom-call target.

WIDE_GROUPS (env): `write.NATIVE_WIDE_WORDS_GROUPS` for this run, e.g. "128,32".

Without a GPU it compiles for an H200 on the CPU (`bash benchmarks/runs/aot_setup.sh`; no runs):
    CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/runs/session29_compile.py \
      MODEL FMT BATCH CONTEXT LAYERS[,LAYERS...]
"""
import collections
import contextlib
import dataclasses
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

AOT = jax.default_backend() == "cpu" and os.environ.get("AOT", "1") == "1"  # AOT=0: run on the CPU
if AOT:
  jax.default_backend = lambda: "gpu"  # the kvjax dispatcher and the kernels' `interpret` default read it
from aot_h200 import h200  # noqa: E402
from flax import nnx  # noqa: E402
import throughput as tp  # noqa: E402
from kvjax import formats  # noqa: E402
from kvjax.models import generation  # noqa: E402
from kvjax.models.decoder import Decoder  # noqa: E402
from pallas_kernels.gpu import write  # noqa: E402

if os.environ.get("WIDE_GROUPS"):  # e.g. "128,32": the head_dim-256 key groups the compiled writer takes
  write.NATIVE_WIDE_WORDS_GROUPS = {int(g): None for g in os.environ["WIDE_GROUPS"].split(",")}


def timed(f, what=""):
  t0 = time.perf_counter()
  out = f()
  jax.block_until_ready(out)
  dt = round(time.perf_counter() - t0, 2)
  print(f"  {what} {dt} s", flush=True)
  return out, dt


def main():
  model_name, fmt_name, b, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
  fmt = formats.preset(fmt_name)
  for layers in map(int, sys.argv[5].split(",")):
    cfg = tp.MODELS[model_name]()
    types = getattr(cfg, "attention_types", None)
    cfg = dataclasses.replace(cfg, num_layers=layers, **({"attention_types": types[:layers]} if types else {}))
    cap = tp.capacity_for(fmt, ctx)
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))) if AOT else Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    fn = generation._compiled(graphdef, 64, generation.SamplingConfig(), (), 0, None, False, None)
    ints = lambda *shape: jnp.ones(shape, jnp.int32)
    with (h200() if AOT else contextlib.nullcontext()) as place:
      if AOT:
        caches = place(jax.eval_shape(lambda: model.init_cache(b, cap, fmt)))
        args = (place(state), place(jax.ShapeDtypeStruct((b, 1), jnp.int32)), place(jax.ShapeDtypeStruct(
                (b,), jnp.int32)), place(jax.ShapeDtypeStruct((b,), jnp.int32)), tuple(caches),
                place(jax.ShapeDtypeStruct((2,), jnp.uint32)))
      else:
        caches, _ = timed(lambda: tp.filled_caches(model, b, cap, fmt, ctx - 64), f"{layers} layers: fill")
        args = (state, ints(b, 1), ints(b), jnp.full((b,), 2, jnp.int32), tuple(caches), jax.random.PRNGKey(0))
      traced, t_trace = timed(lambda: fn.trace(*args), "trace")
      lowered, t_lower = timed(traced.lower, "lower")
      compiled, t_compile = timed(lowered.compile, "compile")
    row = dict(model=model_name, format=fmt_name, batch=b, context=ctx, layers=layers, trace_s=t_trace,
               lower_s=t_lower, compile_s=t_compile, device=str(jax.devices()[0].device_kind) if not AOT else "aot")
    if not AOT:
      out, row["run1_s"] = timed(lambda: compiled(*args), "run1")
      args = args[:4] + (tuple(out.caches),) + args[5:]
      out, row["run2_s"] = timed(lambda: compiled(*args), "run2")
    hlo = compiled.as_text()
    row.update(custom_calls=dict(collections.Counter(re.findall(r'custom_call_target="([^"]+)"', hlo))),
               stablehlo_mb=round(len(lowered.as_text()) / 1e6, 1))
    print(row, flush=True)


if __name__ == "__main__":
  main()
