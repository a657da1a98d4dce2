"""Reference attention against an independent numpy computation."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import np_ref
from kvjax import attention, dispatch, formats
from kvjax.cache import append, init_cache

B, K, REP, S, H = 3, 2, 3, 128, 64


def _case(seed, lengths, t=1):
  rng = np.random.default_rng(seed)
  k = rng.standard_normal((B, K, S, H)).astype(np.float32)
  k[..., :3] *= 20
  k = k.astype(ml_dtypes.bfloat16).astype(np.float32)
  v = rng.standard_normal((B, K, S, H)).astype(ml_dtypes.bfloat16).astype(np.float32)
  q = rng.standard_normal((B, K * REP, t, H)).astype(np.float32)
  return q, k, v, np.asarray(lengths)


@pytest.mark.parametrize("t", [1, 3])
def test_kivi_decode_equals_numpy(t):
  """GQA, ragged lengths, one softmax over quantized and residual tokens (R = 32, G = 32)."""
  fmt = formats.kivi(2, 32, 32)
  q, k, v, lengths = _case(t, [0, 45, 128], t)
  cache = append(init_cache(fmt, B, K, S, H), jnp.asarray(k), jnp.asarray(v), jnp.asarray(lengths))
  out = np.asarray(attention.decode_attention(jnp.asarray(q), cache))
  for b in range(B):
    for kh in range(K):
      kk, vv = np_ref.kivi_cache_view(k[b, kh], v[b, kh], lengths[b], 2, 32, 32)
      for n in range(kh * REP, (kh + 1) * REP):
        for i in range(t):
          visible = lengths[b] - t + i + 1
          ref = np_ref.attention(q[b, n, i][None], kk[:max(visible, 0)], vv[:max(visible, 0)], H ** -0.5)
          np.testing.assert_allclose(out[b, n, i], ref[0], rtol=2e-5, atol=2e-5)


def test_bf16_decode_equals_numpy_and_options():
  q, k, v, lengths = _case(7, [5, 128, 77])
  cache = append(init_cache(formats.bf16(), B, K, S, H), jnp.asarray(k), jnp.asarray(v),
                 jnp.asarray(lengths))
  out = np.asarray(attention.decode_attention(jnp.asarray(q), cache, sm_scale=0.05,
                                              logit_softcap=30.0, window=16))
  for b in range(B):
    n, kh = 4, 4 // REP
    lo = max(lengths[b] - 16, 0)
    logits = q[b, n, 0] @ k[b, kh, lo:lengths[b]].T * 0.05
    logits = 30.0 * np.tanh(logits / 30.0)
    p = np.exp(logits - logits.max())
    np.testing.assert_allclose(out[b, n, 0], (p / p.sum()) @ v[b, kh, lo:lengths[b]], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "kivi2"])
def test_chunked_prefill_attention_equals_full_prefill(name):
  """Chunk 2 attends to chunk 1 as the cache stores it; bf16 equals a full causal pass."""
  fmt = formats.preset(name)
  rng = np.random.default_rng(3)
  t, h, s = 200, 128, 256
  q = jnp.asarray(rng.standard_normal((1, 4, t, h)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, 2, t, h)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((1, 2, t, h)), jnp.float32)
  empty = init_cache(fmt, 1, 2, s, h)
  full_out, full_cache = attention.prefill_attention(q, k, v, empty)
  o1, c1 = attention.prefill_attention(q[:, :, :150], k[:, :, :150], v[:, :, :150], empty)
  o2, c2 = attention.prefill_attention(q[:, :, 150:], k[:, :, 150:], v[:, :, 150:], c1)
  np.testing.assert_allclose(np.asarray(o1), np.asarray(full_out[:, :, :150]), rtol=1e-5, atol=1e-5)
  tol = 1e-2 if name == "bf16" else (0.1 if name == "fp8_e4m3" else 0.5)
  err = np.linalg.norm(np.asarray(o2 - full_out[:, :, 150:])) / np.linalg.norm(np.asarray(full_out[:, :, 150:]))
  assert err < tol, err
  np.testing.assert_array_equal(np.asarray(c2.lengths), np.asarray(full_cache.lengths))
  # the exact causal pass over unquantized K/V
  ref = attention.attend(q, k, v, jnp.tril(jnp.ones((t, t), bool))[None, None, None])
  np.testing.assert_allclose(np.asarray(full_out), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_dispatch_falls_back_in_order():
  q, k, v, lengths = _case(9, [3, 4, 5])
  cache = append(init_cache(formats.bf16(), B, K, S, H), jnp.asarray(k), jnp.asarray(v),
                 jnp.asarray(lengths))
  calls = []

  def declines(q, cache, **kw):
    calls.append("declines")
    raise NotImplementedError("not for this test")

  dispatch.register("test_declines", declines)
  with pytest.warns(UserWarning, match="test_declines"):
    out = dispatch.decode_attention(jnp.asarray(q), cache, implementation=("test_declines", "xla"),
                                    warn_on_fallback=True)
  assert calls == ["declines"]
  np.testing.assert_array_equal(np.asarray(out), np.asarray(attention.decode_attention(jnp.asarray(q), cache)))
  with pytest.raises(NotImplementedError, match="not for this test"):
    dispatch.decode_attention(jnp.asarray(q), cache, implementation="test_declines")
  with pytest.raises(ValueError, match="unknown implementation"):
    dispatch.decode_attention(jnp.asarray(q), cache, implementation="nope")
  assert "xla" in dispatch.implementations()
