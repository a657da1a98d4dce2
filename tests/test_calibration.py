"""Calibration: jitted reduction, clipping choices, non-finite skipping, save / load."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import calibration as cal, formats, quant
from kvjax.cache import append, init_cache, materialize

L, B, K, T, H = 2, 2, 3, 40, 16


def _batches(seed, n=3):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    k = rng.standard_normal((L, B, K, T, H)).astype(np.float32)
    k[..., 1] *= 40
    out.append((k, rng.standard_normal((L, B, K, T, H)).astype(np.float32)))
  return out


def test_absmax_equals_numpy_over_batches_and_skips_non_finite():
  batches = _batches(0)
  batches[1][0][0, 0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
  stats = cal.calibrate(batches, L, K, H)
  ks = np.concatenate([b[0] for b in batches], axis=1)
  vs = np.concatenate([b[1] for b in batches], axis=1)
  ks = np.where(np.isfinite(ks), np.abs(ks), 0)
  np.testing.assert_array_equal(np.asarray(stats.amax[:, 0]), ks.max(axis=(1, 3)))
  np.testing.assert_array_equal(np.asarray(stats.amax[:, 1]), np.abs(vs).max(axis=(1, 3)))
  finite_nonzero = (np.isfinite(ks) & (ks > 0)).sum(axis=(1, 3))
  np.testing.assert_array_equal(np.asarray(stats.hist[:, 0].sum(-1)), finite_nonzero)
  assert int(stats.tokens) == 3 * B * T
  assert np.isfinite(np.asarray(stats.amax)).all()


@pytest.mark.parametrize("method", ["absmax", "percentile", "mse"])
def test_scales_have_granularity_shapes_and_bounds(method):
  stats = cal.calibrate(_batches(1), L, K, H)
  fmt = formats.fp8("e4m3", "channel", "head")
  s = cal.compute_scales(stats, fmt, method=method, percentile=99.0)
  assert s.k.shape == (L, 1, K, 1, H) and s.v.shape == (L, 1, K, 1, 1)
  amax_scale = np.asarray(stats.amax[:, 0]) / 448.0
  assert np.all(np.asarray(s.k)[:, 0, :, 0] <= amax_scale * (1 + 1e-6))
  assert np.all(np.asarray(s.k) > 0)
  if method == "absmax":
    np.testing.assert_allclose(np.asarray(s.k)[:, 0, :, 0], amax_scale, rtol=1e-6)
  t = cal.compute_scales(stats, formats.fp8("e5m2", "tensor", "tensor"), method=method)
  assert t.k.shape == (L, 1, 1, 1, 1)


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_mse_clip_is_no_worse_than_absmax(dtype):
  """Heavy tails (Student t, 1 dof) spanning more than FP8's range: MSE clipping
  may clip the extreme tail; it never does worse than absmax on the data."""
  rng = np.random.default_rng(2)
  k = (rng.standard_t(1, (1, 4, 1, 4096, 8)) * 1e-3).astype(np.float32)
  stats = cal.calibrate([(k, k)], 1, 1, 8)
  fmt = formats.fp8(dtype, "tensor", "tensor")
  errs, clips = {}, {}
  for m in ("absmax", "mse"):
    s = cal.compute_scales(stats, fmt, method=m)
    x = jnp.asarray(k[0, :, 0])
    d = quant.dequantize(quant.quantize(x, fmt.key, scale=s.k[0, 0]))
    errs[m] = float(jnp.sum((d - x) ** 2))
    clips[m] = float(s.k.max()) * fmt.key.max
  assert clips["mse"] <= clips["absmax"] * (1 + 1e-6)
  assert errs["mse"] <= errs["absmax"] * 1.001


def test_save_load_roundtrip_conventions_and_use_in_cache(tmp_path):
  stats = cal.calibrate(_batches(3), L, K, H)
  fmt = formats.preset("fp8_e4m3_static")
  s = cal.compute_scales(stats, fmt, margin=2.0)
  path = str(tmp_path / "scales.safetensors")
  cal.save_scales(path, s, fmt)
  back = cal.load_scales(path)
  np.testing.assert_array_equal(np.asarray(back.k), np.asarray(s.k))
  np.testing.assert_array_equal(np.asarray(back.v), np.asarray(s.v))
  # a checkpoint storing the inverse or the absmax converts at load
  from safetensors.numpy import save_file
  save_file({"k_scale": 1.0 / np.asarray(s.k), "v_scale": np.asarray(s.v) * 448.0},
            str(tmp_path / "inv.safetensors"))
  inv = cal.load_scales(str(tmp_path / "inv.safetensors"), convention="inverse")
  np.testing.assert_allclose(np.asarray(inv.k), np.asarray(s.k), rtol=1e-6)
  ab = cal.load_scales(str(tmp_path / "inv.safetensors"), convention="absmax", fp8_max=448.0)
  np.testing.assert_allclose(np.asarray(ab.v), np.asarray(s.v), rtol=1e-6)
  with pytest.raises(ValueError, match="needs fp8_max"):
    cal.load_scales(path, convention="absmax")
  # the stacked cache takes the scales directly
  cache = init_cache(fmt, B, K, 64, H, scales=back, num_layers=L)
  k, v = _batches(4, 1)[0]
  cache = append(cache, jnp.asarray(k), jnp.asarray(v))
  kh, _ = materialize(cache)
  err = np.abs(np.asarray(kh)[:, :, :, :T] - k).max() / np.abs(k).max()
  assert err < 0.07


def test_update_stats_is_jitted_and_checks_shapes():
  stats = cal.init_stats(L, K, H)
  k, v = _batches(5, 1)[0]
  cal.update_stats(stats, jnp.asarray(k), jnp.asarray(v))
  assert cal.update_stats._cache_size() >= 1
  with pytest.raises(ValueError, match=r"must both be \[L, B, K, T, H\]"):
    cal.update_stats(stats, jnp.asarray(k[0]), jnp.asarray(v[0]))
  with pytest.raises(ValueError, match="method must be"):
    cal.compute_scales(stats, formats.preset("fp8_e4m3_static"), method="kl")
