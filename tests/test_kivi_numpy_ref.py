"""kvjax's KIVI codes, scales, packing and cache view equal an independent numpy implementation."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import np_ref
from kvjax import formats, packing, quant
from kvjax.cache import append, init_cache, materialize


def _bf16_values(rng, shape, outliers=True):
  x = rng.standard_normal(shape).astype(np.float32)
  if outliers:
    x[..., :2] *= 30.0
  return x.astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("group", [32, 64])
def test_key_codes_scales_equal_numpy(bits, group):
  rng = np.random.default_rng(bits * 100 + group)
  x = _bf16_values(rng, (128, 64))
  spec = formats.KIVISpec(bits=bits, group_size=group, axis="token")
  q = quant.quantize(jnp.asarray(x), spec, block=128)
  codes, scale, mn = np_ref.kivi_keys(x, bits, group)
  np.testing.assert_array_equal(np.asarray(q.scale, np.float32), scale)
  np.testing.assert_array_equal(np.asarray(q.zero, np.float32), mn)
  np.testing.assert_array_equal(np.asarray(q.codes), np_ref.pack_planar(codes, bits, 0, 128))
  deq = codes * np.repeat(scale, group, 0) + np.repeat(mn, group, 0)
  np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), deq.astype(np.float32))


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("group", [32, 128])
def test_value_codes_scales_equal_numpy(bits, group):
  rng = np.random.default_rng(bits + group)
  x = _bf16_values(rng, (40, 128), outliers=False)
  x[3] = 1.5  # a constant group: scale 1, codes 0, exact
  spec = formats.KIVISpec(bits=bits, group_size=group, axis="channel")
  q = quant.quantize(jnp.asarray(x), spec)
  codes, scale, mn = np_ref.kivi_values(x, bits, group)
  np.testing.assert_array_equal(np.asarray(q.scale, np.float32), scale)
  np.testing.assert_array_equal(np.asarray(q.zero, np.float32), mn)
  np.testing.assert_array_equal(np.asarray(q.codes), np_ref.pack_planar(codes, bits, 1, 128))
  deq = np.asarray(quant.dequantize(q))
  np.testing.assert_array_equal(deq[3], 1.5)
  np.testing.assert_array_equal(deq, (codes * np.repeat(scale, group, 1)
                                      + np.repeat(mn, group, 1)).astype(np.float32))


@pytest.mark.parametrize("bits,block", [(2, 16), (2, 128), (4, 8), (4, 64)])
def test_packing_equals_numpy_and_roundtrips(bits, block):
  rng = np.random.default_rng(block)
  codes = rng.integers(0, 2 ** bits, (3, 128, 5), dtype=np.uint8)
  packed = packing.pack(jnp.asarray(codes), bits, axis=1, block=block)
  np.testing.assert_array_equal(np.asarray(packed), np_ref.pack_planar(codes, bits, 1, block))
  np.testing.assert_array_equal(np.asarray(packing.unpack(packed, bits, axis=1, block=block)), codes)


@pytest.mark.parametrize("length", [0, 1, 31, 64, 100, 128, 129, 255, 256])
def test_cache_view_equals_numpy(length):
  """Which tokens are quantized and which stay full precision (R = 64, G = 32)."""
  fmt = formats.kivi(bits=2, group_size=32, residual=64)
  rng = np.random.default_rng(length)
  k = _bf16_values(rng, (1, 1, 256, 128))
  v = _bf16_values(rng, (1, 1, 256, 128), outliers=False)
  cache = init_cache(fmt, 1, 1, 256, 128)
  cache = append(cache, jnp.asarray(k), jnp.asarray(v), jnp.array([length]))
  kh, vh = materialize(cache)
  kr, vr = np_ref.kivi_cache_view(k[0, 0], v[0, 0], length, 2, 32, 64)
  np.testing.assert_array_equal(np.asarray(kh)[0, 0, :length], kr)
  np.testing.assert_array_equal(np.asarray(vh)[0, 0, :length], vr)
