"""Session 37: KIVI-2 G=128 through `ops.decode_attention` (query preparation, the kernel with its window
program, XLA's merge) with the committed default build and with `Options.fp8_mma` (preset "dequant_fp8"),
beside torch SDPA in the same process: `benchmarks/decode_kernels.py` run once per build with
`mosaic_decode.DEFAULT_VARIANT` set (it is read at each call).

    python3 benchmarks/runs/session37_ops.py OUT_DIR [B:context,...] [variant,...]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import decode_kernels  # noqa: E402
from pallas_kernels.gpu import mosaic_decode as md  # noqa: E402


def main(out_dir, points="8:32768", variants=""):
  builds = variants.split(",") if variants else [md.DEFAULT_VARIANT, "dequant_fp8"]
  for i, variant in enumerate(builds):
    md.DEFAULT_VARIANT = variant
    for point in points.split(","):
      b, ctx = point.split(":")
      sys.argv = ["decode_kernels.py", "--batches", b, "--contexts", ctx, "--formats", "kivi2_g128",
                  "--peers", "torch_sdpa" if i == 0 else "", "--step-batches", "0", "--reps", "5", "--stream-gb", "1",
                  "--out", os.path.join(out_dir, f"ops_{variant}_b{b}_{ctx}.json")]
      decode_kernels.main()


if __name__ == "__main__":
  main(*sys.argv[1:])
