"""KIVI-2 code words as e4m3 WGMMA A operands (`pallas_kernels.gpu.mosaic_fp8_planes`, session 37): each
byte's 2-bit planes are the exact codes at the fp16 k columns `plane_k_index` names; the key product built
from them (`benchmarks/fp8_products.py`) equals the codes' product, in Mosaic GPU's interpreter here and
compiled on an H100 / H200; `benchmarks/wgmma_rate.py`'s kernel sums what it should."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gpu import mosaic_fp8_planes as f8

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import fp8_products  # noqa: E402
import wgmma_rate  # noqa: E402

NATIVE = jax.default_backend() == "gpu"


def test_planes_are_the_codes_at_their_k_columns():
  words = jax.random.randint(jax.random.PRNGKey(0), (64, 16), 0, 1 << 16, jnp.int32).astype(jnp.uint16)
  codes = fp8_products.codes_of(words)  # [64, 128]: plane m of word w at k column 16 m + w
  by = f8.words_as_bytes(words, interpret=True)
  assert by.shape == (64, 32) and by.dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(by[:, 1::2]), np.asarray(words >> 8).astype(np.uint8))
  for p in range(f8.PLANES):
    a = np.asarray(f8.fp8_plane(by, p, interpret=True).astype(jnp.float32), np.float64)
    want = codes[:, f8.plane_k_index(p)] * f8.PLANE_FACTORS[p] * 2.0 ** f8.A_SCALE_LOG2
    np.testing.assert_array_equal(a, want)


def test_plane_k_index_covers_every_column_once():
  idx = np.concatenate([f8.plane_k_index(p) for p in range(f8.PLANES)])
  np.testing.assert_array_equal(np.sort(idx), np.arange(128))
  assert list(f8.plane_k_index(0)[:4]) == [0, 64, 1, 65]  # byte 0 = word 0's planes 0-3, byte 1 its 4-7


def test_b_rows_pair_columns_w_and_64_plus_w():
  """B's row order (`plane_k_index` over the planes) read as 16-bit words: word w = (column w, column 64 + w);
  its factor (`word_factors`) undoes the plane's A factor (c 4 2^-9 for odd planes, c 2^-9 for even)."""
  c, w = f8.b_order_channels(), np.arange(64)
  np.testing.assert_array_equal(c[2 * w], w)
  np.testing.assert_array_equal(c[2 * w + 1], 64 + w)
  plane = np.arange(128) // 32
  want = 2.0 ** -f8.A_SCALE_LOG2 / np.array(f8.PLANE_FACTORS)[plane]
  np.testing.assert_array_equal(np.asarray(f8.word_factors())[np.arange(128) // 2], want)


@pytest.mark.parametrize("f16_rest", [False, True], ids=["f32_rest", "f16_rest"])
def test_e4m3_words_hold_the_values_to_bf16_precision(f16_rest):
  """hi + lo of each value within 2^-8 of it (relative; e4m3's subnormal step near 0; f16_rest: and fp16's
  2^-11 more), byte 0 of word w the first half's value, byte 1 the second's; a value e4m3 holds exactly has
  lo = 0."""
  k1, k2 = jax.random.split(jax.random.PRNGKey(2))
  y_lo = jax.random.normal(k1, (64, 8)) * 40.0
  y_hi = jax.random.normal(k2, (64, 8)).at[0, 0].set(1.5)  # 1.5 is exact in e4m3
  words = np.asarray(f8.e4m3_words(y_lo, y_hi, f16_rest=f16_rest))
  bound = 2.0 ** -8 + (2.0 ** -11 if f16_rest else 0.0)
  assert words.shape == (64, 16) and words.dtype == np.uint16

  def val(wd, byte):
    b = ((wd >> (8 * byte)) & 0xFF).astype(np.uint8)
    return np.asarray(jax.lax.bitcast_convert_type(jnp.asarray(b), jnp.float8_e4m3fn).astype(jnp.float32))
  for byte, y in ((0, y_lo), (1, y_hi)):
    got = val(words[:, :8], byte).astype(np.float64) + val(words[:, 8:], byte)
    y = np.asarray(y, np.float64)
    assert np.all(np.abs(got - y) <= bound * np.abs(y) + 2.0 ** -10)
  assert val(words[:, 8:], 1)[0, 0] == 0.0 and val(words[:, :8], 1)[0, 0] == 1.5


def test_bad_inputs_are_refused():
  with pytest.raises(ValueError, match=r"p must be in \[0, 4\)"):
    f8.plane_k_index(4)
  with pytest.raises(ValueError, match=r"words must be \[rows, 16\] uint16"):
    f8.words_as_bytes(jnp.zeros((8, 16), jnp.uint32), interpret=True)
  with pytest.raises(ValueError, match=r"words must be \[rows, 16\] uint16"):
    f8.words_as_bytes(jnp.zeros((8, 8), jnp.uint16), interpret=True)
  with pytest.raises(ValueError, match="n must be >= 16 for kind 'fp16'"):
    fp8_products.product_kernel("fp16", 8, 1, 1)
  with pytest.raises(ValueError, match="kind must be one of"):
    fp8_products.product_kernel("int8", 16, 1, 1)
  with pytest.raises(ValueError, match="n must be 16 for kind 'e4m3_kb'"):
    fp8_products.product_kernel("e4m3_kb", 8, 1, 1)


@pytest.mark.parametrize("kind,n,tol", [("fp16", 16, 1e-4), ("e4m3", 16, 1e-4), ("e4m3", 8, 1e-4),
                                        ("e4m3_kb", 16, 2e-3)])
def test_key_products_match_the_codes(kind, n, tol):
  """One product of each build against the codes' (fp16: the dequantized subnormal planes; e4m3: the codes
  times their plane's factor, B's rows in `plane_k_index` order; e4m3_kb: B = the query times the scales,
  built in the kernel as hi / lo words, bf16-level). Natively on a GPU, else interpreted."""
  assert fp8_products.check(kind, n, interpret=not NATIVE) < tol


@pytest.mark.parametrize("text", ["fp16:16:1:1", "fp16:8:1:none", "e4m3:16:1:1"])
def test_wgmma_rate_kernel_sums_its_products(text):
  case = wgmma_rate.Case.parse(text)
  a, b = wgmma_rate.inputs(case, 2, jax.random.PRNGKey(1))
  out = wgmma_rate.rate_kernel(case, 2, 2, 3, interpret=not NATIVE)(a, b)
  ref = wgmma_rate.reference(a, b, case, 2, 3)
  np.testing.assert_allclose(np.asarray(out), np.broadcast_to(np.asarray(ref), out.shape), rtol=2e-3, atol=1e-3)


def test_wgmma_rate_cases_are_validated():
  with pytest.raises(ValueError, match="is not dtype:N:programs_per_SM:lag"):
    wgmma_rate.Case.parse("fp16:16:4")
  with pytest.raises(ValueError, match="dtype must be one of"):
    wgmma_rate.Case("bf16", 16, 4, 1)
  with pytest.raises(ValueError, match="n must be a multiple of 8"):
    wgmma_rate.Case("fp16", 12, 4, 1)
  with pytest.raises(ValueError, match="programs"):
    wgmma_rate.Case("fp16", 16, 0, 1)


@pytest.mark.parametrize("f16_rest", [False, True], ids=["f32_rest", "f16_rest"])
def test_e4m3_words_in_a_kernel_equal_the_jnp_words(f16_rest):
  """`e4m3_words(..., interpret=False)` (one PTX block a register pair, natively) gives the jnp form's words
  bit for bit, for values across e4m3's range (interpreted here: the jnp form in Mosaic GPU's interpreter);
  with f16_rest too (its own PTX block)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  k1, k2 = jax.random.split(jax.random.PRNGKey(7))
  y_lo = jax.random.normal(k1, (64, 8)) * jnp.exp2(jax.random.randint(k2, (64, 8), -8, 8).astype(jnp.float32))
  y_hi = jax.random.normal(k2, (64, 8)) * 30.0
  y_hi = y_hi.at[0, 0].set(1.5).at[1, 1].set(-0.0).at[2, 2].set(2.0 ** -9).at[3, 3].set(300.0)

  def body(lo_g, hi_g, o_g, lo_s, hi_s, o_s, bar):
    for src, dst in ((lo_g, lo_s), (hi_g, hi_s)):
      plgpu.copy_gmem_to_smem(src, dst, bar)
      plgpu.barrier_wait(bar)
    load = (lambda r: r[...]) if not NATIVE else (lambda r: plgpu.load(r, (), layout=plgpu.Layout.WGMMA))
    o_s[...] = f8.e4m3_words(load(lo_s), load(hi_s), interpret=not NATIVE, f16_rest=f16_rest)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_g)
    plgpu.wait_smem_to_gmem(0)

  kw = {} if NATIVE else {"interpret": plgpu.InterpretGPUParams()}
  got = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 16), jnp.uint16),
                     scratch_types=[plgpu.SMEM((64, 8), jnp.float32), plgpu.SMEM((64, 8), jnp.float32),
                                    plgpu.SMEM((64, 16), jnp.uint16), plgpu.Barrier(num_arrivals=1)],
                     compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
                     **kw)(y_lo, y_hi)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(f8.e4m3_words(y_lo, y_hi, f16_rest=f16_rest)))
