"""Where a decode step of issue 7's generate loop goes, per device kernel, from a profiler trace.

    python3 benchmarks/profile_generate.py --model gemma2_2b --points fp8_e4m3:24:32768,bf16:12:32768 \
        --out benchmarks/results/decode_parts/profile_generate.json

For each (format, batch, context) it builds `throughput.py`'s program (random bf16 weights, the caches filled
to `context - steps` tokens, `kvjax.models.generate` over donated caches), runs it once to compile, then once
more under `jax.profiler.trace`, and reports per decode step every device kernel's time, their sum ("busy")
and the device span over the steps ("span"), with the kernels grouped by what they are (`CLASSES`: attention,
appends, matmuls, the rest). Batch 0 in a point means `throughput.max_batch_for` at `--budget-gib`, the
batch the throughput rows run. A throughput ratio that misses its bytes ratio is explained from here: which
kernels grow with the batch, which are fixed per step.

The trace parser is `profile_step.kernel_times` (`--process CPU` reads host-side XLA ops: the CPU smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (class, pattern on the kernel's name), first match wins: the Pallas kernels by their names
# (`kernel_name` / the Triton and Mosaic symbols), cuBLAS / cuDNN and XLA's own GEMM fusions, XLA's scatters
CLASSES = (("attention", r"mosaic_kivi|mosaic_fp8|decode|attention|flash|window_merge|_merge|sdpa|fmha|cudnn"),
           ("append", r"append_rows|write_rows|scatter|dynamic_update_slice|dynamic-update-slice"),
           ("matmul", r"gemm|cutlass|sm90_xmma|nvjet|dot|cublas|matmul|wgmma"),
           ("other", r""))


def classify(name: str) -> str:
  low = name.lower()
  return next(c for c, pat in CLASSES if re.search(pat, low))


def group_kernels(kernels: dict) -> dict:
  """`kernel_times`' per-kernel {us, calls} summed per `CLASSES` class (us per step, rounded)."""
  out = {c: 0.0 for c, _ in CLASSES}
  for name, k in kernels.items():
    out[classify(name)] += k["us"]
  return {c: round(v, 3) for c, v in out.items()}


def _throwaway_trace(run, steps: int) -> None:
  """The point's own run traced once and dropped. Session 31 (H100, `decode_parts/session31/`): the first point's
  trace held only copies and a broadcast (5.5 us busy in a 15 ms span, none of its kernels), the second all of
  them. A throwaway trace of a trivial program first did not help (session 32, `decode_parts/session32/
  profile_generate_gemma_bf16_kivi2.json`: the first point empty again); a throwaway point did
  (`profile_generate_gemma_fp8_mosaic.json`, whose first point is bf16 B=1 4k)."""
  import jax
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      run(steps)


def profile_point(model_name: str, fmt_name: str, batch: int, context: int, *, steps: int = 16,
                  budget_gib: float = 40.0, process: str = "GPU", thread: str = "Stream", seed: int = 0,
                  implementation=None) -> dict:
  """One traced generate run of `steps` decode steps at (model, fmt, batch or 0: the max batch, context)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  import profile_step
  import throughput as tp
  from kvjax import formats
  from kvjax.models.decoder import Decoder

  if model_name not in tp.MODELS:
    raise ValueError(f"model must be one of {sorted(tp.MODELS)}, got {model_name!r}")
  cfg, fmt = tp.MODELS[model_name](), formats.preset(fmt_name)
  if batch == 0:
    batch = tp.max_batch_for(cfg, fmt, context, int(budget_gib * tp.GIB))
  if batch < 1 or steps < 1 or context <= steps:
    raise ValueError(f"need batch >= 1, steps >= 1 and context > steps, got batch {batch}, steps {steps}, "
                     f"context {context}")
  cap = tp.capacity_for(fmt, context)
  model = Decoder(cfg, rngs=nnx.Rngs(seed))
  length = context - steps
  caches = tp.filled_caches(model, batch, cap, fmt, length, seed + 1)
  prompts = jnp.asarray(np.random.default_rng(seed).integers(1, cfg.vocab_size, (batch, 1)), jnp.int32)
  run = tp._Runner(model, prompts, caches, length, steps, implementation)  # the throughput rows' call
  run(steps)  # compile + warm up
  _throwaway_trace(run, steps)
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      run(steps)
    out = profile_step.kernel_times(profile_step._read_trace(d), steps, process, thread)
  out.update(model=model_name, format=fmt_name, batch=batch, context=context, steps=steps,
             classes=group_kernels(out["kernels"]), device=str(jax.devices()[0].device_kind),
             layer_impls=tp.layer_implementations(model, fmt, implementation))
  return out


def parse_points(text: str):
  """'fmt:batch:context,...' -> [(fmt, batch, context)] (batch 0: the max batch)."""
  out = []
  for p in filter(None, text.split(",")):
    parts = p.split(":")
    if len(parts) != 3 or not all(x.isdigit() for x in parts[1:]):
      raise ValueError(f"--points: {p!r} must be format:batch:context (batch 0: the max batch)")
    out.append((parts[0], int(parts[1]), int(parts[2])))
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="gemma2_2b")
  ap.add_argument("--points", default="bf16:0:32768,fp8_e4m3:0:32768", help="format:batch:context,... (batch 0: "
                  "the max batch at --budget-gib)")
  ap.add_argument("--steps", type=int, default=16)
  ap.add_argument("--budget-gib", type=float, default=40.0)
  ap.add_argument("--process", default="GPU", help="trace process to read (GPU; CPU for smoke tests)")
  ap.add_argument("--thread", default="Stream", help="trace threads to read ('' = all; GPU kernels: Stream)")
  ap.add_argument("--top", type=int, default=8, help="kernels printed per point")
  ap.add_argument("--out", default="benchmarks/results/decode_parts/profile_generate.json")
  args = ap.parse_args(argv)
  points = parse_points(args.points)
  rows = []
  for fmt_name, batch, context in points:
    r = profile_point(args.model, fmt_name, batch, context, steps=args.steps, budget_gib=args.budget_gib,
                      process=args.process, thread=args.thread)
    rows.append(r)
    print(f"{args.model} {fmt_name} B={r['batch']} ctx={context}: busy {r['busy_us']:.1f} us/step, span "
          f"{r['span_us']:.1f}; {r['classes']}", flush=True)
    for name, k in list(r["kernels"].items())[:args.top]:
      print(f"    {k['us']:10.1f} us  x{k['calls']:<6} [{classify(name)}] {name[:100]}", flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as fh:
    json.dump({"meta": {"model": args.model, "steps": args.steps, "budget_gib": args.budget_gib}, "rows": rows},
              fh, indent=1)
  return rows


if __name__ == "__main__":
  main()
