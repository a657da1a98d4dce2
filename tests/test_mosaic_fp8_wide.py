"""The Mosaic FP8 kernel (`pallas_kernels.gpu.mosaic_fp8`) on Gemma 2's shape and on INT8 caches (session 32):
head_dim 256, the logit soft-cap and the sliding window against the jnp reference and, through `ops`, against
`kvjax.attention`; the default switch by capacity; INT8's register conversion checked on every code pair."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8_cases import fp8_case, merged_states
from kvjax import attention, cache as cache_lib, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import mosaic_fp8 as mf, ops

INTERPRET = jax.default_backend() != "gpu"


@pytest.mark.parametrize("head_dim,softcap,sliding,lengths,splits,queries", [
    (256, None, None, (512, 200), 2, 1), (256, 1.5, None, (0, 129), 4, 1), (256, 1.5, 130, (512, 300), 2, 3),
    (128, None, 37, (384, 1), 1, 1), (128, 1.5, 200, (512, 511), 4, 1), (256, None, 300, (200, 3), 2, 1)])
def test_gemma_head_dim_softcap_and_sliding_window(head_dim, softcap, sliding, lengths, splits, queries):
  """Gemma 2's shape: head_dim 256 (two 128-channel value accumulators, two key loads a step), the logit
  soft-cap (1.5: the random logits here reach ~3, so the cap bends them) and the sliding window (inside one
  step, across steps, wider than the length; T = 3 with a window per row), against the reference."""
  q_t, ln, k, ks, v, vs = fp8_case(lengths, head_dim=head_dim, seed=3)
  caps = dict(softcap=softcap, sliding=sliding)
  o, m, l = mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=splits, num_queries=queries, interpret=INTERPRET,
                         **caps)
  ro, rm, rl = mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=splits, num_queries=queries, **caps)
  seen = np.asarray(rl).sum(2) > 0
  assert np.array_equal(np.asarray(l).sum(2) > 0, seen)
  out, ref = merged_states(o, m, l), merged_states(ro, rm, rl)
  assert test_base.relative_error(out, ref) < 1e-3
  if softcap or (sliding and sliding < max(lengths)):  # the cap / window change the result: the test can fail
    plain = merged_states(*mf.reference_states(q_t, ln, k, ks, v, vs, num_splits=splits, num_queries=queries))
    assert test_base.relative_error(plain, ref) > 1e-2



@pytest.mark.parametrize("lengths,queries", [([0, 1, 200, 384], 1), ([3, 384], 3)])
def test_ops_gemma_shape_matches_the_xla_reference(lengths, queries):
  """Through `ops`: Gemma-2's head_dim 256, 2 query heads per KV head, logit soft-cap 2 (the test case's
  outlier keys make logits beyond it) and a 130-token sliding window, against `kvjax.attention`'s."""
  q, c = test_base.make_case("fp8_e4m3", lengths, rep=2, head_dim=256, num_queries=queries, value_tile=64)
  for caps in (dict(logit_softcap=2.0), dict(window=130), dict(logit_softcap=2.0, window=130)):
    ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c, **caps), np.float32)
    out = np.asarray(ops.decode_attention(q, c, interpret=INTERPRET, mosaic_fp8=True, **caps), np.float32)
    plain = np.asarray(attention.decode_attention(q.astype(jnp.float32), c), np.float32)
    for b, length in enumerate(lengths):
      if length:
        assert test_base.relative_error(out[b], ref[b]) < 1e-2, (caps, b)
        if length > 130:
          assert test_base.relative_error(plain[b], ref[b]) > 2e-2, (caps, b)  # the option matters here
      else:
        assert not out[b].any()



def test_the_capacity_switch_takes_long_gemma_caches_only(monkeypatch):
  """ops.MOSAIC_FP8_MIN_CAPACITY (here {256: 384}): a head_dim-256 FP8 cache of that capacity (soft-capped,
  windowed) goes to the Mosaic kernel with the 64-token build; a shorter one, or a head_dim-128 one, stays with
  Triton's."""
  builds = []
  real = mf.decode_attention
  monkeypatch.setattr(mf, "decode_attention", lambda *a, **k: builds.append(k["options"]) or real(*a, **k))
  monkeypatch.setattr(ops, "MOSAIC_FP8_MIN_CAPACITY", {256: test_base.CAPACITY})
  q, c = test_base.make_case("fp8_e4m3", [5, 200], rep=2, head_dim=256, value_tile=64)
  out = ops.decode_attention(q, c, interpret=True, logit_softcap=2.0, window=100)
  ref = attention.decode_attention(q.astype(jnp.float32), c, logit_softcap=2.0, window=100)
  assert builds == [mf.Fp8Options(tile=64)] and mf.default_options(128) == mf.Fp8Options()
  assert test_base.relative_error(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 1e-2
  q1, c1 = test_base.make_case("fp8_e4m3", [5, 200], value_tile=64)
  ops.decode_attention(q1, c1, interpret=True)
  monkeypatch.setattr(ops, "MOSAIC_FP8_MIN_CAPACITY", {256: test_base.CAPACITY + 128})
  ops.decode_attention(q, c, interpret=True, logit_softcap=2.0, window=100)
  assert len(builds) == 1
  # 128-token value tiles: not whole tiles of the default 64-token step, so Triton's kernel, not XLA's fallback
  monkeypatch.setattr(ops, "MOSAIC_FP8_MIN_CAPACITY", {256: test_base.CAPACITY})
  c128 = cache_lib.with_value_tile(c, 128)
  out128 = ops.decode_attention(q, c128, interpret=True, logit_softcap=2.0, window=100)
  assert len(builds) == 1
  assert test_base.relative_error(np.asarray(out128, np.float32), np.asarray(ref, np.float32)) < 1e-2



def test_int8_caches_take_the_mosaic_kernel_only_when_switched_on(monkeypatch):
  """INT8 caches: Triton's kernel below MOSAIC_INT8_MIN_CAPACITY (also past MOSAIC_FP8_MIN_CAPACITY: each format
  has its own switch); the Mosaic kernel from MOSAIC_INT8_MIN_CAPACITY's capacity or with MOSAIC_INT8, and then
  equal to XLA's reference."""
  builds = []
  real = mf.decode_attention
  monkeypatch.setattr(mf, "decode_attention", lambda *a, **k: builds.append(k["options"]) or real(*a, **k))
  monkeypatch.setattr(ops, "MOSAIC_FP8_MIN_CAPACITY", {256: test_base.CAPACITY})
  q, c = test_base.make_case("int8", [5, 200], rep=2, head_dim=256, value_tile=64)
  ref = attention.decode_attention(q.astype(jnp.float32), c, logit_softcap=2.0)
  ops.decode_attention(q, c, interpret=True, logit_softcap=2.0)
  assert builds == []
  monkeypatch.setattr(ops, "MOSAIC_INT8_MIN_CAPACITY", {256: test_base.CAPACITY})
  out = ops.decode_attention(q, c, interpret=True, logit_softcap=2.0)
  assert builds == [mf.Fp8Options(tile=64)]
  assert test_base.relative_error(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 1e-2
  monkeypatch.setattr(ops, "MOSAIC_INT8_MIN_CAPACITY", {})
  monkeypatch.setattr(ops, "MOSAIC_INT8", True)
  q1, c1 = test_base.make_case("int8", [5, 200], value_tile=64)
  ops.decode_attention(q1, c1, interpret=True)
  assert builds[1:] == [mf.Fp8Options()]


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2", "kivi2", "int4", "bf16"])
def test_the_committed_rule_sends_long_head_dim_256_8bit_caches_to_mosaic(name):
  """The committed defaults (timed on an H100, sessions 32 and 34): FP8 and INT8 caches of head_dim 256 from 16k
  tokens take the Mosaic kernel (Gemma-2 B=24 32k: INT8 572.1 us against Triton's 703.3; at 16k the two tie);
  shorter ones, head_dim 128 at any length (Llama's B=8 32k: Triton's 190.7 against 195.2) and every other
  format stay off it. Abstract caches: only their format and shape are read."""
  def routed(head_dim, capacity):
    cache = jax.eval_shape(lambda: cache_lib.init_cache(formats.preset(name), 1, 4, capacity, head_dim))
    return ops._mosaic_8bit_by_default(cache)
  eight_bit = name in ("int8", "fp8_e4m3", "fp8_e5m2")
  assert [routed(256, 16384), routed(256, 32768)] == [eight_bit] * 2
  assert not routed(256, 16384 - 128) and not routed(128, 32768) and not routed(128, 131072)


def test_int8_prmt_constants_decode_every_code_pair():
  """`mosaic_registers.int8_as_f16`'s PTX (prmt, xor, sub.f16x2) emulated in numpy with its constants
  (`INT8_PRMT`): every pair of int8 codes, at either position of a 32-bit word, comes out as the two codes in
  fp16, exactly."""
  c = mf.INT8_PRMT
  codes = np.arange(-128, 128, dtype=np.int8)
  a, b = (x.ravel() for x in np.meshgrid(codes, codes))
  for p, sel in enumerate(c["selectors"]):
    word = np.zeros((a.size, 4), np.uint8)
    word[:, 2 * p], word[:, 2 * p + 1] = a.view(np.uint8), b.view(np.uint8)
    pool = np.concatenate([word, np.full((a.size, 4), c["exponent"] >> 24, np.uint8)], axis=1)  # prmt's bytes 0-7
    picked = np.stack([pool[:, (sel >> (4 * i)) & 7] for i in range(4)], axis=1).copy().view(np.uint32)[:, 0]
    halves = (picked ^ np.uint32(c["flip"])).view(np.uint16).view(np.float16).reshape(-1, 2)
    bias = np.array([c["bias"]], np.uint32).view(np.uint16).view(np.float16)
    out = halves - bias  # both fp16: exact for integers below 2048
    np.testing.assert_array_equal(out[:, 0], a.astype(np.float16))
    np.testing.assert_array_equal(out[:, 1], b.astype(np.float16))



def test_int8_codes_refuse_key_terms():
  q_t, ln, k, ks, v, vs = fp8_case((10, 20), jnp.int8)
  with pytest.raises(ValueError, match="key_terms .* take FP8 keys, got int8"):
    mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=1, interpret=True, options=mf.Fp8Options(key_terms=2))
  with pytest.raises(ValueError, match="k must be float8_e4m3fn, float8_e5m2 or int8, got int16"):
    mf.fp8_states(q_t, ln, k.astype(jnp.int16), ks, v, vs, num_splits=1, interpret=True)
