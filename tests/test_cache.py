"""The cache pytree: append == prefill, ragged batches, capacity, jit, stacking, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import attention, formats
from kvjax.cache import KVCache, append, init_cache, materialize, prefill, stack

ALL = tuple(formats.PRESETS)
B, K, S, H = 3, 2, 256, 64
SMALL_KIVI = {"kivi2_r64": formats.kivi(2, 32, 64), "kivi4_g64_r64": formats.kivi(4, 64, 64)}


def fmt_of(name):
  return SMALL_KIVI[name] if name in SMALL_KIVI else formats.preset(name)


def rand_kv(seed, t=S):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  k = jax.random.normal(k1, (B, K, t, H)) * jnp.linspace(0.5, 20, H)
  return k, jax.random.normal(k2, (B, K, t, H))


def trees_equal(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def make(name):
  fmt = fmt_of(name)
  h = 128 if name == "kivi2_g128" else H
  return init_cache(fmt, B, K, S, h), h


@pytest.mark.parametrize("name", ("bf16", "fp8_e4m3", "int4", "kivi2", "kivi2_g128", "kivi2_r64",
                                  "kivi4_g64_r64"))
def test_append_one_by_one_equals_prefill(name):
  """Across group, residual and flush boundaries, with ragged lengths."""
  cache, h = make(name)
  k, v = rand_kv(1, 200)
  k, v = k[..., :h] if h <= H else jnp.tile(k, (1, 1, 1, 2)), v[..., :h] if h <= H else jnp.tile(v, (1, 1, 1, 2))
  lengths = jnp.array([200, 129, 64])
  full = prefill(cache, k, v, lengths)
  step = jax.jit(append)
  inc = cache
  for t in range(200):
    inc = step(inc, k[:, :, t:t + 1], v[:, :, t:t + 1], (t < lengths).astype(jnp.int32))
  assert trees_equal(full, inc)
  q = jax.random.normal(jax.random.PRNGKey(2), (B, 4 * K, 1, h))
  np.testing.assert_array_equal(np.asarray(attention.decode_attention(q, full)),
                                np.asarray(attention.decode_attention(q, inc)))


@pytest.mark.parametrize("name", ("fp8_e4m3", "kivi2_r64"))
def test_chunked_prefill_equals_prefill(name):
  cache, _ = make(name)
  k, v = rand_kv(3, 192)
  full = prefill(cache, k, v)
  chunked = cache
  for a, b in ((0, 50), (50, 64), (64, 191), (191, 192)):
    chunked = append(chunked, k[:, :, a:b], v[:, :, a:b])
  assert trees_equal(full, chunked)


@pytest.mark.parametrize("name", ALL)
def test_edge_lengths_zero_one_full(name):
  cache, h = make(name)
  k, v = rand_kv(4)
  k, v = (k, v) if h == H else (jnp.tile(k, (1, 1, 1, 2)), jnp.tile(v, (1, 1, 1, 2)))
  c = prefill(cache, k, v, jnp.array([0, 1, S]))
  np.testing.assert_array_equal(np.asarray(c.lengths), [0, 1, S])
  kh, vh = materialize(c)
  for b, n in enumerate([0, 1, S]):
    err = np.abs(np.asarray(kh[b, :, :n] - k[b, :, :n])).max(initial=0) / np.abs(np.asarray(k)).max()
    assert err < 0.5, (name, n, err)
  q = jax.random.normal(jax.random.PRNGKey(5), (B, 2 * K, 2, h))
  out = np.asarray(attention.decode_attention(q, c))
  assert np.isfinite(out).all()
  np.testing.assert_array_equal(out[0], 0.0)  # empty sequence: zeros, not NaN
  np.testing.assert_array_equal(out[1, :, 0], 0.0)  # a query before the first token sees nothing


def test_ragged_sequences_are_independent():
  """A sequence's cache does not depend on what the other sequences hold."""
  cache, _ = make("kivi2_r64")
  k, v = rand_kv(6)
  a = prefill(cache, k, v, jnp.array([100, 7, 256]))
  k2 = k.at[1:].set(0.0)
  b = prefill(cache, k2, v, jnp.array([100, 0, 0]))
  ka, _ = materialize(a)
  kb, _ = materialize(b)
  np.testing.assert_array_equal(np.asarray(ka[0, :, :100]), np.asarray(kb[0, :, :100]))


def test_capacity_eager_error_and_jit_drop():
  cache, _ = make("kivi2_r64")
  k, v = rand_kv(7)
  full = prefill(cache, k, v, jnp.array([S, S - 1, 10]))
  with pytest.raises(ValueError, match="past capacity"):
    append(full, k[:, :, :2], v[:, :, :2])
  # Under jit lengths saturate and stored tokens are untouched.
  after = jax.jit(append)(full, k[:, :, :2] + 100.0, v[:, :, :2] + 100.0)
  np.testing.assert_array_equal(np.asarray(after.lengths), [S, S, 12])
  k0, v0 = materialize(full)
  k1, v1 = materialize(after)
  np.testing.assert_array_equal(np.asarray(k1[0]), np.asarray(k0[0]))
  # (filling sequence 1 flushed keys 192..255 and slid value 191 out of the window)
  np.testing.assert_array_equal(np.asarray(k1[1, :, :192]), np.asarray(k0[1, :, :192]))
  np.testing.assert_array_equal(np.asarray(v1[1, :, : S - 65]), np.asarray(v0[1, :, : S - 65]))
  assert float(jnp.abs(v1[1, :, S - 1] - v[1, :, 0] - 100).max()) < 1.0  # the one that fit


def test_checked_append_raises_under_checkify():
  from jax.experimental import checkify
  cache, _ = make("fp8_e4m3")
  k, v = rand_kv(8, 4)
  full = prefill(cache, jnp.zeros((B, K, S, H)), jnp.zeros((B, K, S, H)))
  f = checkify.checkify(jax.jit(lambda c, a, b: append(c, a, b, checked=True)))
  err, _ = f(full, k, v)
  with pytest.raises(Exception, match="past capacity"):
    err.throw()


def test_decode_steps_do_not_recompile():
  cache, _ = make("kivi2_r64")
  traces = []

  @jax.jit
  def step(c, k, v, q):
    traces.append(1)
    c = append(c, k, v)
    return c, attention.decode_attention(q, c)

  k, v = rand_kv(9, 140)
  q = jnp.ones((B, 2 * K, 1, H))
  for t in range(140):  # crosses flushes at 64 and 128
    cache, _ = step(cache, k[:, :, t:t + 1], v[:, :, t:t + 1], q)
  assert len(traces) == 1
  assert step._cache_size() == 1


def test_stacked_cache_scan_equals_per_layer():
  fmt = formats.kivi(2, 32, 64)
  layers = 3
  ks = jax.random.normal(jax.random.PRNGKey(10), (layers, B, K, 70, H))
  vs = jax.random.normal(jax.random.PRNGKey(11), (layers, B, K, 70, H))
  stacked = init_cache(fmt, B, K, S, H, num_layers=layers)
  assert stacked.num_layers == layers
  stacked = append(stacked, ks, vs, jnp.array([70, 3, 66]))
  q = jnp.ones((B, 2 * K, 1, H))

  def body(carry, c):
    return carry, attention.decode_attention(q, c)

  _, outs = jax.lax.scan(body, None, stacked)
  for i in range(layers):
    single = append(init_cache(fmt, B, K, S, H), ks[i], vs[i], jnp.array([70, 3, 66]))
    assert trees_equal(stacked.layer(i), single)
    np.testing.assert_allclose(np.asarray(outs[i]), np.asarray(attention.decode_attention(q, single)),
                               rtol=1e-6, atol=1e-6)
  assert trees_equal(stack([stacked.layer(i) for i in range(layers)]), stacked)


def test_cache_is_a_pytree_for_jit_vmap_donation():
  cache, _ = make("int8")
  leaves, treedef = jax.tree_util.tree_flatten(cache)
  assert isinstance(jax.tree_util.tree_unflatten(treedef, leaves), KVCache)
  k, v = rand_kv(12, 1)
  donated = jax.jit(append, donate_argnums=0)(cache, k, v)
  assert int(donated.lengths[0]) == 1


def test_bad_inputs_name_the_argument():
  cache, _ = make("kivi2_r64")
  with pytest.raises(ValueError, match=r"k must have rank 4 \(\[B, K, T, H\]\)"):
    append(cache, jnp.zeros((B, K, H)), jnp.zeros((B, K, H)))
  with pytest.raises(ValueError, match=r"k must have shape \[B=3, K=2, T, H=64\]"):
    append(cache, jnp.zeros((B, 3, 1, H)), jnp.zeros((B, 3, 1, H)))
  with pytest.raises(TypeError, match="floating point"):
    append(cache, jnp.zeros((B, K, 1, H), jnp.int32), jnp.zeros((B, K, 1, H), jnp.int32))
  with pytest.raises(ValueError, match="num_new must have shape"):
    append(cache, jnp.zeros((B, K, 1, H)), jnp.zeros((B, K, 1, H)), jnp.array([1, 1]))
  with pytest.raises(ValueError, match=r"capacity \(100\) must be a multiple of the residual length R \(64\)"):
    init_cache(fmt_of("kivi2_r64"), 1, 1, 100, 64)
  with pytest.raises(ValueError, match=r"group_size \(128\) must divide head_dim \(64\)"):
    init_cache(formats.preset("kivi2_g128"), 1, 1, 256, 64)
  with pytest.raises(ValueError, match="batch must be a positive int"):
    init_cache(formats.bf16(), 0, 1, 256, 64)
  with pytest.raises(ValueError, match=r"static scale for granularity 'channel' must have shape \(1, 2, 1, 64\)"):
    init_cache(formats.preset("fp8_e4m3_static"), 1, 2, 256, 64, scales=(jnp.ones((2, 64)), None))
  with pytest.raises(ValueError, match="q must have rank 4"):
    attention.decode_attention(jnp.zeros((B, 4, H)), cache)
  with pytest.raises(ValueError, match=r"query heads \(3\) must be divisible by KV heads \(2\)"):
    attention.decode_attention(jnp.zeros((B, 3, 1, H)), cache)


@pytest.mark.parametrize("name", ["kivi2_sink", "int4_sink"])
def test_sink_tokens_stay_full_precision(name):
  base = formats.kivi(2, 32, 64, sink=4) if name == "kivi2_sink" else formats.KVFormat(
      name="int4_sink", key=formats.IntSpec(bits=4), value=formats.IntSpec(bits=4), sink=4)
  cache = init_cache(base, B, K, S, H)
  k, v = rand_kv(13, 150)
  full = prefill(cache, k, v, jnp.array([150, 3, 90]))
  inc = cache
  for t in range(150):
    inc = append(inc, k[:, :, t:t + 1], v[:, :, t:t + 1], (t < jnp.array([150, 3, 90])).astype(jnp.int32))
  assert trees_equal(full, inc)
  kh, vh = materialize(full)
  kb = np.asarray(k.astype(jnp.bfloat16).astype(jnp.float32))
  vb = np.asarray(v.astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(kh[0, :, :4]), kb[0, :, :4])
  np.testing.assert_array_equal(np.asarray(vh[0, :, :4]), vb[0, :, :4])
  np.testing.assert_array_equal(np.asarray(kh[1, :, :3]), kb[1, :, :3])
  # later tokens are still quantized
  assert np.abs(np.asarray(kh[0, :, 4:64]) - kb[0, :, 4:64]).max() > 1e-2
  with pytest.raises(ValueError, match="KVFormat.sink must be an int >= 0"):
    formats.kivi(2, 32, 64, sink=-1)
  # the kernels decline (dispatch then falls back to the reference)
  from kvjax import dispatch
  from pallas_kernels.tpu import plan as tpu_plan
  q = jnp.ones((B, 2 * K, 1, H))
  with pytest.raises(NotImplementedError, match="sink"):
    dispatch.decode_attention(q, full, implementation="pallas_gpu")
  with pytest.raises(NotImplementedError, match="sink"):
    tpu_plan.make_plan(q, full)


def test_sink_tokens_do_not_widen_kivi_key_groups():
  # An outlier first token (an attention sink in a real LLM) kept in bf16 must not set the
  # quantization range of the other tokens of its key group.
  fmt = formats.kivi(2, 32, 64, sink=2)
  k, v = rand_kv(14, 128)
  k = k.at[:, :, :2].multiply(100.0)
  full = prefill(init_cache(fmt, B, K, S, H), k, v, jnp.full((B,), 128))
  kh, _ = materialize(full)
  plain = prefill(init_cache(formats.kivi(2, 32, 64), B, K, S, H), k.at[:, :, :2].set(k[:, :, 2:3]),
                  v, jnp.full((B,), 128))
  kp, _ = materialize(plain)
  # tokens 2..31 (group 0) are quantized exactly as if the sink tokens were copies of token 2
  np.testing.assert_array_equal(np.asarray(kh[:, :, 2:]), np.asarray(kp[:, :, 2:]))
  err = np.abs(np.asarray(kh[:, :, 2:32]) - np.asarray(k[:, :, 2:32].astype(jnp.bfloat16), np.float32))
  span = np.ptp(np.asarray(k[:, :, 2:32], np.float32), axis=2, keepdims=True)
  assert (err <= span / 3 * 0.51 + 1e-2).all()  # half a 2-bit step of the group's own range


# ---- value-code layout (QArray.tile: the GPU default for FP8 / INT8 values) -------------------

@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e4m3_static", "int8"])
def test_tiled_values_hold_the_same_cache(name):
  """Tiled value codes: appends (prefill, ragged chunks, decode steps under jit, tokens dropped at
  capacity) give bit-identical attention inputs, and the codes are the tiles' transposes."""
  from kvjax import cache as cache_lib, quant
  fmt = formats.preset(name)
  scales = ((jnp.full((1, 2, 1, 32), 0.05), jnp.full((1, 2, 1, 1), 0.07)) if fmt.has_static_scales
            else None)  # static: per-channel keys, per-head values
  caches = [init_cache(fmt, 3, 2, 64, 32, scales=scales, value_tile=t) for t in (0, 16)]
  assert [c.v.tile for c in caches] == [0, 16] and caches[1].v.codes.shape == caches[0].v.codes.shape
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 40, 32))
  caches = [append(c, x, -x, jnp.asarray([40, 3, 0])) for c in caches]
  step = jax.jit(append)
  for t in range(30):  # the first sequence reaches capacity (64) and then drops under jit
    caches = [step(c, x[:, :, t:t + 1] * 2, x[:, :, t + 1:t + 2]) for c in caches]
  np.testing.assert_array_equal(np.asarray(caches[1].lengths), [64, 33, 30])
  for a, b in zip(materialize(caches[0]), materialize(caches[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  token_major, tiled = (np.asarray(c.v.codes.astype(jnp.float32)) for c in caches)
  np.testing.assert_array_equal(np.asarray(quant.tile_tokens(token_major, 16)), tiled)
  relaid = cache_lib.with_value_tile(caches[0], 16)
  assert relaid.v.tile == 16
  np.testing.assert_array_equal(np.asarray(relaid.v.codes.astype(jnp.float32)), tiled)
  back = cache_lib.with_value_tile(relaid, 0)
  np.testing.assert_array_equal(np.asarray(back.v.codes.astype(jnp.float32)), token_major)


def test_tiled_values_stack_and_scan():
  from kvjax import quant
  c = init_cache(formats.int8(), 2, 2, 32, 16, num_layers=3, value_tile=32)
  assert c.v.tile == 32 and c.v.codes.shape == (3, 2, 2, 32, 16)
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 2, 5, 16))
  c = append(c, x, x)
  k, v = materialize(c)
  np.testing.assert_allclose(np.asarray(v[:, :, :, :5]), np.asarray(x), rtol=0.01, atol=0.02)
  with pytest.raises(ValueError, match=r"tile \(5\) must be a positive divisor of the token axis"):
    quant.tile_tokens(jnp.zeros((4, 8)), 5)


def test_kivi_append_rounds_to_the_residual_dtype_under_jit():
  """KIVI quantizes exactly the bf16 values its residual stores, jitted or not: the rounding is a
  `reduce_precision`, which XLA GPU keeps (it elides a bf16 convert round trip under jit; on the
  H200 the jitted append quantized the f32 values, session 8)."""
  from kvjax.cache import _round_to
  c = init_cache(formats.preset("kivi2"), 2, 2, 256, 32)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 3, 32)) * 3
  hlo = jax.jit(append).lower(c, x, -x).as_text()
  assert hlo.count("reduce_precision") == 2  # keys and values
  for dt in ("bfloat16", "float16"):
    got = np.asarray(jax.jit(lambda a: _round_to(a, dt).astype(jnp.float32))(x))
    np.testing.assert_array_equal(got, np.asarray(x.astype(dt).astype(jnp.float32)))
  for a, b in zip(jax.tree_util.tree_leaves(jax.jit(append)(c, x, -x)),
                  jax.tree_util.tree_leaves(append(c, x.astype(jnp.bfloat16), -x.astype(jnp.bfloat16)))):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
