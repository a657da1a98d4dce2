"""Where a decode-attention call's time goes, per device kernel, from a profiler trace.

    python3 benchmarks/profile_step.py --formats fp8_e4m3,bf16 --points 1:4096,8:1024,8:32768 \
        --out benchmarks/results/decode_parts/profile.json

For each (format, batch, context) it runs `decode_kernels.kvjax_rows`' timed loop (the fused kernel
on rotated cache sets, the query chained on the output) once more under `jax.profiler.trace`, reads
the Perfetto trace the profiler writes, and reports per step: every device kernel's time (the
q-prep fusion, the Pallas call, the split merge, ...), their sum ("busy") and the device span
divided by the steps ("span": busy plus the gaps between kernels). Short contexts are where the
fixed costs (launches, the merge) decide the ratio to a one-kernel peer, and this says which.

The trace parser (`kernel_times`) takes the process whose name contains `--process` ("GPU" on a
GPU; "CPU" for the CPU smoke test, where the events are host-side XLA ops).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

__all__ = ["kernel_times", "profile_point", "main"]


def _events(trace: dict | list) -> list[dict]:
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def kernel_times(trace: dict | list, steps: int, process: str = "GPU", thread: str = "Stream") -> dict:
  """Per-step microseconds of each complete event ("ph": "X") on the processes named `*process*`,
  on their threads named `*thread*` (a GPU's "Stream #..." tracks hold the kernels; its "XLA
  Modules" / "XLA Ops" tracks repeat the same time and are left out). `thread=""`: every thread.

  Returns ``{"kernels": {name: {"us": per step, "calls": per step}}, "busy_us", "span_us"}``; a
  name's time is summed over the matching threads. Raises ValueError when nothing matches.
  """
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  events = _events(trace)
  pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
          and process in str(e.get("args", {}).get("name", ""))}
  if not pids:
    names = sorted({str(e.get("args", {}).get("name")) for e in events
                    if e.get("ph") == "M" and e.get("name") == "process_name"})
    raise ValueError(f"no trace process named like {process!r}; processes: {names}")
  tids = {(e["pid"], e.get("tid")) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
          and e.get("pid") in pids and thread in str(e.get("args", {}).get("name", ""))}
  if not tids:
    raise ValueError(f"no thread named like {thread!r} in the processes named like {process!r}")
  xs = [e for e in events if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in tids and "dur" in e]
  total, calls = collections.Counter(), collections.Counter()
  for e in xs:
    total[e["name"]] += float(e["dur"])
    calls[e["name"]] += 1
  span = (max(float(e["ts"]) + float(e["dur"]) for e in xs) - min(float(e["ts"]) for e in xs)) if xs else 0.0
  kernels = {n: {"us": round(t / steps, 3), "calls": round(calls[n] / steps, 3)}
             for n, t in total.most_common()}
  return {"kernels": kernels, "busy_us": round(sum(total.values()) / steps, 3),
          "span_us": round(span / steps, 3)}


def _read_trace(log_dir: str) -> dict:
  paths = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
  if not paths:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {log_dir} (profiler wrote nothing?)")
  with gzip.open(sorted(paths)[-1]) as f:
    return json.load(f)


WHAT = ("attend", "append", "step")


def profile_point(fmt_name: str, batch: int, context: int, steps: int, process: str = "GPU",
                  thread: str = "Stream", opts: dict | None = None, what: str = "attend") -> dict:
  """One traced run at (fmt, batch, context) of `what`: "attend" (the kernel call, as the
  "kvjax" rows), "append" (the one-kernel append alone, "kvjax_append_pallas") or "step" (both,
  "kvjax_step_pallas"); `kernel_times` of it."""
  import functools
  import jax.numpy as jnp
  import decode_kernels as dk
  from pallas_kernels.gpu import ops, write
  from kernel_variants import split_layout
  if what not in WHAT:
    raise ValueError(f"what must be one of {WHAT}, got {what!r}")
  recorded = dict(opts or {})  # as given (JSON): with `value_tile`, which split_layout takes out
  layout, opts = split_layout(dk.sweep_options(opts or {}))  # a dict under "mosaic_fp8": an Fp8Options
  key = jax.random.PRNGKey(0)
  length, nb, ns, caches, q = dk.cache_sets(fmt_name, batch, context, key)
  caches = tuple(layout(c) for c in caches)
  attend_fn = functools.partial(ops.decode_attention, **dk.kernel_options(opts))

  def attend(x):
    q, cs = x
    for c in cs:
      q = dk.chain(q, attend_fn(q, c))
    return q, cs

  append_fn = write.append
  body = {"attend": attend, "append": dk.append_only(append_fn, batch, context, length),
          "step": dk.decode_step(attend_fn, batch, context, length, append_fn)}[what]
  run = jax.jit(lambda c: jax.lax.fori_loop(0, steps, lambda i, x: body(x), c), donate_argnums=0)
  carry = run(jax.tree_util.tree_map(jnp.copy, (q, caches)))  # compile + warm up
  jax.block_until_ready(carry)
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      carry = run(carry)
      jax.block_until_ready(carry)
    out = kernel_times(_read_trace(d), steps * ns, process, thread)
  out.update(format=fmt_name, batch=batch, context=context, what=what, steps=steps, cache_sets=ns,
             bytes_read=int(nb), options=recorded)
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--formats", default="fp8_e4m3,int8,bf16")
  ap.add_argument("--points", default="1:4096,8:1024,8:4096,8:32768", help="batch:context,...")
  ap.add_argument("--steps", type=int, default=50)
  ap.add_argument("--what", default="attend", help=f"comma-separated, of {WHAT}")
  ap.add_argument("--process", default="GPU", help="trace process to read (GPU; CPU for smoke tests)")
  ap.add_argument("--thread", default="Stream", help="trace threads to read ('' = all; GPU kernels: Stream)")
  ap.add_argument("--top", type=int, default=6, help="kernels printed per point")
  ap.add_argument("--options", default="{}", help="JSON kernel options (ops.decode_attention keywords)")
  ap.add_argument("--out", default="benchmarks/results/decode_parts/profile.json")
  args = ap.parse_args(argv)
  rows = []
  for w in filter(None, args.what.split(",")):
    for f in filter(None, args.formats.split(",")):
      for p in filter(None, args.points.split(",")):
        b, ctx = map(int, p.split(":"))
        r = profile_point(f, b, ctx, args.steps, args.process, args.thread, what=w,
                          opts=json.loads(args.options) or None)
        rows.append(r)
        top = ", ".join(f"{n[:40]} {v['us']:.1f}" for n, v in list(r["kernels"].items())[:args.top])
        print(f"{w:6s} {f:10s} B={b:<3d} ctx={ctx:<6d} span {r['span_us']:7.1f} us  "
              f"busy {r['busy_us']:7.1f}  | {top}", flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as fh:
    json.dump({"meta": {"device": str(jax.devices()[0]), "jax": jax.__version__, "process": args.process,
                        "thread": args.thread},
               "rows": rows}, fh, indent=1)
  return rows


if __name__ == "__main__":
  main()
