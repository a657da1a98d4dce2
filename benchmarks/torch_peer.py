"""The torch peer of the decode benchmarks: `torch.nn.functional.scaled_dot_product_attention` over bf16 caches
(GQA), timed in a subprocess (so a machine without torch, or a torch that fails, costs no row) by CUDA events
around a CUDA graph of chained steps over caches rotated beyond L2, as `decode_kernels.time_loop` times JAX's."""

from __future__ import annotations

import json
import subprocess
import sys

__all__ = ["TORCH_SNIPPET", "torch_sdpa_row"]

TORCH_SNIPPET = r"""
import json, sys, torch, torch.nn.functional as F
b, ctx, reps, K, N, H = map(int, sys.argv[1:7])
length = ctx - 256
per = b * ctx * K * H * 2
ns = int(min(16, max(1, -(-3 * 60e6 // (2 * per)))))
kv = [(torch.randn(b, K, length, H, device="cuda", dtype=torch.bfloat16),
       torch.randn(b, K, length, H, device="cuda", dtype=torch.bfloat16)) for _ in range(ns)]
q = torch.randn(b, N, 1, H, device="cuda", dtype=torch.bfloat16)
def run(q, n):
  for _ in range(n):
    for k, v in kv:
      q = q + 1e-3 * F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
  return q
steps = int(max(2, min(100, 30000 / max(2 * per / 3e6, 1) / ns)))
run(q, 2); torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
  out = run(q, steps)
g.replay(); torch.cuda.synchronize()
ts = []
for _ in range(reps):
  e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
  ts.append(e0.elapsed_time(e1) * 1e3 / (steps * ns))
ts.sort()
print(json.dumps({"us": ts[len(ts) // 2], "bytes": 2 * per * length / ctx}))
"""



def torch_sdpa_row(b: int, ctx: int, reps: int, k_heads: int, n_heads: int, head_dim: int):
  """(median us a step, bytes read a step) of torch SDPA at batch b and context ctx (filled to ctx - 256), or
  None where torch is absent or fails."""
  try:
    args = (b, ctx, reps, k_heads, n_heads, head_dim)
    r = subprocess.run([sys.executable, "-c", TORCH_SNIPPET, *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return d["us"], d["bytes"]
  except Exception as e:  # torch absent or failed: no row
    print("torch_sdpa failed:", repr(e)[:200], file=sys.stderr)
    return None
