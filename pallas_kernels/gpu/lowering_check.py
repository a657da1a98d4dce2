"""Lower the GPU kernels to Triton IR for an H200 on any machine (no GPU needed).

Interpret mode checks the kernels' arithmetic, not that Pallas can lower them;
this runs the real Pallas -> Triton lowering (Triton's own passes and ptxas
still need a GPU) and returns the Triton modules' text, e.g. to bound program
size (KIVI compile time grows with it):

  python -m pallas_kernels.gpu.lowering_check kivi2 '{"tile_loop": true}'
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys

import jax

__all__ = ["triton_modules", "lower", "lower_append"]


@contextlib.contextmanager
def triton_modules():
  """Within: pallas_call lowers for an H200; yields the list the Triton modules' text lands in."""
  from jax._src.pallas.triton import gpu_info, pallas_call_registration as reg
  info = gpu_info._get_gpu_info_impl(gpu_info.GpuVersion.H200)
  modules: list[str] = []
  get_info, lower_module = reg.gpu_info_lib.get_gpu_info, reg.lowering.lower_jaxpr_to_triton_module

  def keep(*a, **k):
    out = lower_module(*a, **k)
    modules.append(str(out.module.operation))
    return out
  reg.gpu_info_lib.get_gpu_info, reg.lowering.lower_jaxpr_to_triton_module = (lambda: info), keep
  try:
    yield modules
  finally:
    reg.gpu_info_lib.get_gpu_info, reg.lowering.lower_jaxpr_to_triton_module = get_info, lower_module


def lower(q, cache, **options) -> list[str]:
  """Triton modules of `ops.decode_attention(q, cache, **options)` lowered for CUDA."""
  from pallas_kernels.gpu import ops
  with triton_modules() as modules:
    fn = jax.jit(lambda q, c: ops.decode_attention(q, c, interpret=False, **options))
    fn.trace(q, cache).lower(lowering_platforms=("cuda",))
  return modules


def lower_append(cache, k, v, num_new=None, **options) -> list[str]:
  """Triton modules of `write.append(cache, k, v, num_new)` (the one-kernel append) lowered for CUDA."""
  from kvjax import cache as cache_lib
  from pallas_kernels.gpu import write
  rows = functools.partial(write.write_rows, interpret=False, **options)
  with triton_modules() as modules:
    fn = jax.jit(lambda c, k, v, n: cache_lib.append(c, k, v, n, write_rows=rows))
    fn.trace(cache, k, v, num_new).lower(lowering_platforms=("cuda",))
  return modules


def main(argv=None):
  from pallas_kernels import test_base
  argv = sys.argv[1:] if argv is None else argv
  fmt_name = argv[0] if argv else "kivi2"
  options = json.loads(argv[1]) if len(argv) > 1 else {}
  q, c = test_base.make_case(fmt_name, [300] * 8, num_kv_heads=8, rep=4, capacity=2048)
  mods = lower(q, c, **options)
  dots = sum(m.count("tt.dot ") for m in mods)
  print(f"{fmt_name} {options}: {len(mods)} Triton module(s), {sum(map(len, mods))} chars of IR, {dots} dots")


if __name__ == "__main__":
  main()
