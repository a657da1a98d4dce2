"""Session 13, CPU: `window_merge` compiled for sm_90a by the `triton` wheel (see benchmarks/kernel_sass.py
for the setup of its venv): registers, local (spill) bytes, shared memory and the SASS instruction mix
quoted in NOTES_gpu.md "Sessions 12-13". From the repository root:
  TRITON_PY=/tmp/tv/bin/python .venv/bin/python benchmarks/runs/session13_window_merge_sass.py B S SPLITS [COLS|0] [WARPS]
e.g. `8 1024 8 0 8` (B=8, capacity 1k, 8 splits, default column block, 8 warps)."""
import os
TRITON_PY = os.environ.get("TRITON_PY", "/tmp/tv/bin/python")
import os, re, subprocess, sys, json
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
import jax, jax.numpy as jnp
from pallas_kernels.gpu import lowering_check, window_merge as wm, mosaic_kivi as mk
import kernel_sass as ks
b, kh, S, ns = int(sys.argv[1]), 8, int(sys.argv[2]), int(sys.argv[3])
cols = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "0" else None
warps = int(sys.argv[5]) if len(sys.argv) > 5 else 4
sd = jax.ShapeDtypeStruct
args = (sd((b, kh, 128, 16), jnp.float32), sd((b,), jnp.int32), sd((b, kh, S, 16), jnp.uint16),
        sd((b, kh, S // 128, 128), jnp.bfloat16), sd((b, kh, S // 128, 128), jnp.bfloat16),
        sd((b, kh, 128, 128), jnp.bfloat16), sd((b, kh, 128, 128), jnp.bfloat16),
        sd((b, kh, ns, 128, 16), jnp.float32), sd((b, kh, ns, 16), jnp.float32), sd((b, kh, ns, 16), jnp.float32))
with lowering_check.triton_modules() as mods:
  jax.jit(lambda *a: wm.window_merge(*a, jnp.bfloat16, cols=cols, num_warps=warps)).trace(*args).lower(lowering_platforms=("cuda",))
path = "/tmp/wm/k.ttir"; open(path, "w").write(mods[0])
meta = json.loads(subprocess.run([TRITON_PY, "-c", ks._COMPILE, path, str(warps), "1"], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
res = subprocess.run([os.path.join(meta["bin"], "cuobjdump"), "-res-usage", "/tmp/wm/k.cubin"], capture_output=True, text=True, check=True).stdout
sass = subprocess.run([os.path.join(meta["bin"], "cuobjdump"), "-sass", "/tmp/wm/k.cubin"], capture_output=True, text=True, check=True).stdout
ins = ks.sass_instructions(sass)
import collections
mix = collections.Counter(ks.opcode(t).split(".")[0] for _, t in ins)
print(re.search(r"REG:\d+", res).group(0), re.search(r"LOCAL:\d+", res).group(0), "shared", meta["shared"], "instr", len(ins), dict(mix.most_common(14)))
