"""End-to-end decode throughput at a fixed KV-cache memory budget (issue 7).

    python3 benchmarks/throughput.py --out benchmarks/results/throughput_h200.json

For each model shape (Llama-3-8B, Gemma-2-2B; random bf16 weights: speed does not depend on
their values), KV format and context C:
  * max_batch: the most sequences of capacity C whose caches fit the budget (default 40 GiB),
    from the byte count of the real cache arrays of every layer (`jax.eval_shape` of
    `Decoder.init_cache`, as `kvjax.memory` does; KIVI capacity rounded up to R). Weights are
    not charged to the budget.
  * tokens_per_s: decode tokens per second at max_batch through the jitted `generate` program
    (one compiled prefill + `while_loop` decode, caches donated). The caches are first filled
    with random (finite) codes, scales and residuals up to C - steps tokens, so every timed
    step reads a nearly full cache and the last step ends at C. The prompt is one token, so
    the program's "prefill" is itself a decode step. One compile, two run lengths through the
    runtime `max_lengths` (the loop exits early): tokens/s = B * (n - n0) / (t(n) - t(n0)),
    median over `--reps` pairs, after a warm-up call (compile time is recorded apart).
  * step_ms: per-step latency at batch 1 (same method, context C), and from the same compiled
    program prefill_tokens_per_s: a `--prefill` token chunk appended at batch 1 to a cache
    already holding C - steps - prefill tokens (kvjax's XLA chunked-prefill attention;
    reported separately, never part of tokens_per_s).
  * peak_gib: `device.memory_stats()['peak_bytes_in_use']` of a fresh process per row (each
    row runs in its own subprocess unless --in-process), weights included; null where the
    backend has no memory stats (CPU). kv_gib and weights_gib are the computed parts beside it.

Decode attention uses the platform default order (`kvjax.dispatch`: pallas_gpu then xla on a
GPU) unless --implementation is given; rows record which implementation each layer gets
(pallas_gpu declines sliding-window layers, so Gemma 2's local layers run the XLA path).
Results are written after every row (a time-out keeps the finished ones); --merge joins runs.
`--plan` prints the byte-count predictions without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import jax.numpy as jnp
import numpy as np

from kvjax import dispatch, formats, quant

FORMATS = ("bf16", "fp8_e4m3", "int8", "kivi4", "kivi2")
CONTEXTS = (4096, 32768)
ROW_KEYS = ("model", "format", "context", "max_batch", "tokens_per_s", "step_ms", "peak_gib")

# The model shapes and byte counts live in their own module (`MODELS`, `tiny`, `plan` re-exported for callers).
from throughput_sizing import GIB, MODELS, cache_bytes_per_seq, capacity_for, max_batch_for, plan, tiny  # noqa


# ----------------------------------------------------------------------------- caches


def _fill_leaf(key, shape, dtype):
  """Random finite contents of one cache array (fused into one kernel by jit: no f32 temp)."""
  dtype = jnp.dtype(dtype)
  if dtype in (jnp.uint8, jnp.uint16):  # packed codes (uint16: the "words" KIVI-2 layout)
    return jax.random.bits(key, shape, dtype)
  if dtype == jnp.int8:
    return jax.lax.bitcast_convert_type(jax.random.bits(key, shape, jnp.uint8), jnp.int8)
  if jnp.issubdtype(dtype, jnp.floating):
    lo, hi = (-4.0, 4.0) if dtype.itemsize == 1 else (0.5, 1.5)  # codes / scales, residuals
    return jax.random.uniform(key, shape, jnp.float32, lo, hi).astype(dtype)
  raise TypeError(f"no random fill for cache leaves of dtype {dtype}")


_fill = jax.jit(_fill_leaf, static_argnums=(1, 2))


def filled_caches(model, batch: int, capacity: int, fmt, length: int, seed: int = 0):
  """Per-layer caches of `batch` sequences holding `length` tokens of random contents.

  Built leaf by leaf from the abstract cache, so peak memory is the caches plus one leaf.
  """
  abstract = jax.eval_shape(lambda: model.init_cache(batch, capacity, fmt))
  leaves, tree = jax.tree_util.tree_flatten(abstract)
  key = jax.random.PRNGKey(seed)
  out = []
  for i, lf in enumerate(leaves):
    if lf.dtype == jnp.int32 and lf.shape == (batch,):  # lengths
      out.append(jnp.full((batch,), length, jnp.int32))
    else:
      out.append(_fill(jax.random.fold_in(key, i), tuple(lf.shape), str(lf.dtype)))
  return jax.tree_util.tree_unflatten(tree, out)


def with_lengths(caches, length: int):
  return tuple(c.replace(lengths=jnp.full_like(c.lengths, length)) for c in caches)


def layer_implementations(model, fmt, implementation) -> dict[str, int]:
  """How many layers each decode implementation serves (the dispatcher's choice, traced)."""
  cfg = model.cfg
  order = (dispatch.default_order() if implementation is None else
           (implementation,) if isinstance(implementation, str) else tuple(implementation))
  q = jax.ShapeDtypeStruct((2, cfg.num_heads, 1, cfg.head_dim), jnp.dtype(cfg.dtype))
  counts: dict[str, int] = {}
  memo = {}
  for i in range(cfg.num_layers):
    w = cfg.window(i)
    if w not in memo:
      cache = jax.eval_shape(lambda: model.layers[i].attn.new_cache(2, capacity_for(fmt, 256), fmt=fmt))
      memo[w] = "none"
      for name in order:
        try:
          jax.eval_shape(lambda q, c: dispatch.decode_attention(
              q, c, implementation=name, sm_scale=cfg.sm_scale, logit_softcap=cfg.attn_logit_softcap,
              window=w), q, cache)
          memo[w] = name
          break
        except (NotImplementedError, ValueError):
          continue
    counts[memo[w]] = counts.get(memo[w], 0) + 1
  return counts


# ----------------------------------------------------------------------------- timing


def _peak_bytes():
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001  (backends without stats)
    return None, None
  if not stats:
    return None, None
  return stats.get("peak_bytes_in_use"), stats.get("bytes_in_use")


class _Runner:
  """Calls `generate` on donated caches; resets cache lengths between calls (no copies)."""

  def __init__(self, model, prompts, caches, length, max_new, implementation):
    self.model, self.prompts, self.caches, self.length = model, prompts, caches, length
    self.max_new, self.impl = max_new, implementation

  def __call__(self, n: int) -> float:
    from kvjax.models.generation import generate
    b = self.prompts.shape[0]
    caches = with_lengths(self.caches, self.length)
    self.caches = None
    jax.block_until_ready(caches)
    t0 = time.perf_counter()
    out = generate(self.model, self.prompts, max_new_tokens=self.max_new, caches=caches,
                   max_lengths=jnp.full((b,), n, jnp.int32), implementation=self.impl)
    jax.block_until_ready(out.tokens)
    jax.block_until_ready(out.caches)
    dt = time.perf_counter() - t0
    self.caches = out.caches
    return dt


def _pairs(run, n0, n, reps):
  """Median over reps of (t(n) - t(n0)) / (n - n0), and median t(n0).

  The per-step time is NaN when timing noise swamps the difference (a
  non-positive median); rows then record None instead of a negative time.
  """
  d, base = [], []
  for _ in range(reps):
    a = run(n0)
    z = run(n)
    base.append(a)
    d.append((z - a) / (n - n0))
  step = statistics.median(d)
  return (step if step > 0 else float("nan")), statistics.median(base)


def run_row(model_name: str, fmt_name: str, context: int, budget_bytes: int, *, steps: int = 64,
            warm_steps: int = 8, reps: int = 3, prefill: int = 512, target_s: float = 1.0,
            implementation=None, seed: int = 0, skip_b1: bool = False, model=None, mosaic_fp8: bool = False,
            mosaic_int8: bool = False, kivi_words_g32: bool = False, log=print) -> dict:
  """Measures one (model, format, context) row; see the module docstring. mosaic_fp8: FP8 caches through the
  Mosaic GPU kernel (`pallas_kernels.gpu.ops.MOSAIC_FP8` set in this process; the row records it); mosaic_int8:
  INT8 caches through the same kernel (`ops.MOSAIC_INT8`).
  kivi_words_g32: KIVI-2 G=32 caches in the "words" layout, so through the Mosaic kernel
  (`kvjax.cache.WORDS_DEFAULT_GROUPS` set in this process; the row records it)."""
  from flax import nnx
  from kvjax.models.decoder import Decoder

  if mosaic_fp8 or mosaic_int8:
    from pallas_kernels.gpu import ops
    ops.MOSAIC_FP8, ops.MOSAIC_INT8 = ops.MOSAIC_FP8 or mosaic_fp8, ops.MOSAIC_INT8 or mosaic_int8
  if kivi_words_g32:
    from kvjax import cache as kvcache
    kvcache.WORDS_DEFAULT_GROUPS = (128, 32)

  cfg = MODELS[model_name]()
  fmt = formats.preset(fmt_name)
  cap = capacity_for(fmt, context)
  per_seq = cache_bytes_per_seq(cfg, fmt, context)
  b = int(budget_bytes // per_seq)
  row = dict(model=model_name, format=fmt_name, context=context, max_batch=b, tokens_per_s=None,
             step_ms=None, peak_gib=None, capacity=cap, budget_gib=budget_bytes / GIB,
             kv_gib=b * per_seq / GIB, bytes_per_seq=per_seq, platform=jax.default_backend(),
             device=str(jax.devices()[0].device_kind), implementation=implementation)
  if mosaic_fp8 and isinstance(fmt.key, formats.FP8Spec):  # the rows whose caches it can serve
    row["mosaic_fp8"] = True
  if mosaic_int8 and isinstance(fmt.key, formats.IntSpec) and fmt.key.bits == 8:
    row["mosaic_int8"] = True
  if kivi_words_g32 and isinstance(fmt.key, formats.KIVISpec) and fmt.key.group_size == 32:
    row["kivi_words_g32"] = True
  if b < 1:
    row["error"] = "no sequence fits the budget"
    return row
  if context < steps + min(prefill, context // 4) + 1:
    raise ValueError(f"context ({context}) must exceed steps + prefill ({steps} + {prefill})")
  t0 = time.perf_counter()
  if model is None:
    model = Decoder(cfg, rngs=nnx.Rngs(seed))
  jax.block_until_ready(nnx.state(model))
  row["weights_gib"] = quant.nbytes(nnx.state(model)) / GIB
  row["init_s"] = time.perf_counter() - t0
  row["layer_impls"] = layer_implementations(model, fmt, implementation)
  rng = np.random.default_rng(seed)

  # batch 1: prefill a chunk onto a long cache, then decode (one compiled program)
  if not skip_b1:
    _batch1(row, model, cfg, fmt, cap, context, steps, prefill, reps, implementation, seed, rng, log)
  return _max_batch(row, model, cfg, fmt, cap, context, b, steps, warm_steps, reps, target_s,
                    implementation, seed, rng, log)


def _batch1(row, model, cfg, fmt, cap, context, steps, prefill, reps, implementation, seed, rng, log):
  p1 = min(prefill, context // 4)
  len1 = context - steps - p1
  caches = filled_caches(model, 1, cap, fmt, len1, seed)
  prompts = jnp.asarray(rng.integers(1, cfg.vocab_size, (1, p1)), jnp.int32)
  run1 = _Runner(model, prompts, caches, len1, steps, implementation)
  t0 = time.perf_counter()
  first = run1(1)
  row["compile_b1_s"] = first - run1(1)
  step1, pre = _pairs(run1, 1, steps, reps)
  row.update(step_ms=None if step1 != step1 else step1 * 1e3, prefill_tokens=p1, prefill_ms=pre * 1e3,
             prefill_tokens_per_s=p1 / pre, b1_s=time.perf_counter() - t0)
  log(f"  b=1: step {step1 * 1e3:.2f} ms, prefill {p1} tok {pre * 1e3:.1f} ms")
  del run1, caches


def _max_batch(row, model, cfg, fmt, cap, context, b, steps, warm_steps, reps, target_s,
               implementation, seed, rng, log):
  # max batch: one-token prompt (a decode step), then the while_loop over full-length caches
  length = context - steps
  t0 = time.perf_counter()
  caches = filled_caches(model, b, cap, fmt, length, seed + 1)
  jax.block_until_ready(caches)
  row["fill_s"] = time.perf_counter() - t0
  prompts = jnp.asarray(rng.integers(1, cfg.vocab_size, (b, 1)), jnp.int32)
  run = _Runner(model, prompts, caches, length, steps, implementation)
  t0 = time.perf_counter()
  first = run(warm_steps)
  t_n0 = run(warm_steps)
  row["compile_s"] = first - t_n0
  est = max((run(2 * warm_steps) - t_n0) / warm_steps, 1e-6)  # per-step estimate
  n = int(min(steps, max(2 * warm_steps, warm_steps + round(target_s / est))))
  step, _ = _pairs(run, warm_steps, n, reps)
  noisy = step != step  # NaN: timing noise swamped the measurement
  row.update(tokens_per_s=None if noisy else b / step, step_ms_at_max_batch=None if noisy else step * 1e3,
             timing_noise=noisy, timed_steps=n - warm_steps,
             decode_s=time.perf_counter() - t0)
  peak, in_use = _peak_bytes()
  row["peak_gib"] = None if peak is None else peak / GIB
  row["in_use_gib"] = None if in_use is None else in_use / GIB
  if peak is not None:
    row["overhead_gib"] = row["peak_gib"] - row["weights_gib"] - row["kv_gib"]
  tps = "timing noise" if noisy else f"{row['tokens_per_s']:.0f} tok/s"  # noise: step is NaN
  log(f"  b={b}: {tps}, step {step * 1e3:.2f} ms, "
      f"peak {row['peak_gib'] if peak is None else round(row['peak_gib'], 2)} GiB")
  return row


# ----------------------------------------------------------------------------- driver


def _child(args) -> int:
  spec = json.loads(args.row)
  row = run_row(**spec, log=lambda m: print(m, file=sys.stderr, flush=True))
  with open(args.row_out, "w") as fh:
    json.dump(row, fh)
  return 0


def _subprocess_row(spec: dict, timeout: float) -> dict:
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
  env.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/kvjax_jax_cache")  # reruns skip compiles
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "row.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--row", json.dumps(spec), "--row-out", path]
    t0 = time.perf_counter()
    try:
      r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
      return {"error": f"timed out after {timeout:.0f} s"}
    if r.returncode or not os.path.exists(path):
      tail = (r.stderr or r.stdout)[-1500:]
      print(tail, file=sys.stderr)
      return {"error": f"exit {r.returncode}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"}
    row = json.load(open(path))
    row["row_wall_s"] = time.perf_counter() - t0
    sys.stderr.write(r.stderr[-600:])
    return row


from throughput_report import merge, plot, summary, write  # noqa: E402


def check_args(models, fmts, contexts) -> None:
  """Raises ValueError naming the flag for an unknown model or format or a context < 1, before any row runs
  (session 26's typo'd `fp8` failed only after the bf16 row had taken a minute of device time)."""
  bad = [m for m in models if m not in MODELS]
  if bad or not models:
    raise ValueError(f"--models: expected names in {sorted(MODELS)}, got {bad or models}")
  for f in fmts:
    try:
      formats.preset(f)
    except (KeyError, ValueError) as e:
      raise ValueError(f"--formats: {f!r} is not a format preset ({e})") from None
  if not fmts:
    raise ValueError("--formats: expected at least one format preset, got none")
  if not contexts or min(contexts) < 1:
    raise ValueError(f"--contexts: expected positive token counts, got {contexts}")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default="benchmarks/results/throughput_h200.json")
  ap.add_argument("--models", default="llama3_8b,gemma2_2b")
  ap.add_argument("--formats", default=",".join(FORMATS))
  ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
  ap.add_argument("--budget-gib", type=float, default=40.0, help="HBM budget for the KV caches")
  ap.add_argument("--steps", type=int, default=64, help="static decode steps (the cache ends at C)")
  ap.add_argument("--warm-steps", type=int, default=8, help="short run subtracted from the long one")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--prefill", type=int, default=512, help="prefill chunk (tokens) timed at batch 1")
  ap.add_argument("--target-s", type=float, default=1.0, help="aim for this long a timed run")
  ap.add_argument("--implementation", default=None, help="e.g. xla or pallas_gpu,xla (default: platform order)")
  ap.add_argument("--skip-b1", action="store_true", help="no batch-1 step latency / prefill")
  ap.add_argument("--mosaic-fp8", action="store_true",
                  help="FP8 caches through the Mosaic GPU kernel (pallas_kernels.gpu.mosaic_fp8), not Triton's")
  ap.add_argument("--mosaic-int8", action="store_true", help="INT8 caches through the same Mosaic kernel")
  ap.add_argument("--kivi-words-g32", action="store_true",
                  help="KIVI-2 G=32 caches in the 'words' layout: the Mosaic GPU kernel (mosaic_groups), not Triton's "
                       "(the default since session 22; kept for the session-22 command)")
  ap.add_argument("--in-process", action="store_true", help="no subprocess per row (peak is cumulative)")
  ap.add_argument("--row-timeout", type=float, default=300.0)
  ap.add_argument("--plan", action="store_true", help="print byte-count predictions and exit")
  ap.add_argument("--merge", nargs="*", help="merge result files into --out, plot, summarize")
  ap.add_argument("--row", help=argparse.SUPPRESS)
  ap.add_argument("--row-out", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.row:
    return _child(args)
  models = [m for m in args.models.split(",") if m]
  fmts = [f for f in args.formats.split(",") if f]
  contexts = [int(c) for c in args.contexts.split(",") if c]
  budget = int(args.budget_gib * GIB)
  if not args.merge:
    check_args(models, fmts, contexts)
  if args.plan:
    for r in plan(models, fmts, contexts, budget):
      print(f"{r['model']:10s} {r['format']:9s} {r['context']:6d} bytes/seq {r['bytes_per_seq'] / 2**20:9.1f} MiB "
            f"max_batch {r['max_batch']:4d} ({r['batch_ratio']:.2f}x)  roofline step {r['ideal_step_ms']:.2f} ms "
            f"{r['ideal_tokens_per_s']:8.0f} tok/s ({r['ideal_tps_ratio']:.2f}x)  weights {r['weights_gib']:.1f} GiB")
    return 0
  if args.merge:
    rows = merge(args.merge, args.out)
  else:
    impl = None if not args.implementation else (
        args.implementation if "," not in args.implementation else tuple(args.implementation.split(",")))
    meta = dict(argv=sys.argv[1:] if argv is None else list(argv), jax=jax.__version__,
                backend=jax.default_backend(), device=str(jax.devices()[0].device_kind),
                budget_gib=args.budget_gib, steps=args.steps, warm_steps=args.warm_steps, reps=args.reps,
                prefill=args.prefill, default_order=list(dispatch.default_order()))
    try:
      from tqdm import tqdm
    except ImportError:  # progress is optional
      tqdm = None
    specs = [dict(model_name=m, fmt_name=f, context=c, budget_bytes=budget, steps=args.steps,
                  warm_steps=args.warm_steps, reps=args.reps, prefill=args.prefill,
                  target_s=args.target_s, implementation=impl, skip_b1=args.skip_b1,
                  **{flag: True for flag in ("mosaic_fp8", "mosaic_int8", "kivi_words_g32") if getattr(args, flag)})
             for m in models for c in contexts for f in fmts]
    bar = tqdm(specs, desc="throughput", file=sys.stderr, dynamic_ncols=True) if tqdm else specs
    rows = []
    for spec in bar:
      tag = f"{spec['model_name']} {spec['fmt_name']} {spec['context']}"
      if tqdm:
        bar.set_postfix_str(tag)
      else:
        print(tag, file=sys.stderr, flush=True)
      t0 = time.perf_counter()
      if args.in_process:
        try:
          row = run_row(**spec, log=lambda m: print(m, file=sys.stderr, flush=True))
        except Exception as e:  # noqa: BLE001  (keep the sweep going; the row says why)
          row = {"error": f"{type(e).__name__}: {e}"[:500]}
      else:
        row = _subprocess_row(spec, args.row_timeout)
      base = dict(model=spec["model_name"], format=spec["fmt_name"], context=spec["context"],
                  max_batch=None, tokens_per_s=None, step_ms=None, peak_gib=None)
      if "max_batch" not in row or row.get("max_batch") is None:
        try:
          base["max_batch"] = max_batch_for(MODELS[spec["model_name"]](), formats.preset(spec["fmt_name"]),
                                            spec["context"], budget)
        except Exception:  # noqa: BLE001
          pass
      row = {**base, **row}
      row.setdefault("row_wall_s", time.perf_counter() - t0)
      rows.append(row)
      write(rows, meta, args.out)
  plot(rows, os.path.splitext(args.out)[0] + ".png")
  print(summary(rows), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
