"""What one register-A WGMMA costs the SM at decode's small N: the KIVI kernel's question (session 37).

The KIVI-2 kernel issues 32 WGMMAs a 128-token tile (m64 x N x k16, A = the dequantized codes in registers,
N = 16 or 8 query rows). At B=8 32k on an H100 its time stayed ~105-110 us with 4 or 5 programs per SM and
with its bytes read from L2 instead of HBM (`decode_parts/session37/`): some per-SM resource other than the
loop's issue and the HBM stream bounds it. This kernel does nothing but those WGMMAs (same A in registers,
B in shared memory, `mosaic_common.wgmma_sum` with the kernel's lag), so its time per WGMMA per SM is the
tensor cores' cost of the product alone, by N, data type (fp16 k16 against e4m3 k32, twice the k a WGMMA)
and programs per SM.

    python3 benchmarks/wgmma_rate.py --out rate.json [--cases fp16:16:4:1,...]

A case is dtype:N:programs_per_SM:lag ("none": all issued, then waited). Each program runs `--iters`
iterations of `--slabs` WGMMAs into one [128, N] f32 accumulator (M = 128: two m64 instructions a slab).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu.mosaic_common import _Transposed, wgmma_sum

ROWS = 128  # M: the kernel's 128-token (keys) or 128-channel (values) A operand
DTYPES = {"fp16": (jnp.float16, 16), "e4m3": (jnp.float8_e4m3fn, 32)}  # (A / B dtype, k a WGMMA)


@dataclasses.dataclass(frozen=True)
class Case:
  """One timed kernel: WGMMAs of m64 x n x k (k by dtype) with `programs` programs per SM."""
  dtype: str
  n: int
  programs: int
  lag: int | None

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
    if self.n % 8 or not 8 <= self.n <= 256:
      raise ValueError(f"n must be a multiple of 8 in [8, 256], got {self.n}")
    if self.programs < 1:
      raise ValueError(f"programs (per SM) must be >= 1, got {self.programs}")

  @classmethod
  def parse(cls, text: str) -> Case:
    try:
      dt, n, p, lag = text.split(":")
      return cls(dt, int(n), int(p), None if lag == "none" else int(lag))
    except ValueError as e:
      raise ValueError(f"--cases: {text!r} is not dtype:N:programs_per_SM:lag ({e})") from e


def rate_kernel(case: Case, grid: int, slabs: int, iters: int, interpret: bool = False):
  """f(a [ROWS, k] (bits as uint16 / uint8), b) -> [grid, ROWS, n] f32: each program sums `iters` x the
  products of A with `slabs` B slabs (fp16: b [slabs k, n] as stored; e4m3: b [n, slabs k], K-major, the
  form 8-bit WGMMA needs)."""
  dt, k = DTYPES[case.dtype]
  fp8 = case.dtype == "e4m3"
  bits = jnp.uint8 if fp8 else jnp.uint16
  kmajor = k_major(case)
  b_shape = (case.n, slabs * k) if kmajor else (slabs * k, case.n)
  if kmajor:  # [n, K]: 32-byte rows of k columns a slab (as `Options.narrow_mma` stores its fp16 B at N = 8)
    b_tiles = (plgpu.TilingTransform((8, k)), plgpu.SwizzleTransform(32))
  else:
    swz = plgpu.find_swizzle(case.n * 16, "rhs")
    b_tiles = (plgpu.TilingTransform((8, swz * 8 // 16)), plgpu.SwizzleTransform(swz))

  def slab(b_s, i):
    if kmajor:
      view = b_s.at[:, pl.ds(k * i, k)]
      return view.transpose((1, 0)) if not interpret else _Transposed(view)
    return b_s.at[pl.ds(k * i, k)]

  def body(a_g, b_g, o_g, a_s, b_s, bar):
    plgpu.copy_gmem_to_smem(a_g, a_s, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_gmem_to_smem(b_g, b_s, bar)
    plgpu.barrier_wait(bar)
    layout = plgpu.Layout.WGMMA_8BIT if fp8 else plgpu.Layout.WGMMA
    a = lax.bitcast_convert_type(plgpu.load(a_s, (), layout=layout) if not interpret else a_s[...], dt)

    def it(_, acc):
      return wgmma_sum(acc, [(lambda: a, slab(b_s, i)) for i in range(slabs)], lag=case.lag, interpret=interpret)
    o_g[lax.axis_index("p")] = lax.fori_loop(0, iters, it, jnp.zeros((ROWS, case.n), jnp.float32))

  kw = {"interpret": plgpu.InterpretGPUParams()} if interpret else {}
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((grid, ROWS, case.n), jnp.float32), grid=(grid,), grid_names=("p",),
      scratch_types=[plgpu.SMEM((ROWS, k), bits), plgpu.SMEM(b_shape, dt, transforms=b_tiles),
                     plgpu.Barrier(num_arrivals=1)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      kernel_name=f"kvjax_wgmma_rate_{case.dtype}_n{case.n}", **kw)


def k_major(case: Case) -> bool:
  """Whether B is stored K-major ([n, K]): 8-bit WGMMA needs it; fp16 at N = 8 (16-byte rows, below the
  smallest swizzle) too."""
  return case.dtype == "e4m3" or case.n * 2 < 32


def reference(a_bits, b, case: Case, slabs: int, iters: int):
  """What every program returns: iters x sum over slabs of A . B_slab, in f32 (the bits read as the dtype)."""
  dt, k = DTYPES[case.dtype]
  a = lax.bitcast_convert_type(a_bits, dt).astype(jnp.float32)
  bf = b.astype(jnp.float32)
  full = bf.T if k_major(case) else bf  # [slabs k, n]
  return iters * sum(a @ full[k * i:k * (i + 1)] for i in range(slabs))


def inputs(case: Case, slabs: int, key):
  """Random A bits (finite, small values) and B for a case."""
  dt, k = DTYPES[case.dtype]
  ka, kb = jax.random.split(key)
  a = jax.random.uniform(ka, (ROWS, k), jnp.float32, -1, 1).astype(dt)
  b_shape = (case.n, slabs * k) if k_major(case) else (slabs * k, case.n)
  b = jax.random.uniform(kb, b_shape, jnp.float32, -1, 1).astype(dt)
  return lax.bitcast_convert_type(a, jnp.uint8 if case.dtype == "e4m3" else jnp.uint16), b


def time_case(case: Case, sms: int, slabs: int, iters: int, reps: int):
  """Median seconds of one call, and the check against the reference (max relative difference)."""
  grid = sms * case.programs
  a, b = inputs(case, slabs, jax.random.PRNGKey(0))
  f = jax.jit(rate_kernel(case, grid, slabs, iters))
  out = jax.block_until_ready(f(a, b))
  ref = reference(a, b, case, slabs, iters)
  err = float(jnp.max(jnp.abs(out - ref[None])) / jnp.max(jnp.abs(ref)))
  return median_seconds(f, (a, b), reps), err


def median_seconds(f, args, reps: int) -> float:
  """Median wall seconds of `reps` calls of f(*args), each waited for (after one warm-up call)."""
  jax.block_until_ready(f(*args))
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    ts.append(time.perf_counter() - t0)
  return statistics.median(ts)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--cases", default="fp16:16:4:1,fp16:8:4:1,fp16:32:4:1,fp16:64:4:1,fp16:16:1:1,fp16:16:2:1,"
                  "fp16:16:8:1,fp16:16:4:none,e4m3:8:4:1,e4m3:16:4:1,e4m3:16:1:1")
  ap.add_argument("--slabs", type=int, default=8, help="WGMMA slabs an iteration (the kernel: 8 a product)")
  ap.add_argument("--iters", type=int, default=2048)
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--clock-ghz", type=float, default=0.0, help="SM clock for the cycle column (0: nvidia-smi's)")
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  dev = jax.devices()[0]
  sms = dev.core_count
  ghz = args.clock_ghz
  if not ghz:
    import subprocess  # noqa: PLC0415
    q = "--query-gpu=clocks.max.sm"
    ghz = float(subprocess.run(["nvidia-smi", q, "--format=csv,noheader,nounits"], capture_output=True,
                               text=True, check=True).stdout.split()[0]) / 1e3
  rows = []
  for text in args.cases.split(","):
    case = Case.parse(text)
    try:
      sec, err = time_case(case, sms, args.slabs, args.iters, args.reps)
    except Exception as e:  # noqa: BLE001 (a case that fails to build is a row, not a crash)
      rows.append({**dataclasses.asdict(case), "error": f"{type(e).__name__}: {str(e)[:300]}"})
      print(json.dumps(rows[-1]), flush=True)
      continue
    m_instr = ROWS // 64 * args.slabs * args.iters * case.programs  # WGMMA instructions an SM
    ns = sec / m_instr * 1e9
    rows.append({**dataclasses.asdict(case), "k": DTYPES[case.dtype][1], "slabs": args.slabs, "iters": args.iters,
                 "sms": sms, "seconds": sec, "ns_per_wgmma_per_sm": round(ns, 4),
                 "cycles_per_wgmma_per_sm": round(ns * ghz, 2), "clock_ghz": ghz,
                 "flop_per_cycle_per_sm": round(2 * 64 * case.n * DTYPES[case.dtype][1] / (ns * ghz), 1),
                 "max_rel_err": err, "device_kind": dev.device_kind})
    print(json.dumps(rows[-1]), flush=True)
  with open(args.out, "w") as fh:
    json.dump(rows, fh, indent=1)
  return rows


if __name__ == "__main__":
  main()
