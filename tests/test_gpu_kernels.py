"""Pallas GPU decode kernels vs the XLA reference, in interpret mode on CPU (the GPU run uses
`benchmarks/decode_kernels.py --check`); the in-place write path; dispatch fallback."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import attention, cache as cache_lib, dispatch, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import ops, write

INTERPRET = jax.default_backend() != "gpu"


class TestPallasGPUDecode(test_base.DecodeAttentionTestBase):
  def attention(self, q, cache, **options):
    return ops.decode_attention(q, cache, interpret=INTERPRET, **options)


def test_softcap_and_sm_scale():
  q, c = test_base.make_case("kivi2", [5, 300])
  for opts in ({"logit_softcap": 5.0}, {"sm_scale": 0.05}):
    ref = attention.decode_attention(q.astype(jnp.float32), c, **opts)
    out = ops.decode_attention(q, c, interpret=INTERPRET, **opts)
    assert test_base.relative_error(out, ref) < 1e-2, opts
  q, c = test_base.make_case("int8", [5, 300])
  ref = attention.decode_attention(q.astype(jnp.float32), c, logit_softcap=5.0)
  out = ops.decode_attention(q, c, interpret=INTERPRET, logit_softcap=5.0)
  assert test_base.relative_error(out, ref) < 1e-2


def test_splits_do_not_change_result():
  q, c = test_base.make_case("fp8_e4m3", [1, 200, 384])
  a = ops.decode_attention(q, c, interpret=INTERPRET, num_splits=1)
  b = ops.decode_attention(q, c, interpret=INTERPRET, num_splits=3, block=64)
  assert test_base.relative_error(a, b) < 1e-2


@pytest.mark.parametrize("fmt_name", ["fp8_e4m3", "int4", "kivi2"])
def test_append_inplace_matches_append(fmt_name):
  _, c = test_base.make_case(fmt_name, [0, 127, 200])
  k = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 2, 128))
  want = cache_lib.append(c, k, -k)
  got = write.append_inplace(jax.tree_util.tree_map(jnp.copy, c), k, -k)
  for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("fmt_name", list(test_base.ALL_FORMATS) + ["kivi2_sink4", "fp8_e4m3+tile64",
                                                                   "int8+tile32"])
def test_pallas_append_equals_xla_append(fmt_name):
  """One-kernel row writer == XLA scatters, bit for bit: T = 1 over empty, full-window (KIVI flush
  at 127 -> 128) and near-capacity sequences, then T = 3 with ragged num_new (0..3), twice."""
  if fmt_name == "kivi2_sink4":  # sink rows are one more leaf pair to write
    c = cache_lib.init_cache(formats.kivi(2, 32, 128, sink=4), 5, 2, 256, 128)
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 2, 256, 128))
    c = cache_lib.append(c, x, -x, jnp.asarray([0, 1, 127, 128, 254]))
  else:  # "+tileT": value codes stored in tiles of T tokens (`RowWrite.tile` columns)
    name, _, tile = fmt_name.partition("+tile")
    # planar KIVI codes on every backend (the CPU's default; the "words" writer: the "+words" flush tests)
    _, c = test_base.make_case(name, [0, 1, 127, 128, 254], capacity=256, value_tile=int(tile or 0), kivi_layout="")
    assert c.v.tile == int(tile or 0)
  k = jax.random.normal(jax.random.PRNGKey(1), (5, 2, 1, 128)) * 3
  test_base.assert_same_bits(cache_lib.append(c, k, -k), write.append(c, k, -k, interpret=INTERPRET))
  k3 = jax.random.normal(jax.random.PRNGKey(2), (5, 2, 3, 128))
  n = jnp.asarray([3, 0, 1, 2, 2])  # the last sequence reaches capacity, then (under jit) drops
  want, got = c, c
  for jit in (False, True):
    ref_fn = lambda c_: cache_lib.append(c_, k3, k3 * 0.5, n)
    pl_fn = lambda c_: write.append(c_, k3, k3 * 0.5, n, interpret=INTERPRET)
    want, got = (jax.jit(ref_fn) if jit else ref_fn)(want), (jax.jit(pl_fn) if jit else pl_fn)(got)
    test_base.assert_same_bits(want, got)
  assert int(got.lengths[-1]) == 256


@pytest.mark.parametrize("fmt_name,tile", [("kivi2", 0), ("fp8_e4m3", 64), ("int8", 0)])
def test_pallas_append_stacked_and_dispatch(fmt_name, tile):
  """Stacked caches (the append vmapped over layers: the writer's pallas_call batched), the KIVI
  flush and the in-kernel FP8 / INT8 quantization (`QuantRows`) included."""
  _, c = test_base.make_case(fmt_name, [126, 127, 300], value_tile=tile)
  stacked = cache_lib.stack([c, c])
  k = jax.random.normal(jax.random.PRNGKey(3), (2, 3, 2, 1, 128))
  test_base.assert_same_bits(cache_lib.append(stacked, k, k),
                    cache_lib.append(stacked, k, k, write_rows=lambda c_, w: write.write_rows(
                        c_, w, interpret=INTERPRET)))
  k1 = k[0]
  test_base.assert_same_bits(cache_lib.append(c, k1, k1), dispatch.append(c, k1, k1, implementation="pallas_gpu"))
  test_base.assert_same_bits(cache_lib.append(c, k1, k1), dispatch.append(c, k1, k1, implementation="xla"))
  with pytest.raises(ValueError, match="unknown implementation"):
    dispatch.append(c, k1, k1, implementation="cuda_magic")


def test_pallas_append_declines_rows_triton_cannot_tile():
  # head_dim 96: a 96-element row is not a Triton tile; dispatch falls back to XLA scatters.
  fmt = formats.preset("fp8_e4m3")
  c = cache_lib.init_cache(fmt, 2, 2, 64, 96)
  k = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 1, 96))
  with pytest.raises(NotImplementedError, match="96 elements"):
    write.append(c, k, k, interpret=True)
  with pytest.warns(UserWarning, match="declined"):
    got = dispatch.append(c, k, k, implementation="pallas_gpu", warn_on_fallback=True)
  test_base.assert_same_bits(cache_lib.append(c, k, k), got)


def test_decode_step_equals_append_then_reference():
  q, c = test_base.make_case("kivi2", [126, 127, 300])
  k = jax.random.normal(jax.random.PRNGKey(2), (3, 2, 1, 128))
  ref = attention.decode_attention(q.astype(jnp.float32), cache_lib.append(c, k, k))
  for impl in ("xla", "pallas_gpu"):
    out, c2 = write.decode_step(q, k, k, jax.tree_util.tree_map(jnp.copy, c), implementation=impl)
    np.testing.assert_array_equal(np.asarray(c2.lengths), [127, 128, 301])
    assert test_base.relative_error(out, ref) < 1e-2, impl


def test_unsupported_falls_back_to_xla():
  # KIVI with G=16: key tiles of 16 tokens fit, value tiles of 16 channels fit; G=8 does not.
  fmt = formats.kivi(2, 8, 128, name="kivi2_g8")
  c = cache_lib.init_cache(fmt, 2, 2, 256, 128)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 200, 128))
  c = cache_lib.append(c, x, x)
  q = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 1, 128), jnp.bfloat16)
  with pytest.raises(NotImplementedError):
    ops.decode_attention(q, c, interpret=True)
  with pytest.warns(UserWarning, match="declined"):
    out = dispatch.decode_attention(q, c, implementation=("pallas_gpu", "xla"), warn_on_fallback=True)
  ref = attention.decode_attention(q, c)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32))
  with pytest.raises(ValueError, match="window"):
    ops.decode_attention(test_base.make_case("int8", [5])[0], test_base.make_case("int8", [5])[1],
                         interpret=True, window=0)


def test_registered():
  assert "pallas_gpu" in dispatch.implementations()


def test_default_narrowing_follows_the_sweep():
  # INT8 keys take 8-bit q.k dots by default (measured faster); FP8 keys upcast (measured faster)
  assert ops.plan_for(test_base.make_case("int8", [5])[1], 1, 4).narrow_qk
  for name in ("fp8_e4m3", "fp8_e5m2", "int4", "bf16"):
    plan = ops.plan_for(test_base.make_case(name, [5])[1], 1, 4)
    assert not plan.narrow_qk and not plan.narrow_pv, name


# The shared base runs the defaults (int8: narrow q.k; fp8: upcast); these are the others.
NARROW_CASES = [(f, n) for f in ("fp8_e4m3", "fp8_e4m3_static", "int8")
                for n in ({"narrow_qk": True}, {"narrow_qk": True, "narrow_pv": True})]
NARROW_CASES.append(("int8", {"narrow_qk": False}))  # INT8's upcast path (no longer its default)


@pytest.mark.parametrize("fmt_name,narrow", NARROW_CASES,
                         ids=[f + "".join(f"+{k}={v}" for k, v in n.items()) for f, n in NARROW_CASES])
def test_narrow_dots_match_reference(fmt_name, narrow):
  q, c = test_base.make_case(fmt_name, [0, 1, 200, test_base.CAPACITY], num_queries=3)
  plan = ops.plan_for(c, 3, 12, **narrow)
  assert plan.narrow_qk == narrow["narrow_qk"] and plan.narrow_pv == narrow.get("narrow_pv", False)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c), np.float32)
  out = np.asarray(ops.decode_attention(q, c, interpret=INTERPRET, **narrow), np.float32)
  assert np.abs(out[0]).max() == 0.0  # length 0: nothing visible
  assert test_base.relative_error(out[1][:, 2:], ref[1][:, 2:]) < 1e-2  # length 1: last query sees it
  assert test_base.relative_error(out[2:], ref[2:]) < 1e-2


def test_narrow_dots_declined_for_e5m2_and_sub_byte():
  for name in ("fp8_e5m2", "int4", "bf16"):
    _, c = test_base.make_case(name, [5])
    plan = ops.plan_for(c, 1, 4, narrow_qk=True, narrow_pv=True)
    assert not plan.narrow_qk and not plan.narrow_pv, name


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.int8])
def test_two_term_split_is_bf16_accurate(dtype):
  from pallas_kernels.gpu import decode
  x = jax.random.normal(jax.random.PRNGKey(0), (16, 128)) * jnp.logspace(-6, 2, 16)[:, None]
  x = x.at[3].set(0.0).at[5, :64].multiply(1e-4)  # a zero row; a row of mixed magnitudes
  hi, lo, inv, lo_inv = decode._two_term(x, dtype)
  assert hi.dtype == dtype and lo.dtype == dtype
  y = (hi.astype(jnp.float32) + lo.astype(jnp.float32) * lo_inv) * inv
  amax = jnp.max(jnp.abs(x), axis=1, keepdims=True)
  err = jnp.abs(y - x) / jnp.maximum(jnp.maximum(jnp.abs(x), amax * 2.0 ** -7), 1e-30)  # tiny: absolute
  assert float(err.max()) < 2.0 ** -7
  assert float(jnp.abs(y[3]).max()) == 0.0


TILED_CASES = [("fp8_e5m2", 128, {}), ("int8", 64, {"narrow_pv": True}), ("int8", 32, {"narrow_qk": False}),
               ("fp8_e4m3", 64, {"narrow_pv": True, "num_splits": 3}), ("fp8_e4m3", 64, {"window": 70})]


@pytest.mark.parametrize("fmt_name,tile,opts", TILED_CASES,
                         ids=[f"{f}+tile{t}" + "".join(f"+{k}" for k in o) for f, t, o in TILED_CASES])
def test_tiled_values_match_reference(fmt_name, tile, opts):
  """Value codes in tiles (`QArray.tile`; the shared base runs tile 64 with the defaults): other
  tiles and the kernel options that touch the p.v operand, against the token-major reference."""
  q, c = test_base.make_case(fmt_name, [0, 1, 63, 64, 200, test_base.CAPACITY], num_queries=3,
                             value_tile=tile)
  _, c0 = test_base.make_case(fmt_name, [0, 1, 63, 64, 200, test_base.CAPACITY], num_queries=3,
                              value_tile=0)
  b, kh, s, h = c.v.codes.shape
  # token 3 of tile 1: channel j at flat byte j * tile + 3 of that tile
  tile1 = np.asarray(c.v.codes[1, 0, tile:2 * tile]).reshape(-1)
  np.testing.assert_array_equal(tile1[3::tile], np.asarray(c0.v.codes[1, 0, tile + 3]))
  window = opts.get("window")
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c0, window=window), np.float32)
  plan = ops.plan_for(c, 3, 12, **{k: v for k, v in opts.items() if k != "window"}, window=window)
  assert plan.value_t and plan.block == tile and ops.default_warps(plan) == ops.TILED_WARPS
  out = np.asarray(ops.decode_attention(q, c, interpret=INTERPRET, **opts), np.float32)
  assert np.abs(out[0]).max() == 0.0
  assert test_base.relative_error(out[1][:, 2:], ref[1][:, 2:]) < 1e-2
  assert test_base.relative_error(out[2:], ref[2:]) < 1e-2


def test_value_tile_checked():
  q, c = test_base.make_case("fp8_e4m3", [5, 9], value_tile=64)
  with pytest.raises(ValueError, match=r"block must equal the cache's value tile \(64 tokens"):
    ops.decode_attention(q, c, interpret=INTERPRET, block=128)
  with pytest.raises(ValueError, match=r"value_tile \(100\) must divide the capacity \(384\)"):
    cache_lib.init_cache(formats.fp8(), 2, 2, 384, 128, value_tile=100)
  with pytest.raises(ValueError, match=r"value_tile must be a non-negative int"):
    cache_lib.init_cache(formats.int8(), 2, 2, 384, 128, value_tile=-64)
  for name in ("int4", "bf16", "kivi2"):
    with pytest.raises(ValueError, match=r"value_tile=64 needs FP8 or INT8 values"):
      cache_lib.init_cache(formats.preset(name), 2, 2, 384, 128, value_tile=64)
  # a tile the kernel cannot read (not a power of two >= 16): declined, dispatch falls back
  q, c = test_base.make_case("int8", [5, 9], value_tile=48)
  with pytest.raises(NotImplementedError, match="tiles of 48 tokens"):
    ops.plan_for(c, 1, 4)


def test_default_value_tile_follows_backend():
  for name, want in (("fp8_e4m3", 64), ("int8", 64), ("fp8_e4m3_static", 64), ("int4", 0),
                     ("kivi2", 0), ("bf16", 0)):
    fmt = formats.preset(name)
    assert cache_lib.default_value_tile(fmt, 384, backend="gpu") == want, name
    assert cache_lib.default_value_tile(fmt, 384, backend="tpu") == 0
    assert cache_lib.default_value_tile(fmt, 384, backend="cpu") == 0
  assert cache_lib.default_value_tile(formats.fp8(), 200, backend="gpu") == 0  # 200 % 64
  c = cache_lib.init_cache(formats.fp8(), 1, 1, 128, 32)
  assert c.v.tile == cache_lib.default_value_tile(formats.fp8(), 128)


# The shared base runs the defaults (tile_loop on, join_values off); these are the others.
KIVI_VARIANTS = [("kivi2", {"join_values": True, "tile_loop": False}),
                 ("kivi2_g128", {"join_values": True, "tile_loop": False}),
                 ("kivi2", {"tile_loop": False}), ("kivi4", {"tile_loop": False}),
                 ("kivi2", {"join_values": True}),
                 ("kivi2_g128", {"tile_loop": True, "join_values": True, "num_splits": 3}),
                 ("kivi2", {"prefetch": 1}), ("kivi2", {"prefetch": 2, "num_splits": 3}),
                 ("kivi2_g128", {"prefetch": 1}), ("kivi4", {"prefetch": 2}),
                 ("kivi2", {"fold_value_scales": True}), ("kivi2_g128", {"fold_value_scales": True}),
                 ("kivi4", {"fold_value_scales": True, "prefetch": 1, "num_splits": 3}),
                 ("kivi2", {"fold_value_scales": True, "tile_loop": False})]


@pytest.mark.parametrize("fmt_name,opts", KIVI_VARIANTS,
                         ids=[f + "".join(f"+{k}" for k in o) for f, o in KIVI_VARIANTS])
def test_kivi_variants_match_reference(fmt_name, opts):
  # lengths: empty, one token (window only), a window just flushed, partial windows, full
  # planar codes: the Triton kernels these options tune (on GPU "words" KIVI-2 caches go to the Mosaic kernel)
  q, c = test_base.make_case(fmt_name, [0, 1, 127, 130, test_base.CAPACITY], num_queries=3, kivi_layout="")
  plan = ops.plan_for(c, 3, 12, **opts)
  assert all(getattr(plan, k) == v for k, v in opts.items())
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c), np.float32)
  out = np.asarray(ops.decode_attention(q, c, interpret=INTERPRET, **opts), np.float32)
  assert np.abs(out[0]).max() == 0.0
  assert test_base.relative_error(out[2:], ref[2:]) < 1e-2


def test_interleave_order():
  from pallas_kernels.gpu import kivi
  tiles = [jnp.full((2, 3), i, jnp.float32) + 10 * jnp.arange(3.0) for i in range(4)]
  got = np.asarray(kivi._interleave(tiles))
  np.testing.assert_array_equal(got[0], [i + 10 * c for c in range(3) for i in range(4)])
  plan = ops.plan_for(test_base.make_case("kivi2", [5])[1], 1, 4)
  assert sorted(plan.joined_channel_order(128)) == list(range(128))
  assert not ops.plan_for(test_base.make_case("kivi4", [5])[1], 1, 4, join_values=True).join_values


# Scale loads issued blocks ahead (carried through the loop). Splits of one block each put the
# prefetch of the last split past the cache's end (clamped); full and ragged lengths, T = 3.
PREFETCH_CASES = [(f, d, ns) for f in ("fp8_e4m3", "int8", "int4", "fp8_e4m3_static") for d, ns in
                  ((1, None), (2, None), (2, 64))]


@pytest.mark.parametrize("fmt_name,distance,splits", PREFETCH_CASES,
                         ids=[f"{f}+prefetch{d}+splits{ns}" for f, d, ns in PREFETCH_CASES])
def test_scale_prefetch_matches_reference(fmt_name, distance, splits):
  q, c = test_base.make_case(fmt_name, [0, 1, 200, test_base.CAPACITY - 1, test_base.CAPACITY],
                             num_queries=3)
  plan = ops.plan_for(c, 3, 12, prefetch=distance, num_splits=splits, block=16 if splits else None)
  assert plan.prefetch == distance
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c), np.float32)
  out = np.asarray(ops.decode_attention(q, c, interpret=INTERPRET, prefetch=distance,
                                        num_splits=splits, block=16 if splits else None), np.float32)
  assert np.abs(out[0]).max() == 0.0
  assert test_base.relative_error(out[1][:, 2:], ref[1][:, 2:]) < 1e-2
  assert test_base.relative_error(out[2:], ref[2:]) < 1e-2


@pytest.mark.parametrize("fmt_name,want", [("fp8_e4m3", {64: 2, 128: 2, 256: 4}),
                                           ("int4", {64: 2, 128: 2, 256: 4}),
                                           ("bf16", {64: 4, 128: 4, 256: 4}),
                                           ("kivi2", {64: 2, 128: 2, 256: 4}),
                                           ("kivi2_g128", {128: 4, 256: 4})])
def test_default_warps_scale_with_head_dim(fmt_name, want):
  """Two-warp defaults (measured at head_dim 128) double at 256, never past four."""
  for h, w in want.items():
    _, c = test_base.make_case(fmt_name, [5], head_dim=h, rep=2)
    assert ops.default_warps(ops.plan_for(c, 1, 2), h) == w, (fmt_name, h)


@pytest.mark.parametrize("b,ctx,want", [(8, 1024, 9), (8, 4096, 9), (1, 4096, 64), (1, 32768, 66),
                                        (8, 32768, 33), (64, 32768, 5), (1, 131072, 256)])
def test_short_contexts_get_fewer_splits(b, ctx, want):
  """fp8 (64-token blocks, 8 KV heads): about SHORT_BLOCKS blocks per program where QUANT_TARGET
  would leave 1-2 (the session-7 sweep), unchanged from B=8 at 32k up."""
  c = cache_lib.init_cache(formats.preset("fp8_e4m3"), b, 8, ctx, 128)
  assert ops.plan_for(c, 1, 4).num_splits == want
  assert ops.plan_for(c, 1, 4, num_splits=3).num_splits == 3
  if ctx >= 32768 and b >= 8:
    assert want == ops.default_splits(b, 8, ctx // 64, ops.QUANT_TARGET)
  kv = cache_lib.init_cache(formats.preset("kivi2"), b, 8, ctx, 128, kivi_layout="")  # KIVI keeps QUANT_TARGET
  assert ops.plan_for(kv, 1, 4).num_splits == ops.default_splits(b, 8, ctx // 128, ops.QUANT_TARGET)


def test_prefetch_needs_the_tile_loop_for_kivi():
  _, c = test_base.make_case("kivi2", [5], kivi_layout="")
  assert ops.plan_for(c, 1, 4, prefetch=2).prefetch == 2
  assert ops.plan_for(c, 1, 4, prefetch=2, tile_loop=False).prefetch == 0


def _emulate_ptx(asm, regs):
  """Runs the straight-line PTX of `decode._PACKED_UNPACK` on uint32 numpy registers (only the
  opcodes it uses), so the bit logic is checked here even though the asm itself needs a GPU."""
  env = dict(regs)

  def val(tok):
    tok = tok.strip()
    if tok.startswith("0x") or tok.isdigit():
      return np.uint32(int(tok, 0))
    return env[tok]
  for line in asm.splitlines():
    line = line.strip().rstrip(";")
    if not line or line[0] in "{}.":
      continue
    op, args = line.split(None, 1)
    dst, *src = [a.strip() for a in args.split(",")]
    x = [val(a) for a in src]
    if op == "and.b32":
      env[dst] = x[0] & x[1]
    elif op == "shr.u32":
      env[dst] = x[0] >> (x[1] & np.uint32(31))
    elif op == "lop3.b32":
      assert int(src[3], 16) == 0xEA  # (a & b) | c
      env[dst] = (x[0] & x[1]) | x[2]
    elif op == "prmt.b32":
      pool = np.concatenate([x[0].view(np.uint8).reshape(-1, 4), x[1].view(np.uint8).reshape(-1, 4)], 1)
      sel = [(int(src[2], 16) >> (4 * i)) & 0x7 for i in range(4)]
      env[dst] = np.ascontiguousarray(pool[:, sel]).view(np.uint32).reshape(-1)
    else:
      raise AssertionError(f"unexpected opcode {op}")
  return env


@pytest.mark.parametrize("bits", [2, 4])
def test_packed_unpack_ptx_bit_logic(bits):
  from pallas_kernels.gpu import decode
  rng = np.random.default_rng(bits)
  codes = rng.integers(0, 256, (64, 4), dtype=np.uint8)  # 64 instances x 4 packed bytes
  asm = decode._PACKED_UNPACK.replace("MASK", hex(((1 << bits) - 1) * 0x10001))
  for shift in range(0, 8, bits):
    shifts = np.full((64, 4), shift, np.uint8)
    env = _emulate_ptx(asm.replace("$", "r"), {"r2": codes.view(np.uint32).reshape(-1),
                                               "r3": shifts.view(np.uint32).reshape(-1)})
    out = np.stack([env["r0"], env["r1"]], 1).view(np.float16).reshape(64, 4)  # elements 0..3
    want = ((codes >> shift) & ((1 << bits) - 1)).astype(np.float16) + np.float16(1024)
    np.testing.assert_array_equal(out, want)
    ref = np.asarray(decode.unpack_f16(jnp.asarray(codes), shift, bits, 0), np.float16)
    np.testing.assert_array_equal(out - np.float16(1024), ref)


def test_packed_unpack_needs_a_gpu():
  q, c = test_base.make_case("kivi2", [5])
  assert ops.plan_for(c, 1, 4).packed_unpack  # the GPU default (measured faster)
  assert not ops.plan_for(c, 1, 4, packed_unpack=False).packed_unpack
  assert not ops.plan_for(test_base.make_case("fp8_e4m3", [5])[1], 1, 4, packed_unpack=True).packed_unpack
  assert ops.plan_for(test_base.make_case("int4", [5])[1], 1, 4, packed_unpack=True).packed_unpack
  with pytest.raises(ValueError, match="packed_unpack=True runs inline PTX"):
    ops.decode_attention(q, c, interpret=True, packed_unpack=True)
  # interpret mode turns the default off: the default plan still runs (and matches) off a GPU
  ref = attention.decode_attention(q.astype(jnp.float32), c)
  assert test_base.relative_error(ops.decode_attention(q, c, interpret=True), ref) < 1e-2


def test_fold_value_scales_excludes_joined_values():
  _, c = test_base.make_case("kivi2_g128", [5])
  assert ops.plan_for(c, 1, 4, fold_value_scales=True).fold_value_scales
  assert ops.plan_for(c, 1, 4).fold_value_scales  # the default at G=128 (timed on the H200)
  assert not ops.plan_for(c, 1, 4, join_values=True).fold_value_scales  # joining asked for: no fold
  assert not ops.plan_for(test_base.make_case("kivi2", [5])[1], 1, 4).fold_value_scales  # G=32
  with pytest.raises(ValueError, match="fold_value_scales and join_values are exclusive"):
    ops.plan_for(c, 1, 4, fold_value_scales=True, join_values=True)
