"""Session 29, prepared for a device: the compiled one-kernel writer at Gemma 2's head_dim 256 with G=32 keys (held
back by `write.NATIVE_WIDE_WORDS_GROUPS`), with its in-kernel key flush and without it (`flush_in_kernel=False`:
XLA quantizes the key block, the kernel stores it and quantizes the values). Session 29: a throughput row with the
in-kernel flush did not finish in 200 s; compiled for an H200 on the CPU that writer takes 47 s, 1.3 s without.
Each case runs in its own subprocess with a time limit: bit-identity against XLA's scatters over single-token
appends across a key block's end (127 -> 128) and a full cache, then the append alone timed (`decode_kernels`'
`append_only` over caches rotated beyond L2, Gemma-2-2B heads) beside XLA's scatters ("xla") in the same process.

    python3 benchmarks/runs/session30_writer.py OUT.json [B:context] [fmt,...]    (TIMEOUT env: seconds a case)
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
WRITERS = ("xla", "kernel_flush", "xla_flush")  # who stores the rows / who quantizes the key block


def case(fmt_name, writer, b, ctx):
  import functools
  import jax
  import jax.numpy as jnp
  import numpy as np
  import decode_kernels as dk
  from kvjax import cache as cache_lib, formats
  from pallas_kernels.gpu import write
  write.NATIVE_WIDE_WORDS_GROUPS = {128: None, 32: None}
  dk.SHAPE = dk.SHAPES["gemma2_2b"]
  fn = (cache_lib.append if writer == "xla" else
        functools.partial(write.append, flush_in_kernel=writer == "kernel_flush"))
  row = dict(format=fmt_name, writer=writer, batch=b, context=ctx, device=jax.devices()[0].device_kind)
  t0 = time.perf_counter()
  fmt, h = formats.preset(fmt_name), dk.SHAPE.head_dim
  c = cache_lib.init_cache(fmt, 4, dk.SHAPE.k_heads, 384, h, kivi_layout="words")
  x = jax.random.normal(jax.random.PRNGKey(0), (4, dk.SHAPE.k_heads, 384, h)) * jnp.linspace(0.1, 4, h)
  c = cache_lib.append(c, x, -x, jnp.asarray([0, 126, 127, 383]))
  want, got = c, c
  step = jax.jit(lambda c_, t_, f: f(c_, t_, t_ * 0.25), static_argnums=2)
  for i in range(3):
    t = jax.random.normal(jax.random.PRNGKey(i + 1), (4, dk.SHAPE.k_heads, 1, h), jnp.bfloat16)
    want, got = step(want, t, cache_lib.append), step(got, t, fn)
  diff = [jax.tree_util.keystr(p) for (p, a), bb in zip(jax.tree_util.tree_leaves_with_path(want),
                                                         jax.tree_util.tree_leaves(got))
          if not np.array_equal(np.asarray(a), np.asarray(bb))]
  row.update(bit_identical=not diff, differing_leaves=diff, check_s=time.perf_counter() - t0)
  length, nb, ns, caches, q = dk.cache_sets(fmt_name, b, ctx, jax.random.PRNGKey(7))
  caches = tuple(cache_lib.with_kivi_layout(cc, "words") for cc in caches)
  t0 = time.perf_counter()
  row["append_us"] = dk.time_loop(dk.append_only(fn, b, ctx, length), (q, caches), 64, 3) / ns
  row["time_s"] = time.perf_counter() - t0
  return row


def main():
  if sys.argv[1] == "--case":
    fmt_name, writer, b, ctx = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    print("ROW " + json.dumps(case(fmt_name, writer, b, ctx)), flush=True)
    return
  out = sys.argv[1]
  b, ctx = map(int, (sys.argv[2] if len(sys.argv) > 2 else "8:32768").split(":"))
  fmts = (sys.argv[3] if len(sys.argv) > 3 else "kivi2,kivi4").split(",")
  timeout = float(os.environ.get("TIMEOUT", 150))
  rows = []
  for fmt_name in fmts:
    for writer in WRITERS:
      t0 = time.perf_counter()
      try:
        r = subprocess.run([sys.executable, __file__, "--case", fmt_name, writer, str(b), str(ctx)],
                           capture_output=True, text=True, timeout=timeout)
        found = [ln[4:] for ln in r.stdout.splitlines() if ln.startswith("ROW ")]
        row = json.loads(found[0]) if found else dict(error=(r.stderr or r.stdout)[-800:])
      except subprocess.TimeoutExpired:
        row = dict(error=f"timed out after {timeout:.0f} s")
      row.update(format=fmt_name, writer=writer, batch=b, context=ctx, wall_s=time.perf_counter() - t0)
      rows.append(row)
      print({k: v for k, v in row.items() if k != "error"}, row.get("error", "")[-300:], flush=True)
      with open(out, "w") as fh:
        json.dump({"rows": rows}, fh, indent=1)


if __name__ == "__main__":
  main()
