"""Session 22: which part of the KIVI-2 kernel's in-kernel glue hangs natively (session22_c.sh: the count merge
test at 1 split + the window timed out at 60 s; session22_a.sh: every KIVI merge test failed). Each case in a
subprocess with its own timeout: the query read in the kernel (q_scale) alone, the merge by count without
q_scale, both, and the merge of 2 splits without the window; prints ok / the error / TIMEOUT.

    python3 benchmarks/runs/session22_kivi_merge_diag.py [case]
"""
import subprocess
import sys

CASES = ("q_scale", "merge", "merge_q", "merge_nowindow")


def run(case):
  import jax
  import jax.numpy as jnp
  import numpy as np
  sys.path.insert(0, ".")
  from pallas_kernels import test_base
  from pallas_kernels.gpu import decode, mosaic_kivi as mk
  b, kh, rep = 2, 1, 4
  q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case((300, 2), num_kv_heads=kh, capacity=512)
  args = (ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  key = jax.random.PRNGKey(0)
  ring = lambda i: jax.random.normal(jax.random.fold_in(key, i), (b, kh, 128, 128), jnp.bfloat16)
  window = None if case == "merge_nowindow" else (ln + 128, ring(1), ring(2), 1)
  q = (jax.random.normal(key, (b, kh, rep, 128)) * 0.3).astype(jnp.bfloat16)
  scale = jnp.float32(0.125 * decode.LOG2E)
  kw = dict(num_splits=2, variant="dequant_denorm_s32_mb", window=window,
            interpret=jax.default_backend() != "gpu")  # the merges run natively only
  ref_qt = jnp.pad((q.astype(jnp.float32) * scale).swapaxes(-1, -2), ((0, 0), (0, 0), (0, 0), (0, 16 - rep)))
  o, m, l = mk.kivi2_states(ref_qt, *args, **kw)
  ref = decode.combine(o.swapaxes(-1, -2), m, l, rep)
  if case == "q_scale":
    o2, m2, l2 = mk.kivi2_states(q, *args, q_scale=scale, **kw)
    out = decode.combine(o2.swapaxes(-1, -2), m2, l2, rep)
  elif case == "merge":
    out = mk.kivi2_states(ref_qt, *args, merged=(rep, jnp.float32), merge_by="count", **kw)
  else:
    out = mk.kivi2_states(q if case != "merge_nowindow" else ref_qt, *args, merged=(rep, jnp.float32),
                          q_scale=scale if case != "merge_nowindow" else None,
                          merge_by="cluster" if case == "cluster_q" else "count", **kw)
  err = test_base.relative_error(np.asarray(jax.block_until_ready(out), np.float32)[:, :, :rep], np.asarray(ref))
  print(f"{case}: ok, relative error {err:.2e}", flush=True)


if __name__ == "__main__":
  if len(sys.argv) > 1:
    run(sys.argv[1])
  else:
    for c in CASES:
      try:
        r = subprocess.run([sys.executable, __file__, c], capture_output=True, text=True, timeout=30)
        lines = [x for x in (r.stdout + r.stderr).splitlines() if "ok," in x or "Error" in x]
        print(f"{c}: rc={r.returncode} " + (" | ".join(lines[-3:])[:400] if lines else (r.stderr[-300:])), flush=True)
      except subprocess.TimeoutExpired:
        print(f"{c}: TIMEOUT (30 s)", flush=True)
