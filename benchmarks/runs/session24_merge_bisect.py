"""Session 24: which option of the KIVI Mosaic kernel makes its counted in-kernel merge hang natively (session
22/23: `merged=..., merge_by="count"` hangs with and without the window for the default build
`dequant_denorm_s32_mb`, where the FP8 kernel's counted merge passes). The same merge over builds that drop
one option at a time: Mosaic's automatic barriers back on (`_mb`), the splits' length-bounded / balanced ranges
off (`stop_at_length`, `balance`), the dequantization out of WGMMA's A operand (`lean`, resident query). Each
case in a subprocess with its own timeout; prints ok + the relative error against the XLA merge, or the error,
or TIMEOUT.

    python3 benchmarks/runs/session24_merge_bisect.py [variant:window,...]   (window: w or n)
"""
import subprocess
import sys

CASES = ("dequant_denorm_s32_mb:n", "dequant_denorm_s32:n", "dequant_mask_s16_bal:n", "dequant_mask_s16:n",
         "lean:n", "dequant_denorm_s32:w")


def run(case):
  import jax
  import jax.numpy as jnp
  import numpy as np
  sys.path.insert(0, ".")
  from pallas_kernels import test_base
  from pallas_kernels.gpu import decode, mosaic_kivi as mk
  variant, win = case.split(":")
  b, kh, rep = 2, 1, 4
  q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case((300, 2), num_kv_heads=kh, capacity=512)
  args = (ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  key = jax.random.PRNGKey(0)
  ring = lambda i: jax.random.normal(jax.random.fold_in(key, i), (b, kh, 128, 128), jnp.bfloat16)
  window = (ln + 128, ring(1), ring(2), 1) if win == "w" else None
  q = (jax.random.normal(key, (b, kh, rep, 128)) * 0.3).astype(jnp.bfloat16)
  scale = jnp.float32(0.125 * decode.LOG2E)
  kw = dict(num_splits=2, variant=variant, window=window, interpret=jax.default_backend() != "gpu")
  ref_qt = jnp.pad((q.astype(jnp.float32) * scale).swapaxes(-1, -2), ((0, 0), (0, 0), (0, 0), (0, 16 - rep)))
  o, m, l = mk.kivi2_states(ref_qt, *args, **kw)
  ref = decode.combine(o.swapaxes(-1, -2), m, l, rep)
  print(f"{case}: states ok", flush=True)
  if kw["interpret"]:
    return  # the counted merge is native only
  out = mk.kivi2_states(ref_qt, *args, merged=(rep, jnp.float32), merge_by="count", **kw)
  err = test_base.relative_error(np.asarray(jax.block_until_ready(out), np.float32)[:, :, :rep], np.asarray(ref))
  print(f"{case}: ok, relative error {err:.2e}", flush=True)


if __name__ == "__main__":
  if len(sys.argv) > 2:  # one case, in this process
    run(sys.argv[1])
  else:
    for c in (sys.argv[1].split(",") if len(sys.argv) > 1 else CASES):
      try:
        r = subprocess.run([sys.executable, __file__, c, "--one"], capture_output=True, text=True, timeout=45)
        lines = [x for x in (r.stdout + r.stderr).splitlines() if "ok" in x or "Error" in x]
        print(f"{c}: rc={r.returncode} " + (" | ".join(lines[-3:])[:400] if lines else r.stderr[-300:]), flush=True)
      except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"{c}: TIMEOUT (45 s) {out.strip()[-200:]}", flush=True)
