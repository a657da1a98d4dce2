"""The jitted generate loop: equals a plain uncached forward (greedy), ragged prompts, chunked
prefill, stop tokens, per-sequence lengths, no recompiles, sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import formats
from kvjax.models import config, decoder, generation, sampling

F32 = formats.KVFormat(name="f32", key=formats.Passthrough(dtype="float32"),
                       value=formats.Passthrough(dtype="float32"))
TINY = dict(vocab_size=96, embed_dim=64, hidden_dim=96, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, tie_embeddings=False)


def gemma2(**kw):
  return config.gemma2_config(**{**TINY, "sliding_window": 6, "query_pre_attn_scalar": 24,
                                 "attn_logit_softcap": 5.0, "final_logit_softcap": 10.0, **kw})


@pytest.fixture(scope="module")
def prompts():
  p = jax.random.randint(jax.random.PRNGKey(7), (3, 10), 1, TINY["vocab_size"])
  return p, jnp.array([10, 6, 2], jnp.int32)


def uncached(model, p, plen, n):
  return generation.greedy_uncached(model, p, plen, n)


def test_bf16_cache_generate_equals_uncached_forward(prompts):
  """bf16 activations (as real Gemma runs): the bf16 cache is lossless, tokens equal exactly."""
  model = decoder.Decoder(gemma2(dtype="bfloat16"), rngs=nnx.Rngs(0))
  p, plen = prompts
  out = generation.generate(model, p, plen, max_new_tokens=12, fmt=formats.bf16())
  np.testing.assert_array_equal(out.tokens, uncached(model, p, plen, 12))
  np.testing.assert_array_equal(out.lengths, [12, 12, 12])
  np.testing.assert_array_equal(out.caches[0].lengths, plen + 11)  # last token is not appended
  # default capacity: P + max_new_tokens rounded up to the GPU kernel's 64-token grid
  assert out.caches[0].capacity == -(-(p.shape[1] + 12) // 64) * 64


@pytest.mark.parametrize("cfg", [
    config.gemma3_config(**{**TINY, "sliding_window": 4, "query_pre_attn_scalar": 16}),
    config.llama_config(**{**TINY, "num_kv_heads": 1})], ids=["gemma3", "llama_mqa"])
def test_f32_cache_generate_equals_uncached_forward(cfg, prompts):
  model = decoder.Decoder(cfg, rngs=nnx.Rngs(1))
  p, plen = prompts
  out = generation.generate(model, p, plen, max_new_tokens=10, fmt=F32, prefill_chunk=4)
  np.testing.assert_array_equal(out.tokens, uncached(model, p, plen, 10))


def test_stop_tokens_lengths_and_no_recompile(prompts):
  model = decoder.Decoder(gemma2(), rngs=nnx.Rngs(2))
  p, plen = prompts
  kw = dict(max_new_tokens=8, fmt=formats.int8())
  full = generation.generate(model, p, plen, **kw)
  stop = int(full.tokens[0, 2])
  n0 = generation.TRACE_COUNT["generate"]
  out = generation.generate(model, p, plen, stop_tokens=(stop,), pad_id=-1, **kw)
  out2 = generation.generate(model, p[::-1], plen[::-1], stop_tokens=(stop,), pad_id=-1,
                             max_lengths=jnp.array([8, 3, 5]), **kw)
  assert generation.TRACE_COUNT["generate"] == n0 + 1  # new prompts, new lengths: same program
  for b in range(3):
    toks = list(np.asarray(full.tokens[b]))
    n = toks.index(stop) + 1 if stop in toks else 8
    assert int(out.lengths[b]) == n
    np.testing.assert_array_equal(out.tokens[b, :n], toks[:n])
    assert (np.asarray(out.tokens[b, n:]) == -1).all()
  assert int(out2.lengths[1]) <= 3 and int(out2.lengths[2]) <= 5
  assert (np.asarray(out2.tokens[1, 3:]) == -1).all()


@pytest.mark.parametrize("fmt", [formats.fp8("e4m3"), formats.kivi(2, 16, 16)], ids=["fp8", "kivi2"])
def test_quantized_formats_generate_close_to_bf16(fmt, prompts):
  model = decoder.Decoder(gemma2(), rngs=nnx.Rngs(3))
  p, plen = prompts
  ref = generation.generate(model, p, plen, max_new_tokens=6, return_logits=True)
  out = generation.generate(model, p, plen, max_new_tokens=6, fmt=fmt, return_logits=True)
  assert out.caches[0].fmt == fmt
  # First token comes from the (unquantized) prefill: identical logits.
  np.testing.assert_allclose(out.logits[:, 0], ref.logits[:, 0], atol=1e-5)
  assert ((np.asarray(out.tokens) >= 0) & (np.asarray(out.tokens) < TINY["vocab_size"])).all()


def test_sampling_filters_and_determinism():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  f = sampling.filter_logits(logits, top_k=2, top_p=None)
  assert (np.asarray(f[0, 2:]) < -1e29).all() and (np.asarray(f[0, :2]) == np.asarray(logits[0, :2])).all()
  f = sampling.filter_logits(logits, top_k=None, top_p=0.7)  # 0.5 + 0.3 reaches 0.7
  np.testing.assert_array_equal(np.asarray(f[0]) > -1e29, [True, True, False, False])
  rng = jax.random.PRNGKey(0)
  big = jnp.tile(logits, (4000, 1))
  cfg = sampling.SamplingConfig(temperature=1.0)
  s = np.asarray(sampling.sample(big, rng, cfg))
  np.testing.assert_allclose(np.bincount(s, minlength=4) / 4000, [0.5, 0.3, 0.15, 0.05], atol=0.03)
  s = np.asarray(sampling.sample(big, rng, sampling.SamplingConfig(temperature=1.0, top_p=0.7)))
  assert set(s) == {0, 1}
  assert (np.asarray(sampling.sample(big, rng, sampling.SamplingConfig(temperature=2.0, top_k=1))) == 0).all()
  with pytest.raises(ValueError, match="top_p must be in"):
    sampling.SamplingConfig(top_p=0.0)


def test_generate_sampling_reproducible_and_top_k1_is_greedy(prompts):
  model = decoder.Decoder(gemma2(), rngs=nnx.Rngs(4))
  p, plen = prompts
  greedy = generation.generate(model, p, plen, max_new_tokens=5)
  k1 = generation.generate(model, p, plen, max_new_tokens=5,
                           sampling=sampling.SamplingConfig(temperature=0.7, top_k=1))
  np.testing.assert_array_equal(k1.tokens, greedy.tokens)
  cfg = sampling.SamplingConfig(temperature=1.5, top_p=0.95)
  a = generation.generate(model, p, plen, max_new_tokens=5, sampling=cfg, rng=jax.random.PRNGKey(1))
  b = generation.generate(model, p, plen, max_new_tokens=5, sampling=cfg, rng=jax.random.PRNGKey(1))
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_generate_errors(prompts):
  model = decoder.Decoder(gemma2(), rngs=nnx.Rngs(0))
  p, _ = prompts
  with pytest.raises(ValueError, match=r"prompt_lengths must be in \[1, P=10\]"):
    generation.generate(model, p, jnp.array([0, 3, 3]), max_new_tokens=2)
  with pytest.raises(ValueError, match=r"capacity >= P \+ max_new_tokens = 14"):
    generation.generate(model, p, max_new_tokens=4, caches=model.init_cache(3, 12))
  with pytest.raises(ValueError, match="sliding_window must be a positive int"):
    config.gemma2_config(**TINY, sliding_window=None)


def test_decoder_gemma_dict_caches_match_tuple_caches(prompts):
  """gemma's Transformer loop: ``logits, cache = model(tokens, cache)`` with {'layer_i': dict}."""
  model = decoder.Decoder(gemma2(), rngs=nnx.Rngs(5))
  p, plen = prompts
  run = jax.jit(lambda c, t, n: model(t, c, num_new=n))
  gl, gc = run(model.init_gemma_cache(16, 3, F32), p, plen)
  tl, tc = run(model.init_cache(3, 16, F32), p, plen)
  assert sorted(gc) == ["layer_0", "layer_1"] and set(gc["layer_0"]) >= {"k", "v", "positions", "end_index"}
  tok = jnp.argmax(tl[jnp.arange(3), plen - 1], -1)[:, None]
  step = jax.jit(lambda c, t: model(t, c))
  for _ in range(2):
    (gl, gc), (tl, tc) = step(gc, tok), step(tc, tok)
    np.testing.assert_allclose(gl, tl, rtol=1e-6, atol=1e-6)
    tok = jnp.argmax(tl[:, -1], -1)[:, None]
  np.testing.assert_array_equal(gc["layer_1"]["end_index"], plen + 2)
