"""Shared test base: every decode kernel must equal the XLA reference.

Subclass `DecodeAttentionTestBase` in a test module (name it ``Test...``) and
implement `attention(q, cache, **options)`; set `FORMATS` to what the backend
supports. Cases cover every format, GQA, one and several query tokens, and
lengths 0, 1, full capacity and ragged batches, with KIVI residual windows
that are empty, partial and full.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import attention, cache as cache_lib, formats

ALL_FORMATS = ("bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_static", "int8", "int4", "kivi4", "kivi2",
               "kivi2_g128")

TILEABLE_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3_static", "int8")  # 8-bit value codes

# capacity 384 = 3 KIVI residual blocks of 128.
CAPACITY = 384
LENGTHS = {
    "zero": [0, 0],
    "one": [1, 1],
    "full": [CAPACITY, CAPACITY],
    # residual windows: empty (128, 256), partial (1, 37+128, 300), full/ring-wrapped.
    "ragged": [0, 1, 128, 165, 256, 300, 383, 384],
}


def outlier_kv(key, shape, outlier_channels=4, outlier_scale=20.0):
  """Random K/V with a few large channels, like real LLM keys."""
  k1, k2 = jax.random.split(key)
  x = jax.random.normal(k1, shape, jnp.float32)
  chans = jax.random.choice(k2, shape[-1], (outlier_channels,), replace=False)
  return x.at[..., chans].multiply(outlier_scale)


def make_case(fmt_name: str, lengths, *, num_kv_heads=2, rep=4, head_dim=128, num_queries=1,
              capacity=CAPACITY, seed=0, scales=None, value_tile=None, kivi_layout=None):
  """Returns (q [B, N, T, H], cache) with random contents filled to `lengths` (`value_tile`, `kivi_layout`:
  the code layouts, as `init_cache`; None = the backend's default)."""
  fmt = formats.preset(fmt_name)
  b = len(lengths)
  key = jax.random.PRNGKey(seed)
  kk, kv, kq, ks = jax.random.split(key, 4)
  if fmt.has_static_scales and scales is None:
    ksh = cache_lib.static_scale_shape(fmt.key, num_kv_heads, head_dim)
    vsh = cache_lib.static_scale_shape(fmt.value, num_kv_heads, head_dim)
    k1, k2 = jax.random.split(ks)
    scales = tuple(None if sh is None else jax.random.uniform(kk_, sh, minval=0.02, maxval=0.1)
                   for kk_, sh in ((k1, ksh), (k2, vsh)))
  cache = cache_lib.init_cache(fmt, b, num_kv_heads, capacity, head_dim, scales=scales,
                               value_tile=value_tile, kivi_layout=kivi_layout)
  k = outlier_kv(kk, (b, num_kv_heads, capacity, head_dim))
  v = jax.random.normal(kv, (b, num_kv_heads, capacity, head_dim), jnp.float32)
  # Prefill part, then append the rest token by token for some sequences, so
  # both write paths feed the kernel.
  lengths = np.asarray(lengths, np.int32)
  first = np.maximum(lengths - 3, 0)
  cache = cache_lib.append(cache, k, v, jnp.asarray(first))
  for step in range(3):
    idx = np.minimum(first + step, capacity - 1)
    kt = jnp.take_along_axis(k, jnp.asarray(idx)[:, None, None, None], axis=2)
    vt = jnp.take_along_axis(v, jnp.asarray(idx)[:, None, None, None], axis=2)
    cache = cache_lib.append(cache, kt, vt, jnp.asarray((first + step < lengths).astype(np.int32)))
  np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)
  q = jax.random.normal(kq, (b, num_kv_heads * rep, num_queries, head_dim), jnp.float32)
  return q.astype(jnp.bfloat16), cache


def kivi2_unpacked_case(lengths, *, num_kv_heads=2, capacity=512, rows=16, seed=0, group=128, head_dim=128):
  """Random KIVI-2 data for `pallas_kernels.gpu.mosaic_kivi` (its inputs before packing):
  (q_t [B, K, H, rows] f32, lengths, key codes [B, K, S, H] uint8, key scale, key zero
  [B, K, S / G, H] fp16, value codes, value scale, value zero [B, K, S] fp16 (G = group = 128) or
  [B, K, S, H / G]); H = head_dim."""
  rng = np.random.default_rng(seed)
  b, kh, s, h = len(lengths), num_kv_heads, capacity, head_dim
  codes = lambda: rng.integers(0, 4, (b, kh, s, h)).astype(np.uint8)
  scale = lambda *shape: rng.uniform(0.05, 0.2, shape).astype(np.float16)
  zero = lambda *shape: rng.normal(0, 0.2, shape).astype(np.float16)
  q_t = (rng.normal(size=(b, kh, h, rows)) * 0.3 * (128 / h) ** 0.5).astype(np.float32)
  per_token = (b, kh, s) if group == 128 and h == 128 else (b, kh, s, h // group)
  case = (q_t, np.asarray(lengths, np.int32), codes(), scale(b, kh, s // group, h), zero(b, kh, s // group, h),
          codes(), scale(*per_token), zero(*per_token))
  return tuple(map(jnp.asarray, case))


def assert_same_bits(want, got):
  """Two pytrees (caches) equal bit for bit, leaf by leaf: same shapes, dtypes and bytes."""
  for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def relative_error(out, ref) -> float:
  out = np.asarray(out, np.float64)
  ref = np.asarray(ref, np.float64)
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


class DecodeAttentionTestBase:
  """Mix into a ``Test...`` class and implement `attention`."""

  FORMATS = ALL_FORMATS
  RTOL = 1e-2  # relative L2 error at bf16 level
  NUM_QUERIES = (1, 3)
  VALUE_TILES = (0, 64)  # value layouts (`init_cache(value_tile=)`) the backend reads

  def attention(self, q, cache, **options):
    raise NotImplementedError

  def _check(self, fmt_name, lengths, num_queries=1, rep=4, num_kv_heads=2, value_tile=None,
             **options):
    if fmt_name not in self.FORMATS:
      pytest.skip(f"{fmt_name} not supported by this backend")
    q, cache = make_case(fmt_name, lengths, num_queries=num_queries, rep=rep,
                         num_kv_heads=num_kv_heads, value_tile=value_tile)
    ref = attention.decode_attention(q.astype(jnp.float32), cache, **options)
    out = self.attention(q, cache, **options)
    assert out.shape == q.shape, (out.shape, q.shape)
    out = np.asarray(out, np.float32)
    assert np.isfinite(out).all(), "kernel produced non-finite values"
    ref = np.asarray(ref, np.float32)
    for b, length in enumerate(lengths):
      if length == 0:
        np.testing.assert_allclose(out[b], 0.0, atol=1e-6)
      else:
        visible = [i for i in range(num_queries) if length - num_queries + i >= 0]
        err = relative_error(out[b][:, visible], ref[b][:, visible])
        assert err < self.RTOL, f"{fmt_name} seq {b} (length {length}): rel err {err:.2e}"

  @pytest.mark.parametrize("lengths", list(LENGTHS), ids=list(LENGTHS))
  @pytest.mark.parametrize("fmt_name", ALL_FORMATS)
  def test_matches_reference(self, fmt_name, lengths):
    self._check(fmt_name, LENGTHS[lengths])

  @pytest.mark.parametrize("fmt_name", ALL_FORMATS)
  def test_several_queries(self, fmt_name):
    for t in self.NUM_QUERIES:
      self._check(fmt_name, [2, 130, 384], num_queries=t)

  @pytest.mark.parametrize("fmt_name", ["fp8_e4m3", "kivi2"])
  def test_sliding_window(self, fmt_name):
    # Gemma's local layers: keys in (qpos - window, qpos]; windows inside one KIVI block, across
    # the residual window, and T = 3 queries whose windows differ.
    for t, w in ((1, 130), (3, 37)):
      self._check(fmt_name, LENGTHS["ragged"], num_queries=t, window=w)

  @pytest.mark.parametrize("value_tile", [0, 64])
  @pytest.mark.parametrize("fmt_name", TILEABLE_FORMATS)
  def test_value_layouts(self, fmt_name, value_tile):
    # Both value-code layouts (`QArray.tile`) whatever the backend's default; lengths at and
    # around tile edges, ragged, several queries.
    if value_tile not in self.VALUE_TILES:
      pytest.skip(f"value_tile={value_tile} not read by this backend")
    self._check(fmt_name, [0, 1, 63, 64, 65, 200, CAPACITY], num_queries=3, value_tile=value_tile)

  @pytest.mark.parametrize("rep,num_kv_heads", [(1, 2), (8, 1)])
  def test_gqa_shapes(self, rep, num_kv_heads):
    self._check("kivi2", [5, 200], rep=rep, num_kv_heads=num_kv_heads)
    self._check("fp8_e4m3", [5, 200], rep=rep, num_kv_heads=num_kv_heads)
