"""KVAttention: decode through the module equals the reference attention path, in every
format; cached == uncached; the flax NNX and gemma-dict loops work as those libraries write them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import kvjax
from kvjax import adapters, attention, calibration, formats, rope
from kvjax.cache import append, init_cache
from kvjax.module import KVAttention

B, T, D, N, K, H = 2, 12, 32, 4, 2, 16
F32 = formats.KVFormat(name="f32", key=formats.Passthrough(dtype="float32"),
                       value=formats.Passthrough(dtype="float32"))
FORMATS = {"bf16": formats.bf16(), "fp8_e4m3": formats.fp8("e4m3"), "int8": formats.int8(),
           "int4": formats.int4(), "fp8_static": formats.fp8("e4m3", "channel", "head"),
           "kivi2": formats.kivi(2, 8, 8), "kivi4": formats.kivi(4, 8, 8)}


def make(num_kv_heads=K, **kw):
  base = dict(features=D, num_heads=N, num_kv_heads=num_kv_heads, head_dim=H, sm_scale=0.3,
              logit_softcap=4.0, window=5, use_qk_norm=True, rope_base=100.0)
  return KVAttention(**{**base, **kw}, rngs=nnx.Rngs(0))


def inputs(seed=0, t=T):
  return jax.random.normal(jax.random.PRNGKey(seed), (B, t, D))


def reference_decode(attn, x, cache, lengths_before):  # noqa: D401
  """One T=1 step written from the public pieces: project, norm, rope, append, reference attend."""
  pos = lengths_before[:, None]
  q = jnp.einsum("btd,dnh->bnth", x, attn.q[...])
  k = jnp.einsum("btd,dkh->bkth", x, attn.k[...])
  v = jnp.einsum("btd,dkh->bkth", x, attn.v[...])
  q, k = attn.q_norm(q), attn.k_norm(k)
  q = rope.apply_rope(q, pos, base=100.0)
  k = rope.apply_rope(k, pos, base=100.0)
  cache = append(cache, k, v)
  o = attention.decode_attention(q, cache, sm_scale=0.3, logit_softcap=4.0, window=5)
  return cache, jnp.einsum("bnth,nhd->btd", o, attn.o[...])


def _scales(fmt):
  if not fmt.has_static_scales:
    return None
  stats = calibration.calibrate([(jnp.ones((1, 1, K, 4, H)) * 3.0, jnp.ones((1, 1, K, 4, H)) * 2.0)],
                                1, K, H)
  s = calibration.compute_scales(stats, fmt, margin=2.0)
  return (s.k[0] if s.k is not None else None, s.v[0] if s.v is not None else None)


@pytest.mark.parametrize("name", list(FORMATS))
def test_decode_through_module_equals_reference_path(name):
  fmt = FORMATS[name]
  attn = make(fmt=fmt)
  x = inputs()
  cache = attn.new_cache(B, 24, scales=_scales(fmt))
  lengths = jnp.array([9, 5], jnp.int32)
  cache, _ = jax.jit(lambda c: attn(x[:, :9], None, c, num_new=lengths))(cache)  # ragged prefill
  ref_cache = cache
  both = jax.jit(lambda c, rc, xt: (attn(xt, None, c, implementation="xla"),
                                     reference_decode(attn, xt, rc, rc.lengths)))
  for t in range(3):
    xt = x[:, 9 + t:10 + t]
    (cache, got), (ref_cache, want) = both(cache, ref_cache, xt)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(cache.lengths, [12, 8])
  for a, b in zip(kvjax.materialize(cache), kvjax.materialize(ref_cache)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_kv_heads", [2, 1])  # GQA and MQA
def test_cached_prefill_chunks_and_decode_equal_uncached(num_kv_heads):
  attn = make(num_kv_heads=num_kv_heads)
  x = inputs(1)
  want = attn(x)  # uncached causal self-attention
  call = jax.jit(lambda c, xs: attn(xs, None, c))
  cache = attn.new_cache(B, 16, fmt=F32)
  cache, a = call(cache, x[:, :4])  # prefill chunk 1
  cache, b = call(cache, x[:, 4:9])  # chunk 2 sees chunk 1 from the cache
  outs = [a, b]
  for t in range(9, T):
    cache, o = call(cache, x[:, t:t + 1])
    outs.append(o)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, rtol=2e-5, atol=2e-5)


def test_kivi_chunked_prefill_attends_to_stored_tokens():
  attn = make(fmt=formats.kivi(2, 8, 8), window=None)
  x = inputs(2, 20)
  call = jax.jit(lambda c, xs: attn(xs, None, c))
  full_cache, full = call(attn.new_cache(B, 24), x)
  c, a = call(attn.new_cache(B, 24), x[:, :10])
  c, b = call(c, x[:, 10:])
  np.testing.assert_allclose(a, full[:, :10], rtol=1e-5, atol=1e-5)  # first chunk: unquantized
  err = float(jnp.linalg.norm(b - full[:, 10:]) / jnp.linalg.norm(full[:, 10:]))
  assert 0 < err < 0.3  # later chunk reads 2-bit keys of the first: close, not equal
  np.testing.assert_array_equal(c.lengths, full_cache.lengths)


def test_nnx_cache_decode_loop():
  """The flax NNX way: init_cache on the module, then call with decode=True inside nnx.jit."""
  attn = make()
  x = inputs(3)
  want = attn(x)
  attn.init_cache((B, 16, D), fmt=F32)
  assert isinstance(attn.cache, nnx.Cache)

  @nnx.jit
  def step(model, xt):
    return model(xt, decode=True)

  outs = [step(attn, x[:, t:t + 1]) for t in range(T)]
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(attn.cache.get_value().lengths, [T, T])
  # nnx.view creates the cache like nnx.MultiHeadAttention's set_view does.
  fresh = nnx.view(make(), decode=True, batch_size=B, max_length=16)
  assert fresh.cache.get_value().capacity == 16 and fresh.decode
  out = fresh(x[:, :1])  # decode by default now
  np.testing.assert_allclose(out, want[:, :1], rtol=1e-2, atol=1e-2)  # bf16 cache


def test_gemma_dict_decode_loop():
  """The gemma-library way: a per-layer dict, (cache, out) = attn(x, segment_pos, cache, mask)."""
  attn = make(fmt=F32)
  x = inputs(4)
  want = attn(x)
  cache_size, prompt = 16, 6
  cache = attn.init_layer_cache(cache_size, B)
  assert set(cache) == {"k", "v", "positions", "end_index"}
  positions = jnp.broadcast_to(jnp.arange(prompt), (B, prompt))
  attn_mask = jnp.tril(jnp.ones((prompt, cache_size), bool))[None]  # accepted, lengths mask
  cache, out = jax.jit(attn)(x[:, :prompt], positions, cache, attn_mask)
  outs = [out]

  @jax.jit
  def sample_step(cache, xt, pos):
    mask = jnp.arange(cache_size)[None, None] <= pos[:, :, None]
    return attn(xt, pos, cache, mask)

  for t in range(prompt, T):
    pos = cache["end_index"][:, None]
    cache, out = sample_step(cache, x[:, t:t + 1], pos)
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(cache["end_index"], [T, T])
  np.testing.assert_array_equal(cache["positions"][0, :T], np.arange(T))


def test_token_major_adapters_transpose_once():
  k = jax.random.normal(jax.random.PRNGKey(0), (B, 10, K, H))
  v = jax.random.normal(jax.random.PRNGKey(1), (B, 10, K, H))
  c = adapters.from_token_major(k, v, formats.bf16(), lengths=jnp.array([10, 6]), capacity=12)
  assert c.k.shape == (B, K, 12, H)
  kt, vt = adapters.to_token_major(c, jnp.float32)
  np.testing.assert_allclose(kt[0, :10], k[0].astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_allclose(vt[1, :6], v[1, :6].astype(jnp.bfloat16).astype(jnp.float32))


def test_errors_name_the_problem():
  attn = make()
  with pytest.raises(ValueError, match="cache not initialized"):
    attn(inputs()[:, :1], decode=True)
  with pytest.raises(ValueError, match=r"x must be \[B, T, D=32\]"):
    attn(jnp.ones((B, T, 7)))
  with pytest.raises(ValueError, match="stacked cache"):
    attn(inputs()[:, :1], None, init_cache(formats.bf16(), B, K, 16, H, num_layers=2))
  with pytest.raises(KeyError, match="missing"):
    attn(inputs()[:, :1], None, {"k": 1, "v": 2})
  bad = dict(attn.init_layer_cache(16, B), k=jnp.zeros((B, 16, K, H)))
  with pytest.raises(TypeError, match="from_token_major"):
    attn(inputs()[:, :1], None, bad)
  with pytest.raises(ValueError, match=r"num_heads \(4\) must be divisible by num_kv_heads \(3\)"):
    make(num_kv_heads=3)
