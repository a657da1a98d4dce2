"""Every GPU kernel variant lowers to Triton IR for a Hopper GPU, on the CPU.

Interpret mode checks the kernels' arithmetic but not that Pallas can lower
them to Triton (e.g. a traced integer ``%`` did not). These tests run the real
Pallas -> Triton lowering with the H200's GPU info (Triton's own compiler and
ptxas still only run on a GPU) and bound the size of the KIVI programs, whose
compile time grows with it.
"""

import jax
import pytest

from pallas_kernels import test_base
from pallas_kernels.gpu import ops

gpu_info = pytest.importorskip("jax._src.pallas.triton.gpu_info")
registration = pytest.importorskip("jax._src.pallas.triton.pallas_call_registration")

VARIANTS = [(f, {}) for f in test_base.ALL_FORMATS] + [
    ("fp8_e4m3", {"narrow_qk": True}), ("fp8_e4m3", {"narrow_qk": True, "narrow_pv": True}),
    ("int8", {"narrow_qk": True, "narrow_pv": True}),
    ("kivi2", {"join_values": True}), ("kivi2", {"tile_loop": True}),
    ("kivi2", {"tile_loop": True, "join_values": True}), ("kivi4", {"tile_loop": True}),
    ("kivi2_g128", {"tile_loop": True, "join_values": True}),
    ("fp8_e4m3", {"window": 64}), ("kivi2", {"window": 64}), ("kivi2", {"window": 64, "tile_loop": True}),
]


@pytest.fixture
def triton_modules(monkeypatch):
  """Lower for an H200 without one; collect the Triton modules' text."""
  info = gpu_info._get_gpu_info_impl(gpu_info.GpuVersion.H200)
  monkeypatch.setattr(registration.gpu_info_lib, "get_gpu_info", lambda: info)
  modules = []
  orig = registration.lowering.lower_jaxpr_to_triton_module

  def keep(*a, **k):
    out = orig(*a, **k)
    modules.append(str(out.module.operation))
    return out
  monkeypatch.setattr(registration.lowering, "lower_jaxpr_to_triton_module", keep)
  return modules


@pytest.mark.parametrize("fmt_name,opts", VARIANTS, ids=[f + "".join(f"+{k}" for k in o) for f, o in VARIANTS])
def test_lowers_to_triton(fmt_name, opts, triton_modules):
  q, c = test_base.make_case(fmt_name, [300, 5], num_kv_heads=2, rep=4, num_queries=1)
  fn = jax.jit(lambda q, c: ops.decode_attention(q, c, interpret=False, **opts))
  fn.trace(q, c).lower(lowering_platforms=("cuda",))
  assert len(triton_modules) == 1
  ir = triton_modules[0]
  dots = [line for line in ir.splitlines() if "tt.dot" in line]
  assert dots
  narrow = "xf8E4M3FN> * tensor<" if fmt_name.startswith("fp8") else "xi8> * tensor<"
  # two-term 8-bit dots: 2 for q.k, 2 more for p.v; none unless asked for
  assert sum(narrow in d for d in dots) == 2 * opts.get("narrow_qk", 0) + 2 * opts.get("narrow_pv", 0)
  if fmt_name.startswith("kivi"):
    # The looped program is much smaller than the unrolled one (and compiles faster).
    limit = 130_000 if opts.get("tile_loop") else 400_000
    assert len(ir) < limit, len(ir)
