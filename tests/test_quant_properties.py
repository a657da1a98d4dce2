"""Property tests: every format's round-trip error stays within its bound."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from kvjax import formats, quant
from kvjax.formats import FP8Spec, IntSpec, KIVISpec

# Derandomized so CI is reproducible; run with KVJAX_HYPOTHESIS_EXAMPLES=500 to explore more.
SETTINGS = settings(max_examples=int(os.environ.get("KVJAX_HYPOTHESIS_EXAMPLES", 25)), deadline=None,
                    derandomize="KVJAX_HYPOTHESIS_EXAMPLES" not in os.environ)
F32 = np.float32
EPS = 2.0 ** -22  # f32 arithmetic slack, relative


def arrays(rows=(1, 8), cols=64, magnitude=1e3):
  """[T, H] arrays with mixed scales: some rows / columns up to `magnitude`, zeros, ties."""
  # No f32 subnormals: XLA flushes them to zero on CPU and GPU, so they never reach a cache.
  elems = st.one_of(st.floats(-magnitude, magnitude, width=32, allow_subnormal=False),
                    st.sampled_from([0.0, 1.0, -1.0]))
  return st.integers(*rows).flatmap(
      lambda t: hnp.arrays(np.float32, (t * 32, cols), elements=elems))


@SETTINGS
@given(x=arrays(), dtype=st.sampled_from(["e4m3", "e5m2"]))
def test_fp8_per_token_bound(x, dtype):
  spec = FP8Spec(dtype=dtype, granularity="token")
  q = quant.quantize(jnp.asarray(x), spec)
  out = np.asarray(quant.dequantize(q))
  s = np.asarray(q.scale, F32)
  mant, min_sub = (3, 2.0 ** -9) if dtype == "e4m3" else (2, 2.0 ** -16)
  bound = np.abs(x) * 2.0 ** -(mant + 1) + s * min_sub / 2 + np.abs(x) * EPS
  assert np.all(np.abs(out - x) <= bound)


@SETTINGS
@given(x=arrays(magnitude=1e4), dtype=st.sampled_from(["e4m3", "e5m2"]),
       scale=st.floats(1e-3, 10.0))
def test_fp8_static_saturates_never_nan(x, dtype, scale):
  spec = FP8Spec(dtype=dtype, granularity="tensor")
  q = quant.quantize(jnp.asarray(x), spec, scale=jnp.float32(scale))
  out = np.asarray(quant.dequantize(q))
  assert np.isfinite(out).all()
  limit = F32(spec.max) * F32(scale)
  assert np.all(np.abs(out) <= limit * (1 + 1e-6))
  inside = np.abs(x) <= limit
  mant, min_sub = (3, 2.0 ** -9) if dtype == "e4m3" else (2, 2.0 ** -16)
  tol = np.abs(x) * 2.0 ** -(mant + 1) + scale * min_sub / 2 + np.abs(x) * EPS
  assert np.all(np.abs(out - x)[inside] <= tol[inside])
  np.testing.assert_allclose(np.abs(out[~inside]), limit, rtol=1e-6)


@SETTINGS
@given(x=arrays(), bits=st.sampled_from([4, 8]))
def test_int_per_token_bound(x, bits):
  q = quant.quantize(jnp.asarray(x), IntSpec(bits=bits))
  out = np.asarray(quant.dequantize(q))
  s = np.asarray(q.scale, F32)
  assert np.all(np.abs(out - x) <= s / 2 * (1 + 1e-6) + np.abs(x) * EPS)


@SETTINGS
@given(x=arrays(), bits=st.sampled_from([2, 4]), group=st.sampled_from([16, 32]),
       axis=st.sampled_from(["token", "channel"]))
def test_kivi_bound(x, bits, group, axis):
  spec = KIVISpec(bits=bits, group_size=group, axis=axis)
  q = quant.quantize(jnp.asarray(x), spec)
  out = np.asarray(quant.dequantize(q))
  rep = 0 if axis == "token" else 1
  s = np.repeat(np.asarray(q.scale, F32), group, axis=rep)
  mn = np.repeat(np.asarray(q.zero, F32), group, axis=rep)
  assert np.all(mn <= x)  # the stored min is rounded down
  # and the stored scale up: nothing saturates (up to the f32 rounding of max - min)
  assert np.all(x <= mn + s * spec.qmax + (np.abs(x) + np.abs(mn)) * EPS)
  assert np.all(np.abs(out - x) <= s / 2 + (np.abs(x) + np.abs(mn)) * EPS)


@pytest.mark.parametrize("name", ["fp8_e4m3", "int8", "int4", "kivi2", "kivi4"])
def test_constant_and_zero_inputs_are_exact(name):
  fmt = formats.preset(name)
  for val in (0.0, 3.25):
    x = jnp.full((32, 128), val, jnp.float32)
    for spec in (fmt.key, fmt.value):
      out = quant.dequantize(quant.quantize(x, spec))
      assert np.isfinite(np.asarray(out)).all()
      np.testing.assert_allclose(np.asarray(out), val, atol=0.0 if val == 0 else 3.25 * 2 ** -7)


def test_passthrough_is_bf16():
  x = jnp.linspace(-3, 3, 64 * 32).reshape(32, 64)
  q = quant.quantize(x, formats.Passthrough())
  assert q.codes.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), np.asarray(x.astype(jnp.bfloat16), F32))


def test_quantize_bad_inputs():
  with pytest.raises(ValueError, match="rank >= 2"):
    quant.quantize(jnp.zeros(8), IntSpec())
  with pytest.raises(ValueError, match="multiple of group_size"):
    quant.quantize(jnp.zeros((30, 64)), KIVISpec(group_size=32, axis="token"))
  with pytest.raises(ValueError, match="must divide head_dim"):
    quant.quantize(jnp.zeros((32, 48)), KIVISpec(group_size=32, axis="channel"))
  with pytest.raises(ValueError, match="needs a static `scale`"):
    quant.quantize(jnp.zeros((32, 64)), FP8Spec(granularity="channel"))



def _fp8_grid(dtype):
  """(codes, values) of the finite non-negative codes of an FP8 dtype, ascending."""
  import ml_dtypes
  f8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[dtype]
  vals = np.arange(128, dtype=np.uint8).view(f8).astype(np.float64)
  codes = np.flatnonzero(np.isfinite(vals))
  return codes, vals[codes]


def _fp8_exact(x, s, spec):
  """Round to nearest, ties to even, of clip(|x| / s) onto the FP8 grid, by comparing |x| with every
  code times s in float64 (exact: 24 + 11 bits), with x's sign bit."""
  codes, vals = _fp8_grid(spec.dtype)
  keep = vals <= spec.max
  codes, vals = codes[keep], vals[keep]
  err = np.abs(np.abs(x.astype(np.float64))[..., None] - vals * s.astype(np.float64)[..., None])
  tied = err == err.min(-1, keepdims=True)
  pick = np.where(tied.sum(-1) > 1, np.argmax(tied & (codes % 2 == 0), -1), np.argmin(err, -1))
  return codes[pick].astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 7)


@SETTINGS
@given(x=arrays(rows=(1, 2), cols=32, magnitude=1e4), dtype=st.sampled_from(["e4m3", "e5m2"]),
       ties=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_fp8_division_is_exact_round_to_nearest_even(x, dtype, ties, seed):
  """`quant.fp8_div` (the dynamic FP8 rounding, in XLA and in the GPU writer) is the exact rounding of
  x / s, ties to even, whatever the backend's division does; `ties` puts x exactly on midpoints."""
  spec = FP8Spec(dtype=dtype, granularity="token")
  s, _ = quant.compute_scale(jnp.asarray(x), spec)
  s = np.asarray(s, F32)
  if ties:  # x = (code u + code u+1) / 2 * s: exact in f32 (<= 5 + 8 significant bits)
    codes, vals = _fp8_grid(dtype)
    n_ok = int(np.sum(vals <= spec.max)) - 1
    rng = np.random.default_rng(seed)
    u = rng.integers(0, n_ok, size=x.shape)
    sign = np.where(rng.random(x.shape) < 0.5, -1.0, 1.0)
    x = (sign * (vals[u] + vals[u + 1]) / 2 * s).astype(F32)
    assert np.array_equal(x.astype(np.float64), sign * (vals[u] + vals[u + 1]) / 2 * s.astype(np.float64))
  got = np.asarray(quant.fp8_div(jnp.asarray(x), jnp.asarray(s), spec)).view(np.uint8)
  np.testing.assert_array_equal(got, _fp8_exact(x, s, spec))
