"""The Mosaic GPU FP8 kernel (`pallas_kernels.gpu.mosaic_fp8`): its split states equal the jnp reference in
Mosaic GPU's CPU interpreter (e4m3 and e5m2 codes, bf16 / fp16 / f32 scales, ragged lengths, an empty
sequence, splits past the length, several causal query tokens), through `ops` it passes the shared decode
test base against the XLA reference, bad inputs are refused, and it lowers for CUDA where the CUDA plugin
is installed."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8_cases import fp8_case, merged_states  # tests/fp8_cases.py, a plain module (conftest)
from kvjax import cache as cache_lib, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import mosaic_fp8 as mf, mosaic_kivi as mk, ops
from pallas_kernels.gpu.mosaic_kivi_ref import NEG

INTERPRET = jax.default_backend() != "gpu"


@pytest.mark.parametrize("dtype,scale_dtype", [(jnp.float8_e4m3fn, jnp.bfloat16), (jnp.float8_e4m3fn, jnp.float16),
                                               (jnp.float8_e4m3fn, jnp.float32), (jnp.float8_e5m2, jnp.bfloat16),
                                               (jnp.int8, jnp.bfloat16)],
                         ids=["e4m3-bf16", "e4m3-f16", "e4m3-f32", "e5m2-bf16", "int8-bf16"])
@pytest.mark.parametrize("lengths,splits,queries", [((512, 200), 2, 1), ((0, 129), 4, 1), ((384, 1), 1, 1),
                                                    ((300, 3), 2, 3)])
def test_states_match_reference_in_the_interpreter(dtype, scale_dtype, lengths, splits, queries):
  q_t, ln, k, ks, v, vs = fp8_case(lengths, dtype, scale_dtype)
  o, m, l = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=splits, num_queries=queries, interpret=True)
  ro, rm, rl = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=splits, num_queries=queries)
  seen = np.asarray(rl).sum(2) > 0  # [B, K, N]: a row saw a token in some split
  assert np.array_equal(np.asarray(l).sum(2) > 0, seen)
  # the balanced splits take other slices of the tokens than the reference's fixed ones: merged, equal
  out, ref = merged_states(o, m, l), merged_states(ro, rm, rl)
  # fp16 q and p s_v (times VALUE_FOLD: without it e5m2's p s_v sits in fp16's subnormals, 2.1e-3 here)
  assert test_base.relative_error(out, ref) < 1e-3
  assert np.abs(out[~seen]).max(initial=0.0) == 0.0
  if splits == 1:  # one split: the same tokens, so the states themselves
    assert test_base.relative_error(l, rl) < 2e-3
    np.testing.assert_allclose(np.asarray(m)[np.asarray(rl) > 0], np.asarray(rm)[np.asarray(rl) > 0], atol=2e-3)


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.int8], ids=["e4m3", "int8"])
@pytest.mark.parametrize("live,queries", [(4, 1), (8, 2), (1, 1)])
def test_narrow_softmax_computes_the_live_rows_only(dtype, live, queries):
  """live_rows <= 8 (`Fp8Options.narrow_softmax`, the default): the first 8 rows' attention equals the
  reference's, the other 8 rows' states are no token's; narrow_softmax=False or live_rows > 8 keep all 16
  (natively on a GPU, else in the interpreter)."""
  q_t, ln, k, ks, v, vs = fp8_case((512, 0, 1, 200), dtype)
  run = lambda opts, rows: mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=2, num_queries=queries, options=opts,
                                         live_rows=rows, interpret=INTERPRET)
  ref = merged_states(*mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=2, num_queries=queries))
  n = mk.NARROW_ROWS
  o, m, l = map(np.asarray, run(mf.Fp8Options(), live))
  assert test_base.relative_error(merged_states(o, m, l)[:, :, :n], ref[:, :, :n]) < 2e-3
  assert (m[..., n:] == NEG).all() and (l[..., n:] == 0).all() and (o[..., n:] == 0).all()
  for opts, rows in ((mf.Fp8Options(narrow_softmax=False), live), (mf.Fp8Options(), n + 1)):
    assert test_base.relative_error(merged_states(*run(opts, rows)), ref) < 2e-3
  with pytest.raises(ValueError, match=r"live_rows must be in \[1, 16\] \(the query rows that hold queries\), got 0"):
    run(mf.Fp8Options(), 0)


def _fused_case(lengths, rows, dtype=jnp.float8_e4m3fn, q_dtype=jnp.bfloat16, **kw):
  """(q [B, K, rows, H] in q_dtype, scale, cache arrays) and the states reference's q_t for them."""
  q_t, ln, k, ks, v, vs = fp8_case(lengths, dtype, **kw)
  scale = 0.7
  q = (jnp.swapaxes(q_t, -1, -2)[:, :, :rows] / scale).astype(q_dtype)
  ref_q_t = jnp.pad(jnp.swapaxes(q.astype(jnp.float32) * scale, -1, -2), ((0, 0), (0, 0), (0, 0), (0, mf.ROWS - rows)))
  return q, scale, (ln, k, ks, v, vs), ref_q_t


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("lengths,splits,queries,rows", [((512, 200), 2, 1, 4), ((0, 129), 4, 1, 16),
                                                         ((384, 1), 1, 1, 4), ((300, 3), 2, 3, 6),
                                                         ((512, 511), 8, 1, 1)])
def test_glue_in_the_kernel_matches_the_reference(dtype, lengths, splits, queries, rows):
  """`fp8_attention`: the query rows as given (scaled, transposed and padded in the kernel), the splits of a
  (b, k) one cluster merged by its first program, the rows stored in q's dtype: equal to the merged reference
  states to bf16's rounding; a sequence of length 0 gives zeros."""
  if splits > 1:  # Mosaic GPU's interpreter deadlocked on clusters in a clean-clone run (threads at the cluster
    # barrier, the rest blocked in XLA's CPU runtime), though they passed in others; on a GPU these interpreted
    # cases failed (session 25, `decode_parts/session25/c_pytest_fp8.txt`). Natively: the test below
    pytest.skip("clusters are not reliably interpretable; natively: test_glue_in_the_kernel_natively")
  q, scale, arrays, ref_q_t = _fused_case(lengths, rows, dtype, capacity=1024)
  out = mf.fp8_attention(q, scale, *arrays, num_splits=splits, num_queries=queries, interpret=True)
  assert out.shape == q.shape and out.dtype == q.dtype
  ref = merged_states(*mf.reference_states(ref_q_t, *arrays, num_splits=splits, num_queries=queries))[:, :, :rows]
  out = np.asarray(out, np.float32)
  assert test_base.relative_error(out, ref) < 4e-3  # bf16 output (2^-9 relative rounding)
  assert np.abs(out - ref).max() <= 2e-2 * np.abs(ref).max()
  for i, n in enumerate(lengths):
    if n == 0:
      assert not out[i].any()


def test_glue_in_the_kernel_other_dtypes_and_builds():
  """f32 queries in, f32 out; 64-token steps over 32-token value tiles; key_perm (the rows permuted before the
  kernel); each the same as the states path merged in XLA."""
  q, scale, arrays, ref_q_t = _fused_case((300, 65), 4, q_dtype=jnp.float32)
  for build, value_tile in ((mf.Fp8Options(), 64), (mf.Fp8Options(tile=64), 32), (mf.Fp8Options(key_perm=True), 64)):
    out = mf.fp8_attention(q, scale, *arrays, num_splits=1, value_tile=value_tile, interpret=True, options=build)
    assert out.dtype == jnp.float32
    ref = merged_states(*mf.fp8_states(ref_q_t, *arrays, num_splits=1, value_tile=value_tile, interpret=True,
                                 options=build))[:, :, :4]
    assert test_base.relative_error(np.asarray(out), ref) < 1e-5, build


def test_glue_in_the_kernel_refuses_what_it_cannot_do():
  q, scale, arrays, _ = _fused_case((10, 20), 4)
  with pytest.raises(ValueError, match="num_splits must be 1..8"):
    mf.fp8_attention(q, scale, *arrays, num_splits=16, interpret=True)
  with pytest.raises(ValueError, match="key_terms must be 0"):
    mf.fp8_attention(q, scale, *arrays, num_splits=2, interpret=True, options=mf.Fp8Options(key_terms=2))
  with pytest.raises(ValueError, match="natively only"):
    mf.fp8_attention(q, scale, *arrays, num_splits=2, interpret=True, options=mf.Fp8Options(merge="count"))
  with pytest.raises(ValueError, match="q must be"):
    mf.fp8_attention(jnp.zeros((2, 2, 17, 128), jnp.bfloat16), scale, *arrays, num_splits=2, interpret=True)
  fused = mf.Fp8Options(fused=True)
  assert mf.fused_call(fused, 1) and mf.fused_call(fused, 8)
  assert not mf.fused_call(fused, 16) and not mf.fused_call(mf.Fp8Options(), 4)
  assert not mf.fused_call(mf.Fp8Options(fused=True, key_terms=3), 4)


def test_ops_glue_in_the_kernel_or_in_xla(monkeypatch):
  """Through ops: `fused=True` equals the default (q prep and merge in XLA): 1 split interpreted, 1 and 4 natively."""
  q, c = test_base.make_case("fp8_e4m3", [700, 1500], capacity=2048, value_tile=64)
  seen = []
  real = mf.fp8_attention
  monkeypatch.setattr(mf, "fp8_attention", lambda *a, **k: seen.append(k["num_splits"]) or real(*a, **k))
  mf._decode.clear_cache()
  splits_run = (1,) if INTERPRET else (1, 4)  # clusters natively only (test_glue_in_the_kernel_matches_the_reference)
  for splits in splits_run:
    ref = ops.decode_attention(q, c, interpret=INTERPRET, mosaic_fp8=True, num_splits=splits)
    out = ops.decode_attention(q, c, interpret=INTERPRET, mosaic_fp8=mf.Fp8Options(fused=True), num_splits=splits)
    assert test_base.relative_error(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 4e-3
  assert seen == list(splits_run)


def test_min_share_leaves_the_later_splits_empty():
  """min_share=4: a 512-token sequence (4 steps) is one split's work; the other three see nothing and
  the merge is unchanged."""
  q_t, ln, k, ks, v, vs = fp8_case((512, 130), capacity=2048)
  o, m, l = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=4, interpret=True, options=mf.Fp8Options(min_share=4))
  assert (np.asarray(l)[:, :, 1:] == 0).all() and (np.asarray(l)[:, :, 0] > 0).all()
  ref = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=4)
  assert test_base.relative_error(merged_states(o, m, l), merged_states(*ref)) < 2e-3


def test_value_tiles_other_than_64():
  q_t, ln, k, ks, v, vs = fp8_case((256, 77))
  for tile in (32, 128):
    out = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=2, value_tile=tile, interpret=True)
    ref = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=2, value_tile=tile)
    assert test_base.relative_error(merged_states(*out), merged_states(*ref)) < 2e-3


@pytest.mark.parametrize("terms", [2, 3])
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=["e4m3", "e5m2"])
def test_8bit_key_products(dtype, terms):
  """Fp8Options(key_terms=2 | 3): the key tile as the 8-bit A operand against q in e4m3 terms (e5m2 keys
  x e4m3 terms: the mixed pair WGMMA takes); ragged lengths, T = 3, 64-token steps too."""
  q_t, ln, k, ks, v, vs = fp8_case((300, 65, 0), dtype)
  for tile in (128, 64):
    out = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=2, num_queries=3, interpret=True,
                        options=mf.Fp8Options(tile=tile, key_terms=terms))
    ref = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=2, num_queries=3)
    assert test_base.relative_error(merged_states(*out), merged_states(*ref)) < 2e-3


def test_split_e4m3_terms_sum_to_the_query():
  """Each term rounds what the earlier ones left: 2 terms hold q to ~2^-8 of its largest value per (b, k),
  3 to ~2^-12; a zero query stays zero (no log2 of 0)."""
  q_t = jnp.asarray(np.random.default_rng(3).normal(size=(2, 2, 128, mf.ROWS)) * 0.13, jnp.float32)
  q_t = q_t.at[1, 1].set(0.0)
  for terms, tol in ((1, 2 ** -4), (2, 2 ** -8), (3, 2 ** -12)):
    q8, inv = mf.split_e4m3(q_t, terms)
    assert q8.shape == (2, 2, terms, mf.ROWS, 128) and q8.dtype == jnp.float8_e4m3fn
    back = np.asarray(q8.astype(jnp.float32).sum(2) * inv[:, :, None, None])
    want = np.swapaxes(np.asarray(q_t), -1, -2)
    top = np.abs(want).max(axis=(2, 3), keepdims=True)
    assert (np.abs(back - want) <= tol * np.maximum(top, 1e-30)).all(), terms
  assert float(inv[1, 1]) > 0 and not np.asarray(q8[1, 1].astype(jnp.float32)).any()


def test_64_token_steps():
  """Fp8Options(tile=64): one 64-token value tile a step (or two of 32), ragged lengths, T = 3."""
  q_t, ln, k, ks, v, vs = fp8_case((300, 65, 0))
  for value_tile in (64, 32):
    out = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=2, value_tile=value_tile, num_queries=3, interpret=True,
                        options=mf.Fp8Options(tile=64, stages=3))
    ref = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=2, value_tile=value_tile, num_queries=3)
    assert test_base.relative_error(merged_states(*out), merged_states(*ref)) < 2e-3


@pytest.mark.parametrize("build", [mf.Fp8Options(key_perm=True), mf.Fp8Options(swizzle=False),
                                   mf.Fp8Options(upcast_layout=True, tile=64)], ids=str)
def test_load_builds(build):
  """The ways the code tiles reach the A operand (`key_perm`: the query's channels permuted as the renamed key
  registers' columns; unswizzled 16-byte tiles; the upcast layout), ragged lengths, T = 2, 32-token value tiles."""
  q_t, ln, k, ks, v, vs = fp8_case((300, 65, 0))
  out = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=2, value_tile=32, num_queries=2, interpret=True,
                      options=build)
  ref = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=2, value_tile=32, num_queries=2)
  assert test_base.relative_error(merged_states(*out), merged_states(*ref)) < 2e-3


def test_key_perm_is_the_registers_renaming():
  """KEY_PERM is a permutation of a slab's 16 columns taking WGMMA's 16-bit A layout (thread c of a quad: columns
  2c, 2c + 1, 2c + 8, 2c + 9) onto the 8-bit one's 32-bit register (bytes 4c .. 4c + 3), in that order."""
  assert sorted(mf.KEY_PERM) == list(range(16))
  for c in range(4):
    assert [mf.KEY_PERM[j] for j in (2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9)] == [4 * c + i for i in range(4)]


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs an H100/H200")
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8], ids=["e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("build", [mf.Fp8Options(), mf.Fp8Options(tile=64), mf.Fp8Options(key_terms=3),
                                   mf.Fp8Options(key_perm=True), mf.Fp8Options(swizzle=False),
                                   mf.Fp8Options(upcast_layout=True), mf.Fp8Options(int8_prmt=False)], ids=str)
def test_states_match_reference_natively(dtype, build):
  """The compiled kernel == the reference (`benchmarks/runs/session18_a.sh`): ragged lengths, an empty
  sequence, one token, a split past the length, several query tokens."""
  if build.key_terms and dtype == jnp.int8:
    pytest.skip("key_terms multiply FP8 keys (refused for int8: test_int8_codes_refuse_key_terms)")
  q_t, ln, k, ks, v, vs = fp8_case((512, 0, 1, 200), dtype)
  for queries in (1, 3):
    out = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=2, num_queries=queries, options=build)
    ref = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=2, num_queries=queries)
    assert test_base.relative_error(merged_states(*out), merged_states(*ref)) < 2e-3


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs an H100/H200")
@pytest.mark.parametrize("splits", [1, 2, 4, 8])
@pytest.mark.parametrize("build", [mf.Fp8Options(), mf.Fp8Options(tile=64, stages=3), mf.Fp8Options(merge="cluster")],
                         ids=str)
def test_glue_in_the_kernel_natively(build, splits):
  """The compiled `fp8_attention` (the splits' merge through global memory and TMA, after a cluster barrier or
  by the last to count itself) == the reference, over many (b, k), repeated (an ordering bug would show as a
  sometimes-wrong row)."""
  lengths = (4096, 0, 1, 2000, 3333, 129, 4095, 700)
  q, scale, arrays, ref_q_t = _fused_case(lengths, 4, capacity=4096, kv_heads=8)
  ref = merged_states(*mf.reference_states(ref_q_t, *arrays, num_splits=splits))[:, :, :4]
  for _ in range(5):
    out = np.asarray(mf.fp8_attention(q, scale, *arrays, num_splits=splits, options=build), np.float32)
    assert test_base.relative_error(out, ref) < 4e-3
    assert np.abs(out - ref).max() <= 2e-2 * np.abs(ref).max() and not out[1].any()


def test_bad_inputs_are_refused():
  q_t, ln, k, ks, v, vs = fp8_case((10, 20))
  call = lambda **kw: mf.fp8_states(**{**dict(q_t=q_t, lengths=ln, k=k, ks=ks, v=v, vs=vs, num_splits=2,
                                               interpret=True), **kw})
  with pytest.raises(ValueError, match="q_t must be"):
    call(q_t=q_t[..., :8])
  with pytest.raises(ValueError, match="capacity 500"):
    call(k=k[:, :, :500], v=v[:, :, :500], ks=ks[:, :, :500], vs=vs[:, :, :500])
  with pytest.raises(ValueError, match="ks must be"):
    call(ks=ks[:, :, :256])
  with pytest.raises(ValueError, match="k must be float8"):
    call(k=k.astype(jnp.bfloat16))
  with pytest.raises(ValueError, match="value_tile must be"):
    call(value_tile=48)
  with pytest.raises(ValueError, match="num_queries must be"):
    call(num_queries=17)
  with pytest.raises(ValueError, match="softcap must be None or positive, got -1"):
    call(softcap=-1.0)
  with pytest.raises(ValueError, match="sliding must be None or a positive integer, got 0"):
    call(sliding=0)
  with pytest.raises(ValueError, match=r"q_t must be \[B, K, H, 16\] with H in \(128, 256\)"):
    call(q_t=jnp.zeros((2, 2, 64, mf.ROWS)))
  q256, *arrs = fp8_case((10, 20), head_dim=256)
  with pytest.raises(ValueError, match="key_terms .* take head_dim 128, got 256"):
    mf.fp8_states(q256, *arrs, num_splits=1, interpret=True, options=mf.Fp8Options(key_terms=2))
  with pytest.raises(ValueError, match="stages must be"):
    mf.Fp8Options(stages=0)
  with pytest.raises(ValueError, match="merge must be one of"):
    mf.Fp8Options(merge="atomic")
  with pytest.raises(ValueError, match="lag must be"):
    mf.Fp8Options(lag=9)
  with pytest.raises(ValueError, match="min_share must be"):
    mf.Fp8Options(min_share=0)
  with pytest.raises(ValueError, match="tile must be"):
    mf.Fp8Options(tile=32)
  with pytest.raises(ValueError, match="key_terms must be"):
    mf.Fp8Options(key_terms=1)
  with pytest.raises(ValueError, match="key_perm converts"):
    mf.Fp8Options(key_perm=True, key_terms=2)
  with pytest.raises(ValueError, match="swizzle=False"):
    mf.Fp8Options(key_perm=True, swizzle=False)
  with pytest.raises(ValueError, match="divide the 64-token step"):
    call(value_tile=128, options=mf.Fp8Options(tile=64))


def _tiled(cache):
  return cache if cache.v.tile else cache_lib.with_value_tile(cache, 64)


class TestMosaicFp8Decode(test_base.DecodeAttentionTestBase):
  """Through `ops.decode_attention(mosaic_fp8=True)`: the shared cases (lengths 0, 1, full, ragged; T = 1
  and 3; GQA shapes; values token-major converted to tiles, or stored in tiles)."""

  FORMATS = ("fp8_e4m3", "fp8_e5m2", "int8")
  NUM_QUERIES = (1, 3)
  VALUE_TILES = (0, 64)

  def attention(self, q, cache, **options):
    return ops.decode_attention(q, _tiled(cache), interpret=INTERPRET, mosaic_fp8=True, **options)

  @pytest.mark.parametrize("rep,num_kv_heads", [(1, 2), (8, 1), (16, 1)])
  def test_gqa_shapes(self, rep, num_kv_heads):  # the base's checks kivi2 first, which skips here
    self._check("fp8_e4m3", [5, 200], rep=rep, num_kv_heads=num_kv_heads)


def test_ops_takes_a_build(monkeypatch):
  """`mosaic_fp8=Fp8Options(...)`: that build (64-token steps, 3 stages) reaches the kernel through ops, the
  same attention as the default build's."""
  q, c = test_base.make_case("fp8_e4m3", [70, 300], value_tile=64)
  seen = []
  real = mf.fp8_states
  monkeypatch.setattr(mf, "fp8_states", lambda *a, **k: seen.append(k["options"]) or real(*a, **k))
  mf._decode.clear_cache()  # traced afresh: the spy sees each build (an earlier test may have traced one)
  ref = ops.decode_attention(q, c, interpret=True, mosaic_fp8=True)
  out = ops.decode_attention(q, c, interpret=True, mosaic_fp8=mf.Fp8Options(tile=64, stages=3))
  assert seen == [mf.Fp8Options(), mf.Fp8Options(tile=64, stages=3)]
  assert test_base.relative_error(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 1e-2
  assert str(mf.Fp8Options(tile=64, stages=3)) == "fp8+tile=64+stages=3"
  with pytest.raises(ValueError, match="mosaic_fp8 must be"):
    ops.decode_attention(q, c, interpret=True, mosaic_fp8="yes")


def test_ops_refuses_what_the_kernel_does_not_take():
  q, c = test_base.make_case("fp8_e4m3", [5, 200], value_tile=64)
  with pytest.raises(NotImplementedError, match="tune the Triton kernels"):
    ops.decode_attention(q, c, interpret=True, mosaic_fp8=True, num_warps=4)
  with pytest.raises(NotImplementedError, match="tiles of 16-128"):
    ops.decode_attention(q, cache_lib.with_value_tile(c, 0), interpret=True, mosaic_fp8=True)
  q4, c4 = test_base.make_case("int4", [5, 200])
  with pytest.raises(NotImplementedError, match="FP8 with per-token scales or INT8, got IntSpec\\(bits=4"):
    ops.decode_attention(q4, c4, interpret=True, mosaic_fp8=True)
  q_wide = jnp.zeros((2, 2 * 17, 1, 128), jnp.bfloat16)
  with pytest.raises(NotImplementedError, match="at most 16 query rows"):
    ops.decode_attention(q_wide, c, interpret=True, mosaic_fp8=True)
  with pytest.raises(NotImplementedError, match="whole value tiles"):
    ops.decode_attention(q, cache_lib.with_value_tile(c, 128), interpret=True, mosaic_fp8=mf.Fp8Options(tile=64))
  sink = formats.KVFormat(name="fp8_sink", key=formats.FP8Spec(), value=formats.FP8Spec(), sink=4)
  cs = cache_lib.init_cache(sink, 2, 2, 384, 128, value_tile=64)
  assert "sink" in mf.supports(cs)
  with pytest.raises(NotImplementedError, match="sink"):
    ops.decode_attention(q, cs, interpret=True, mosaic_fp8=True)


def test_the_default_switch_leaves_the_rest_to_triton(monkeypatch):
  """ops.MOSAIC_FP8 on: a plain FP8 call goes to the Mosaic kernel, and so does one with a soft-cap; one with
  a Triton option still to Triton's kernel, not to an error or XLA."""
  q, c = test_base.make_case("fp8_e4m3", [5, 200], value_tile=64)
  calls = []
  real = mf.decode_attention
  monkeypatch.setattr(mf, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
  monkeypatch.setattr(ops, "MOSAIC_FP8", True)
  ref = ops.decode_attention(q, c, interpret=True, mosaic_fp8=False)
  out = ops.decode_attention(q, c, interpret=True)
  assert calls == [1] and test_base.relative_error(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 1e-2
  ops.decode_attention(q, c, interpret=True, logit_softcap=5.0)
  assert calls == [1, 1]
  ops.decode_attention(q, c, interpret=True, num_warps=4)
  assert calls == [1, 1]


def test_default_splits_leave_four_tiles_a_split():
  assert mf.splits_for(8, 8, 32768) == 4    # 264 programs: one wave at 2 per SM
  assert mf.splits_for(1, 8, 32768) == 32   # capped by mosaic_decode.MAX_SPLITS
  assert mf.splits_for(1, 8, 1024) == 2     # 8 tiles: 4 a split
  assert mf.splits_for(64, 8, 4096) == 1
  assert mf.splits_for(1, 8, 32896) == 32  # 257 tiles: the balanced splits need not divide them


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None,
                    reason="Mosaic GPU's CUDA lowering needs jax-cuda12-plugin")
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("build", [mf.Fp8Options(), mf.Fp8Options(tile=64, stages=3), mf.Fp8Options(key_terms=3),
                                   mf.Fp8Options(key_perm=True), mf.Fp8Options(swizzle=False),
                                   mf.Fp8Options(upcast_layout=True)], ids=str)
def test_lowers_for_cuda(dtype, build):
  q_t, ln, k, ks, v, vs = fp8_case((512, 200), dtype)
  fn = jax.jit(lambda *a: mf.fp8_states(*a, num_splits=2, num_queries=2, options=build))
  text = fn.trace(q_t, ln, k, ks, v, vs).lower(lowering_platforms=("cuda",)).as_text()
  assert "kvjax_mosaic_fp8" in text
  if not build.key_terms:  # the glue in the kernel: 4 splits as one cluster
    q, scale, arrays, _ = _fused_case((512, 200), 4, dtype)
    fn = jax.jit(lambda q, *a: mf.fp8_attention(q, scale, *a, num_splits=4, num_queries=2, options=build))
    assert "kvjax_mosaic_fp8" in fn.trace(q, *arrays).lower(lowering_platforms=("cuda",)).as_text()


def test_precision_on_the_reference_lm(tmp_path):
  """`benchmarks/mosaic_precision.py --kernel fp8` on the shipped reference LM's keys and values (one layer,
  one window, interpreted): the default build and 3 e4m3 query terms equal the library reference far inside
  FP8's own quantization error."""
  import os
  import sys
  from kvjax.quality import reference_lm
  if not reference_lm.available():
    pytest.skip("no reference LM checkpoint")
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
  import mosaic_precision
  res = mosaic_precision.main(["--kernel", "fp8", "--tokens", "256", "--windows", "1", "--layers", "1",
                               "--variants", "fp8,fp8+key_terms=3", "--out", str(tmp_path / "p.json")])
  (row,) = res["rows"]
  assert res["format"] == "fp8_e4m3" and "denorm_scale_bound" not in res
  for build in ("fp8", "fp8+key_terms=3"):
    assert 0 < row[f"{build}_rel_err"] < 1e-3 and row["quantization_rel_err"] > 20 * row[f"{build}_rel_err"]


def test_merge_grid_and_scratch():
  """How a kernel's programs are laid out for each in-kernel merge: the cluster's splits are a cluster axis
  (its barrier the scratch); the count's are a grid axis (no scratch: its flag is scoped with the merge)."""
  from pallas_kernels.gpu import mosaic_epilogue as ep
  assert ep.merge_mesh(2, 8, 4, "cluster") == dict(grid=(2, 8), grid_names=("b", "k"), cluster=(4,),
                                                   cluster_names=("s",))
  assert ep.merge_mesh(2, 8, 4, "count") == ep.merge_mesh(2, 8, 4, None) == dict(grid=(2, 8, 4),
                                                                                 grid_names=("b", "k", "s"))
  assert ep.merge_scratch("count") == () and len(ep.merge_scratch("cluster")) == 1
  assert ep.merge_counters("cluster", 2, 8) is None
  assert set(ep.MERGES) == {"count", "cluster"}
  assert [ep.cluster_merge_ok(n) for n in (1, 2, 8, 9)] == [False, True, True, False]
