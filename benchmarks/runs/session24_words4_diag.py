"""Session 23 (prepared for the next device run): which part of the compiled one-kernel writer over 4-bit
"words" caches does not finish (session 23, H100: `test_pallas_append_equals_xla_append[kivi4]` ran 90 s
without finishing; the writer compiles for an H200 in 11 s, `session23/writer_aot_h200.json`). Each case in
a subprocess with its own timeout, with `write.NATIVE_WORDS_BITS = (2, 4)`; the 2-bit cases beside them as
the control. Prints ok (bit-identical to the XLA scatters) / the error / TIMEOUT.

    python3 benchmarks/runs/session24_words4_diag.py [case | case,case,...]
"""
import subprocess
import sys

# (format, G, prefill lengths, T): T=1 with no flush (values only: G=128 quantized in the kernel, G=32 by
# XLA and stored as planes), T=1 across a key block end (the flush), T=3 ragged
CASES = {f"{name}_{what}": (bits, g, lengths, t)
         for name, bits, g in (("kivi2_g128", 2, 128), ("kivi4_g128", 4, 128), ("kivi2_g32", 2, 32), ("kivi4_g32", 4, 32))
         for what, lengths, t in (("values", [5, 40], 1), ("flush", [127, 255], 1), ("t3", [126, 10], 3))}


def run(case):
  import jax
  import jax.numpy as jnp
  import numpy as np
  sys.path.insert(0, ".")
  from kvjax import cache as cache_lib, formats
  from pallas_kernels.gpu import write
  write.NATIVE_WORDS_BITS = (2, 4)
  bits, g, lengths, t = CASES[case]
  c = cache_lib.init_cache(formats.kivi(bits, g, 128), len(lengths), 2, 512, 128, kivi_layout="words")
  x = jax.random.normal(jax.random.PRNGKey(0), (len(lengths), 2, 512, 128))
  c = cache_lib.append(c, x, -x, jnp.asarray(lengths))
  k = jax.random.normal(jax.random.PRNGKey(1), (len(lengths), 2, t, 128))
  want = jax.jit(cache_lib.append)(c, k, -k)
  native = jax.default_backend() == "gpu"  # elsewhere interpreted (a check of this script)
  got = jax.jit(lambda c_, k_: write.append(c_, k_, -k_, interpret=not native))(c, k)
  for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(jax.block_until_ready(got)), strict=True):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
  print(f"{case}: ok, bit-identical", flush=True)


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] in CASES:
    run(sys.argv[1])
  else:  # all cases, or those named comma-separated
    for c in (sys.argv[1].split(",") if len(sys.argv) > 1 else CASES):
      try:
        r = subprocess.run([sys.executable, __file__, c], capture_output=True, text=True, timeout=60)
        lines = [x for x in (r.stdout + r.stderr).splitlines() if "ok," in x or "Error" in x]
        print(f"{c}: rc={r.returncode} " + (" | ".join(lines[-3:])[:400] if lines else r.stderr[-300:]), flush=True)
      except subprocess.TimeoutExpired:
        print(f"{c}: TIMEOUT (60 s)", flush=True)
