"""How well the query split into e4m3 terms (`mosaic_fp8.split_e4m3`'s rule: a power of two per row block
putting the largest |q| in [128, 256), each term rounding what the earlier left) keeps the logits, against
fp16 and bf16 queries: relative RMS logit error on random data (e4m3 key codes ~N(0, 40), q ~N(0, 0.13)
with 4 outlier channels x8), in numpy with ml_dtypes. Session 18 (`Fp8Options.key_terms`).

  python benchmarks/split_precision.py     # a second; results/split_precision.json
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn


def split(x, terms):
  e = np.floor(np.log2(np.abs(x).max(axis=1, keepdims=True)))
  sc = 2.0 ** (7 - e)
  y, out = x * sc, []
  for _ in range(terms):
    t = y.astype(E4M3).astype(np.float64)
    out.append(t)
    y = y - t
  return sum(out) / sc


def main(out="benchmarks/results/split_precision.json"):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(16, 128)) * 0.13
  q[:, :4] *= 8
  k = (rng.normal(size=(4096, 128)) * 40).astype(E4M3).astype(np.float64)
  exact = k @ q.T
  err = lambda approx: float(np.sqrt(np.mean((approx - exact) ** 2)) / np.sqrt(np.mean(exact ** 2)))
  res = {f"e4m3_terms_{n}": err(k @ split(q, n).T) for n in (1, 2, 3)}
  res["fp16"] = err(k @ q.astype(np.float16).astype(np.float64).T)
  res["bf16"] = err(k @ q.astype(ml_dtypes.bfloat16).astype(np.float64).T)
  res["command"] = "python benchmarks/split_precision.py"
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as fh:
    json.dump(res, fh, indent=1)
  print(json.dumps(res))
  return res


if __name__ == "__main__":
  main()
