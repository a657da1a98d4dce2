"""Static cost of the GPU decode kernels, compiled for an H200 (sm_90a) on a machine without one.

Pallas lowers each kernel to Triton IR (`pallas_kernels.gpu.lowering_check`); the `triton` wheel
(which bundles ptxas and cuobjdump) compiles that IR for sm_90a; this script reads the result:
registers per thread, spills, dynamic shared memory, programs per SM that fit, and for the main
loop (the longest backward branch in the SASS) its instruction count and mix, shared-memory loads
by width, and the plain global loads (`LDG`: Triton pipelines only what it can copy with
cp.async, `LDGSTS`; the rest are waited on where they are used). Per iteration it divides by the cache bytes the iteration consumes.

Setup (a separate venv: the wheel is large and only this script needs it):
  python3.12 -m venv /tmp/tv && /tmp/tv/bin/pip install triton
  python benchmarks/kernel_sass.py --triton-python /tmp/tv/bin/python \\
      --variants 'fp8_e4m3;fp8_e4m3:{"prefetch":0,"block":128};kivi2;kivi2_g128' \\
      --out benchmarks/results/kernel_sass.json

Caveat: the wheel's Triton is not byte-for-byte the one inside jaxlib that compiles these kernels
on the GPU, so this is a model of the device's code, not a copy. It found the synchronous scale
loads that session 4's prefetch removed (measured faster on the H200); times come only from
`decode_kernels.py` on the device.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

H200 = {"regs_per_sm": 65536, "smem_per_sm": 228 * 1024, "max_threads_per_sm": 2048}

# Run in the triton venv: compile one .ttir, write the cubin and TTGIR, print metadata as JSON.
_COMPILE = r"""
import json, sys, os
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import triton
from triton.backends.compiler import GPUTarget
path, warps, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
k = triton.compile(path, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
stem = os.path.splitext(path)[0]
open(stem + ".cubin", "wb").write(k.asm["cubin"])
open(stem + ".ttgir", "w").write(k.asm["ttgir"])
bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
print(json.dumps({"shared": k.metadata.shared, "triton": triton.__version__, "bin": bin_dir}))
"""


def parse_variant(text):
  name, _, opts = text.partition(":")
  return name, json.loads(opts) if opts else {}


def lower(fmt_name, opts, shape, batch=8, capacity=2048):
  """Triton IR text of the decode kernel, and the plan it ran (`shape`: a kernel_variants.HeadShape)."""
  from pallas_kernels import test_base
  from pallas_kernels.gpu import lowering_check, ops
  from kvjax import cache as cache_lib, formats
  gpu_tile = cache_lib.default_value_tile(formats.preset(fmt_name), capacity, backend="gpu")
  q, c = test_base.make_case(fmt_name, [capacity // 2] * batch, num_kv_heads=shape.k_heads,
                             rep=shape.rep, head_dim=shape.head_dim, capacity=capacity,
                             value_tile=gpu_tile)  # the cache layout a GPU run gets by default
  from kernel_variants import split_layout
  layout, opts = split_layout(opts)
  c = layout(c)
  mods = lowering_check.lower(q, c, logit_softcap=shape.softcap, **opts)
  plan_opts = {k: v for k, v in opts.items() if k not in ("num_warps", "num_stages")}
  plan = ops.plan_for(c, 1, shape.rep, softcap=shape.softcap, **plan_opts)
  return mods[0], plan


def sass_instructions(sass):
  out = []
  for line in sass.splitlines():
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
      out.append((int(m.group(1), 16), m.group(2)))
  return out


def main_loop(ins):
  """(start, end) of the longest backward branch: the kernel's main loop."""
  best = None
  for addr, text in ins:
    m = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
    if m and int(m.group(1), 16) < addr:
      span = (int(m.group(1), 16), addr)
      if best is None or span[1] - span[0] > best[1] - best[0]:
        best = span
  return best


def opcode(text):
  return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def bytes_per_iteration(plan, head_dim=128):
  """Cache bytes one main-loop iteration consumes (codes and scales of K and V)."""
  from pallas_kernels.gpu import decode, kivi
  if isinstance(plan, decode.FlatPlan):
    per_tok = {"bf16": 2 * head_dim, "f8": head_dim, "i8": head_dim, "i4": head_dim // 2}
    b = plan.block * (per_tok[plan.key_kind] + per_tok[plan.value_kind])
    return b + plan.block * 2 * (plan.key_scaled + plan.value_scaled)
  assert isinstance(plan, kivi.KiviPlan)
  u = plan.key_unit if plan.tile_loop else plan.residual
  codes = u * head_dim * (plan.key_bits + plan.value_bits) // 8
  kscale = 2 * 2 * head_dim * u / plan.key_group
  vscale = 2 * 2 * u * head_dim / plan.value_group
  return codes + kscale + vscale


def analyze(fmt_name, opts, py, workdir, shape=None):
  from pallas_kernels.gpu import ops
  from kernel_variants import SHAPES
  shape = shape or SHAPES["llama3_8b"]
  stages = opts.get("num_stages", ops.QUANT_STAGES if fmt_name != "bf16" else 2)
  ir, plan = lower(fmt_name, opts, shape)
  warps = opts.get("num_warps", ops.default_warps(plan, shape.head_dim))  # as ops.decode_attention runs it
  tag = re.sub(r"[^A-Za-z0-9_]+", "_", fmt_name + json.dumps(opts, sort_keys=True))
  path = os.path.join(workdir, tag + ".ttir")
  with open(path, "w") as f:
    f.write(ir)
  meta = json.loads(subprocess.run([py, "-c", _COMPILE, path, str(warps), str(stages)], check=True,
                                   capture_output=True, text=True).stdout.strip().splitlines()[-1])
  cubin = path[:-5] + ".cubin"
  res = subprocess.run([os.path.join(meta["bin"], "cuobjdump"), "-res-usage", cubin],
                       capture_output=True, text=True, check=True).stdout
  regs = int(re.search(r"REG:(\d+)", res).group(1))
  local = int(re.search(r"LOCAL:(\d+)", res).group(1))
  sass = subprocess.run([os.path.join(meta["bin"], "cuobjdump"), "-sass", cubin],
                        capture_output=True, text=True, check=True).stdout
  ins = sass_instructions(sass)
  lo, hi = main_loop(ins)
  body = [t for a, t in ins if lo <= a <= hi]
  mix = collections.Counter(opcode(t).split(".")[0] for t in body)
  mem = collections.Counter(opcode(t) for t in body if re.match(r"(LDS|STS|LDSM|STSM|LDG|LDGSTS)\b",
                                                               opcode(t).split(".")[0]))
  threads = 32 * warps
  by_regs = H200["regs_per_sm"] // (-(-regs // 8) * 8 * threads)
  by_smem = H200["smem_per_sm"] // max(meta["shared"], 1)
  nbytes = bytes_per_iteration(plan, shape.head_dim)
  return {
      "format": fmt_name, "options": opts, "num_warps": warps, "num_stages": stages,
      "registers": regs, "local_bytes": local, "shared_bytes": meta["shared"],
      "programs_per_sm": int(min(by_regs, by_smem, H200["max_threads_per_sm"] // threads)),
      "loop_instructions": len(body), "loop_bytes": nbytes,
      "warp_instructions_per_byte": round(len(body) * warps / nbytes, 3),
      "loop_mix": dict(mix.most_common(12)), "loop_memory_ops": dict(mem),
      # plain global loads (not cp.async): waited on in the iteration that issues them unless
      # they are prefetched (then the next iteration uses them)
      "loop_plain_global_loads": sum(v for k, v in mem.items() if k.startswith("LDG.") or k == "LDG"),
      "triton": meta["triton"],
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--triton-python", required=True, help="python of a venv with the triton wheel")
  ap.add_argument("--variants", default="bf16;fp8_e4m3;int8;int4;kivi4;kivi2;kivi2_g128",
                  help="';'-separated format[:json options]")
  ap.add_argument("--out", default="benchmarks/results/kernel_sass.json")
  ap.add_argument("--shape", default="llama3_8b", help="head shape (kernel_variants.SHAPES)")
  args = ap.parse_args(argv)
  from kernel_variants import SHAPES
  shape = SHAPES[args.shape]
  import jax
  rows = []
  with tempfile.TemporaryDirectory() as workdir:
    for text in filter(None, args.variants.split(";")):
      fmt_name, opts = parse_variant(text)
      row = analyze(fmt_name, opts, args.triton_python, workdir, shape)
      rows.append(row)
      print(f"{fmt_name:11s} {json.dumps(opts):38s} regs {row['registers']:3d} spill {row['local_bytes']} "
            f"smem {row['shared_bytes'] // 1024:3d}K  {row['programs_per_sm']}/SM  loop {row['loop_instructions']:4d} "
            f"instr / {row['loop_bytes']:.0f} B = {row['warp_instructions_per_byte']:.3f} warp-instr/B  "
            f"LDG {row['loop_plain_global_loads']}", flush=True)
  result = {"command": "python benchmarks/kernel_sass.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "target": "sm_90a (H200), compiled on the CPU", "shape": args.shape, "jax": jax.__version__, "rows": rows}
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
