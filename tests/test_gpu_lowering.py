"""Every GPU kernel variant lowers to Triton IR for a Hopper GPU, on the CPU.

Interpret mode checks the kernels' arithmetic but not that Pallas can lower
them to Triton (e.g. a traced integer ``%`` did not). These tests run the real
Pallas -> Triton lowering with the H200's GPU info (Triton's own compiler and
ptxas still only run on a GPU) and bound the size of the KIVI programs, whose
compile time grows with it.
"""

import pytest

from pallas_kernels import test_base
from pallas_kernels.gpu import ops

pytest.importorskip("jax._src.pallas.triton.pallas_call_registration")
from pallas_kernels.gpu import lowering_check  # noqa: E402

VARIANTS = [(f, {}) for f in test_base.ALL_FORMATS] + [
    ("fp8_e4m3", {"narrow_qk": True}), ("fp8_e4m3", {"narrow_qk": True, "narrow_pv": True}),
    ("int8", {"narrow_qk": True, "narrow_pv": True}),
    ("int8", {"narrow_qk": False}),
    ("kivi2", {"join_values": True}), ("kivi2", {"tile_loop": False}),
    ("kivi2", {"tile_loop": False, "join_values": True}), ("kivi4", {"tile_loop": False}),
    ("kivi2_g128", {"tile_loop": True, "join_values": True}),
    ("fp8_e4m3", {"window": 64}), ("kivi2", {"window": 64}), ("kivi2", {"window": 64, "tile_loop": False}),
    ("fp8_e4m3", {"prefetch": 1}), ("int4", {"prefetch": 2}), ("kivi2", {"prefetch": 1}),
    ("kivi4", {"prefetch": 2}),
    ("int4", {"packed_unpack": False}), ("kivi2", {"packed_unpack": False}), ("kivi4", {"packed_unpack": False}),
    ("kivi2_g128", {"fold_value_scales": True}), ("kivi2", {"fold_value_scales": True, "prefetch": 1}),
    # value codes in tiles (`init_cache(value_tile=)`, the GPU default; the others here are token-major)
    ("fp8_e4m3", {"value_tile": 64}), ("int8", {"value_tile": 64}),
    ("int8", {"value_tile": 64, "narrow_pv": True}), ("fp8_e5m2", {"value_tile": 128}),
]


@pytest.mark.parametrize("fmt_name,opts", VARIANTS, ids=[f + "".join(f"+{k}" for k in o) for f, o in VARIANTS])
def test_lowers_to_triton(fmt_name, opts):
  opts = dict(opts)
  tile = opts.pop("value_tile", 0)
  q, c = test_base.make_case(fmt_name, [300, 5], num_kv_heads=2, rep=4, num_queries=1,
                             value_tile=tile)
  modules = lowering_check.lower(q, c, pallas_merge=True, **opts)
  assert len(modules) == 2  # the decode kernel, then the split merge (`merge.merge_states`)
  assert "kvjax_merge_splits" in modules[1] and "tt.dot" not in modules[1]
  ir = modules[0]
  dots = [line for line in ir.splitlines() if "tt.dot" in line]
  assert dots
  plan = ops.plan_for(c, 1, 4, **{k: v for k, v in opts.items() if k != "window"})
  narrow = "xf8E4M3FN> * tensor<" if fmt_name.startswith("fp8") else "xi8> * tensor<"
  # two-term 8-bit dots: 2 for q.k, 2 more for p.v; none unless the plan has them
  want = 2 * getattr(plan, "narrow_qk", 0) + 2 * getattr(plan, "narrow_pv", 0)
  assert sum(narrow in d for d in dots) == want
  # inline-PTX unpacking (the default for 2/4-bit codes on a GPU): 4 bytes per instance, only there
  assert ("tt.elementwise_inline_asm" in ir) == plan.packed_unpack
  assert plan.packed_unpack == (fmt_name.startswith(("kivi", "int4")) and opts.get("packed_unpack", True))
  if plan.packed_unpack:
    assert "packed_element = 4" in ir
  assert getattr(plan, "value_t", False) == bool(tile)
  if fmt_name.startswith("kivi"):
    # The looped program is much smaller than the unrolled one (and compiles faster).
    limit = (130_000 + 40_000 * plan.prefetch) if plan.tile_loop else 400_000
    assert len(ir) < limit, len(ir)


def test_patch_is_undone():
  from jax._src.pallas.triton import pallas_call_registration as reg
  before = reg.gpu_info_lib.get_gpu_info
  with lowering_check.triton_modules():
    assert reg.gpu_info_lib.get_gpu_info is not before
  assert reg.gpu_info_lib.get_gpu_info is before


@pytest.mark.parametrize("fmt_name", ["fp8_e4m3", "int8", "kivi2"])
def test_prefetched_scales_are_loop_carried_unconverted(fmt_name):
  # Triton pipelines only the code tiles; the scales reach the next iteration as raw loads, so
  # nothing converts (and waits on) them in the iteration that issues them.
  q, c = test_base.make_case(fmt_name, [300, 5], num_kv_heads=2, rep=4, capacity=1024)
  plan = ops.plan_for(c, 1, 4)
  # per-token scales: one bf16 per token of a block; KIVI: the key group's [1, H] scale/zero rows
  carried = "tensor<1x128xbf16>" if fmt_name == "kivi2" else f"tensor<{plan.block}xbf16>"
  for distance in (0, 1, 2):
    ir = lowering_check.lower(q, c, prefetch=distance)[0]
    loops = [line for line in ir.splitlines() if "scf.for" in line and "iter_args" in line]
    main = max(loops, key=len)  # the quantized blocks' loop (KIVI's residual loop is shorter)
    results = main.split("->")[-1]
    want = 2 * distance  # key and value scales (KIVI: the key group's scale and zero rows)
    assert results.count(carried) == want, (distance, results)


APPEND_FORMATS = ["fp8_e4m3", "int4", "kivi2", "kivi4", "kivi2_g128", "kivi2_sink4", "int8+tile64",
                  "kivi2_g128+words"]


@pytest.mark.parametrize("fmt_name", APPEND_FORMATS)
@pytest.mark.parametrize("num_new", [1, 3])
def test_append_lowers_to_one_triton_kernel(fmt_name, num_new):
  # The one-kernel append, KIVI key flush included (quantized in the kernel, `flush.py`).
  import jax
  import jax.numpy as jnp
  from kvjax import cache as cache_lib, formats
  name, _, layout = fmt_name.partition("+")  # "+tileT": tiled value codes; "+words": the "words" layout
  fmt = formats.kivi(2, 32, 128, sink=4) if name == "kivi2_sink4" else formats.preset(name)
  c = cache_lib.init_cache(fmt, 2, 2, 512, 128, value_tile=int(layout[4:] or 0) if layout != "words" else None,
                           kivi_layout="words" if layout == "words" else None)
  k = jnp.zeros((2, 2, num_new, 128), jnp.bfloat16)
  n = jnp.asarray([num_new, 0], jnp.int32)
  from pallas_kernels.gpu import write
  with lowering_check.triton_modules() as modules:
    hlo = jax.jit(lambda c_, k_, n_: write.append(c_, k_, k_, n_, interpret=False, flush_in_kernel=True)
                  ).trace(c, k, n).lower(lowering_platforms=("cuda",)).as_text()
  assert len(modules) == 1 and hlo.count("stablehlo.custom_call") == 1
  ir = modules[0]
  kivi = fmt.is_kivi
  # KIVI: the residual is read back only on a flush, behind a barrier before it is rewritten;
  # no XLA-side key quantization (no reductions outside the kernel; the values' per-token
  # reductions stay in XLA)
  assert ("gpu.barrier" in ir) == kivi
  assert modules == lowering_check.lower_append(c, k, k, n, flush_in_kernel=True)
  if name in ("fp8_e4m3", "int8"):  # per-token keys and values quantized in the kernel (QuantRows)
    xla_side = hlo.split("stablehlo.custom_call")[0]
    assert "stablehlo.reduce" not in xla_side and "stablehlo.divide" not in xla_side
    assert "tt.reduce" in ir
  if kivi:  # the values' per-token min and max in XLA, none for keys; "words": values quantized in-kernel
    minmax = hlo.count("applies stablehlo.minimum") + hlo.count("applies stablehlo.maximum")
    assert minmax == (0 if layout == "words" else 2), minmax
    assert len(ir) < 400_000, len(ir)


@pytest.mark.parametrize("fmt_name,head_dim,in_kernel", [("kivi2", 128, True), ("kivi4", 128, True),
                                                         ("kivi2_g128", 128, True), ("kivi2_sink4", 128, True),
                                                         ("kivi2_g64", 128, False), ("fp8_e4m3", 128, False),
                                                         ("kivi2", 256, False), ("kivi2_g128", 256, True)])
def test_append_flushes_in_kernel_by_default_only_where_gpu_checked(fmt_name, head_dim, in_kernel):
  # key groups 32 and 128 (with and without sinks) ran bit-identical on the H200; others keep XLA's, as does G=32 at
  # head_dim 256 (its in-kernel flush is too slow to compile: write.IN_KERNEL_FLUSH_SLOW)
  import jax.numpy as jnp
  from kvjax import cache as cache_lib, formats
  from pallas_kernels.gpu import write
  fmt = {"kivi2_sink4": lambda: formats.kivi(2, 32, 128, sink=4),
         "kivi2_g64": lambda: formats.kivi(2, 64, 128)}.get(fmt_name, lambda: formats.preset(fmt_name))()
  assert write.flush_in_kernel_default(fmt, head_dim) == in_kernel
  c = cache_lib.init_cache(fmt, 2, 2, 512, head_dim)
  k = jnp.zeros((2, 2, 1, head_dim), jnp.bfloat16)
  ir, = lowering_check.lower_append(c, k, k, jnp.asarray([1, 0], jnp.int32))
  assert ("gpu.barrier" in ir) == in_kernel


@pytest.mark.parametrize("batch,kv_heads,splits,merges",
                         [(2, 2, 2, True), (8, 8, 4, False), (8, 8, 5, True), (8, 8, 1, True), (1, 8, 1, True),
                          (16, 4, 3, False)])
def test_merge_kernel_default(batch, kv_heads, splits, merges):
  """On a GPU the one-kernel split merge is the default but where many (sequence, KV head) pairs
  (>= 64) have 2-4 splits each: there XLA's merge was faster (session 10, B=8 1k)."""
  from pallas_kernels.gpu import ops
  q, c = test_base.make_case("fp8_e4m3", [300] * batch, num_kv_heads=kv_heads, rep=4, value_tile=64)
  modules = lowering_check.lower(q, c, num_splits=splits)
  assert ops.merge_in_kernel(batch, kv_heads, splits) == merges
  assert len(modules) == (2 if merges else 1)
  assert any("kvjax_merge_splits" in m for m in modules) == merges
