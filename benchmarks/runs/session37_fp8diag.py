"""Session 37: which B row each k column of an e4m3 register-A WGMMA meets (`wgmma_rate.py`'s e4m3 cases came
out wrong natively, 0.77 relative). One program, one slab, one iteration: A = 1 at column j of every row (else
0), B random: row 0 of the output is B's row perm(j) (B as [K, N]); also A = ones (column sums of B) and B =
ones (row sums of A), which hold under any k permutation.

    python3 benchmarks/runs/session37_fp8diag.py OUT.json
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import wgmma_rate as wr  # noqa: E402


def main(out_path, text="e4m3:16:1:1"):
  case = wr.Case.parse(text)
  dt, k = wr.DTYPES[case.dtype]
  f = jax.jit(wr.rate_kernel(case, 1, 1, 1))
  _, b = wr.inputs(case, 1, jax.random.PRNGKey(3))
  bits = lambda a: lax.bitcast_convert_type(a.astype(dt), jnp.uint8 if case.dtype == "e4m3" else jnp.uint16)
  full = np.asarray((b.T if wr.k_major(case) else b).astype(jnp.float32))  # [K, N]
  res = {"case": text}
  ones = jnp.ones((wr.ROWS, k), jnp.float32)
  got = np.asarray(f(bits(ones), b))[0]
  res["a_ones_err"] = float(np.max(np.abs(got - full.sum(0)[None])))
  a_rand = jax.random.uniform(jax.random.PRNGKey(4), (wr.ROWS, k), jnp.float32, -1, 1).astype(dt)
  got = np.asarray(f(bits(a_rand), jnp.ones_like(b)))[0]
  res["b_ones_err"] = float(np.max(np.abs(got - np.asarray(a_rand.astype(jnp.float32)).sum(1)[:, None])))
  perm, resid = [], []
  for j in range(k):
    got = np.asarray(f(bits(jnp.zeros((wr.ROWS, k)).at[:, j].set(1.0)), b))[0]
    d = np.abs(got[:1] - full).max(1)
    perm.append(int(np.argmin(d)))
    resid.append(float(d.min()))
    res.setdefault("rows_alike", []).append(float(np.abs(got - got[:1]).max()))
  res["perm"], res["perm_residual"] = perm, resid
  print(json.dumps(res))
  with open(out_path, "w") as fh:
    json.dump(res, fh, indent=1)


if __name__ == "__main__":
  main(*sys.argv[1:])
