"""Session 24: the KIVI Mosaic path's glue in the kernel (`mosaic_decode.GLUE_IN_KERNEL`: the query's scale /
transpose / pad and the quantized lengths inside the kernel, 2 launches a call instead of 4), then also the
merge as one Triton kernel (`merge.merge_states`, forced at every point here: `mosaic_decode.pallas_merge_default`
now keeps XLA's at B=1 1k), against the default before session 24, through `ops.decode_attention`, at the short
contexts where the glue is a large share of the call, torch SDPA (bf16) in the same run. Checks first that the
three give the same numbers on the timed caches. Writes JSON.

    python3 benchmarks/runs/session24_glue.py OUT.json [fmt,fmt] [B:ctx,B:ctx]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../.."))
import jax  # noqa: E402
import numpy as np  # noqa: E402

import decode_kernels as dk  # noqa: E402
from pallas_kernels.gpu import mosaic_decode as md, ops  # noqa: E402


def main():
  out = sys.argv[1]
  fmts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["kivi2", "kivi2_g128"]
  points = [tuple(map(int, p.split(":"))) for p in (sys.argv[3] if len(sys.argv) > 3 else
                                                     "1:1024,8:1024,1:4096,8:32768,8:4096").split(",")]
  reps = int(os.environ.get("REPS", 5))
  res = {"device": jax.devices()[0].device_kind, "rows": []}
  key = jax.random.PRNGKey(0)
  defaults = md.GLUE_IN_KERNEL, md.pallas_merge_default
  for b, ctx in points:
    tr = dk.torch_row(b, ctx, reps) if jax.default_backend() == "gpu" else None
    res["rows"].append(dict(impl="torch_sdpa", format="bf16", batch=b, context=ctx, us=tr and tr[0]))
    for f in fmts:
      _, _, _, caches, q = dk.cache_sets(f, b, ctx, key)
      outs = []
      for glue, pm in ((False, False), (True, False), (True, True)):
        md.GLUE_IN_KERNEL, md.pallas_merge_default = glue, (lambda *_, pm=pm: pm)
        outs.append(np.asarray(jax.jit(ops.decode_attention)(q, caches[0]), np.float32))
        try:
          (_, us, nb), = dk.kvjax_rows(f, b, ctx, reps, key, False)
        except Exception as e:  # noqa: BLE001 (a failed build is a row with its error)
          us, nb = None, repr(e)[:300]
        impl = "kvjax" + ("_glue" if glue else "") + ("_pmerge" if pm else "")
        res["rows"].append(dict(impl=impl, format=f, batch=b, context=ctx, us=us,
                                bytes_read=nb))
        print(res["rows"][-1], flush=True)
      md.GLUE_IN_KERNEL, md.pallas_merge_default = defaults
      diff = float(np.max(np.abs(outs[0] - outs[1])))
      res["rows"][-2]["max_abs_diff_vs_default"] = diff
      res["rows"][-1]["max_abs_diff_vs_default"] = float(np.max(np.abs(outs[0] - outs[2])))
      print(f"{f} B={b} {ctx}: torch {tr and tr[0]}, max |glue - default| {diff:.3g}", flush=True)
      with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
  main()
