"""The "words" KIVI-2 code layout (`QArray.layout`, the Mosaic GPU kernel's): packing round trips,
quantize / dequantize equal to the planar layout, a cache in either layout holding the same tokens
bit for bit through prefill, ragged and decode appends (over stale bits), the defaults per backend,
the one-kernel writer, the implementations that decline it, and bad inputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvjax import cache as kvcache, dispatch, formats, packing, quant
from kvjax.formats import KIVISpec
from pallas_kernels.gpu import mosaic_decode, ops, write

H = 128


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(0, 2 ** 31 - 1))
def test_pack_words_round_trip_and_bit_layout(blocks, seed):
  codes = np.random.default_rng(seed).integers(0, 4, (3, 128 * blocks)).astype(np.uint8)
  words = np.asarray(packing.pack_words(jnp.asarray(codes)))
  assert words.dtype == np.uint16 and words.shape == (3, 16 * blocks)
  np.testing.assert_array_equal(np.asarray(packing.unpack_words(jnp.asarray(words))), codes)
  blk, j, m = blocks - 1, 5, 6  # word j of a block holds element j + 16 m at bits 2m
  assert (words[1, 16 * blk + j] >> (2 * m)) & 3 == codes[1, 128 * blk + j + 16 * m]


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 3), st.integers(0, 2 ** 31 - 1))
def test_pack_words_4bit_round_trip_and_bit_layout(blocks, seed):
  codes = np.random.default_rng(seed).integers(0, 16, (3, 64 * blocks)).astype(np.uint8)
  words = np.asarray(packing.pack_words(jnp.asarray(codes), 4))
  assert words.dtype == np.uint16 and words.shape == (3, 16 * blocks)
  np.testing.assert_array_equal(np.asarray(packing.unpack_words(jnp.asarray(words), 4)), codes)
  blk, j, m = blocks - 1, 9, 3  # word j of a 64-code block holds element j + 16 m at bits 4m
  assert (words[2, 16 * blk + j] >> (4 * m)) & 15 == codes[2, 64 * blk + j + 16 * m]
  with pytest.raises(ValueError, match="2- or 4-bit codes, got bits=3"):
    packing.pack_words(jnp.asarray(codes), 3)


def test_pack_words_rejects_partial_blocks():
  with pytest.raises(ValueError, match=r"last axis \(100\) must be a multiple of 128"):
    packing.pack_words(jnp.zeros((2, 100), jnp.uint8))
  with pytest.raises(ValueError, match=r"last axis \(10\) must be a multiple of 16"):
    packing.unpack_words(jnp.zeros((2, 10), jnp.uint16))


@pytest.mark.parametrize("bits,group", [(2, 128), (2, 32), (4, 32)])
@pytest.mark.parametrize("axis", ["token", "channel"])
def test_quantize_words_dequantizes_as_planar(axis, bits, group):
  x = jax.random.normal(jax.random.key(1), (2, 3, 256, H)) * 3
  spec = KIVISpec(bits=bits, group_size=group, axis=axis)
  planar, words = quant.quantize(x, spec), quant.quantize(x, spec, layout="words")
  assert words.codes.shape == (2, 3, 256, 8 * bits) and words.shape == x.shape and words.layout == "words"
  np.testing.assert_array_equal(np.asarray(quant.unpacked_codes(words)), np.asarray(quant.unpacked_codes(planar)))
  np.testing.assert_array_equal(np.asarray(quant.dequantize(words)), np.asarray(quant.dequantize(planar)))


def test_quantize_words_rejects_formats_it_cannot_hold():
  x = jnp.ones((1, 256, H))
  with pytest.raises(ValueError, match=r"group_size in \(128, 32\)"):
    quant.quantize(x, KIVISpec(bits=2, group_size=64), layout="words")
  with pytest.raises(ValueError, match=r"bits in \(2, 4\) and group_size in \(128, 32\), got .*group_size=16"):
    quant.quantize(x, KIVISpec(bits=4, group_size=16), layout="words")
  with pytest.raises(ValueError, match="head_dim that is a multiple of 128, got 64"):
    quant.quantize(jnp.ones((1, 256, 64)), KIVISpec(bits=2, group_size=128), layout="words")
  with pytest.raises(ValueError, match="layout must be '' or 'words'"):
    quant.quantize(x, KIVISpec(bits=2, group_size=128), layout="tiles")
  with pytest.raises(ValueError, match="KIVI only"):
    quant.quantize(x, formats.preset("int8").key, layout="words")


def _pair(b, s, kv_heads=2, stale=True, fmt="kivi2_g128", head_dim=H):
  fmt = formats.preset(fmt)
  planar = kvcache.init_cache(fmt, b, kv_heads, s, head_dim, kivi_layout="")
  words = kvcache.init_cache(fmt, b, kv_heads, s, head_dim, kivi_layout="words")
  if stale:  # a reused buffer: appends must replace the bits they own, not OR into them
    bits = lambda a: jax.random.bits(jax.random.key(a.size), a.shape, jnp.uint16)
    words = words.replace(k=words.k.replace(codes=bits(words.k.codes)), v=words.v.replace(codes=bits(words.v.codes)))
  return planar, words


def _same_tokens(a, b):
  ka, va = kvcache.materialize(a)
  kb, vb = kvcache.materialize(b)
  for i, n in enumerate(np.asarray(a.lengths)):
    np.testing.assert_array_equal(np.asarray(ka[i, :, :n]), np.asarray(kb[i, :, :n]))
    np.testing.assert_array_equal(np.asarray(va[i, :, :n]), np.asarray(vb[i, :, :n]))


@pytest.mark.parametrize("fmt,h", [("kivi2_g128", H), ("kivi2", H), ("kivi4", H), ("kivi2_g128", 256), ("kivi4", 256)])
def test_cache_in_words_layout_holds_the_same_tokens(fmt, h):
  """XLA's scatters into "words" (keys' rows of h bits / 16 words, values' 128-token tiles of h channel rows) ==
  the planar cache, token for token; head_dim 256 (Gemma 2) too."""
  rng = np.random.default_rng(0)
  planar, words = _pair(3, 512, fmt=fmt, head_dim=h)
  bits = words.fmt.key.bits
  assert words.k.codes.shape == (3, 2, 512, h * bits // 16) and words.capacity == 512 and words.head_dim == h
  # prefill (ragged, one empty), a chunk crossing tile and group boundaries, decode steps, a long append
  for t, num in ((200, [200, 3, 0]), (1, None), (140, [40, 17, 128]), (1, None), (1, None), (130, [10, 130, 64])):
    kv = [jnp.asarray(rng.standard_normal((3, 2, t, h)), jnp.float32) for _ in range(2)]
    num = None if num is None else jnp.asarray(num)
    planar, words = kvcache.append(planar, *kv, num), kvcache.append(words, *kv, num)
    _same_tokens(planar, words)
  assert np.asarray(words.lengths).tolist() == [253, 153, 195]


# 2-bit only: interpreted, the stacked writer takes ~2 min and GBs a case (the 4-bit words writer: the
# "+words" key flush and shared-words tests in test_gpu_kernels.py)
@pytest.mark.parametrize("fmt", [formats.preset(n) for n in ("kivi2_g128", "kivi2")], ids=["kivi2_g128", "kivi2"])
def test_jitted_stacked_append_in_words_layout(fmt):
  rng = np.random.default_rng(1)
  kw = dict(num_layers=2)
  planar = kvcache.init_cache(fmt, 2, 1, 256, H, kivi_layout="", **kw)
  words = kvcache.init_cache(fmt, 2, 1, 256, H, kivi_layout="words", **kw)
  step = jax.jit(kvcache.append, donate_argnums=0)
  # the one-kernel writer, vmapped over the layers (values quantized and the key block flushed in it)
  pallas = jax.jit(lambda c, k, v: kvcache.append(c, k, v, write_rows=functools.partial(write.write_rows, interpret=True)))
  words2 = jax.tree_util.tree_map(jnp.copy, words)  # `step` donates words
  for t in (127, 1, 1):
    kv = [jnp.asarray(rng.standard_normal((2, 2, 1, t, H)), jnp.float32) for _ in range(2)]
    planar, words, words2 = kvcache.append(planar, *kv), step(words, *kv), pallas(words2, *kv)
  for i in range(2):
    _same_tokens(planar.layer(i), words.layer(i))
  for a, b in zip(jax.tree_util.tree_leaves(words), jax.tree_util.tree_leaves(words2), strict=True):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_default_layout_per_backend_and_format():
  f = formats.preset("kivi2_g128")
  assert kvcache.default_kivi_layout(f, 1024, 128, backend="gpu") == "words"
  assert kvcache.default_kivi_layout(f, 1024, 128, backend="cpu") == ""
  assert kvcache.default_kivi_layout(f, 1024, 256, backend="gpu") == "words"  # Gemma's head_dim, G=128 (session 28)
  assert kvcache.default_kivi_layout(formats.preset("kivi2"), 1024, 256, backend="gpu") == "words"  # G=32 there too
  assert kvcache.default_kivi_layout(formats.preset("kivi2"), 1024, 64, backend="gpu") == ""
  assert kvcache.default_kivi_layout(formats.preset("kivi2"), 1024, 128, backend="gpu") == "words"  # G=32
  assert kvcache.default_kivi_layout(formats.preset("kivi4"), 1024, 128, backend="gpu") == "words"
  assert kvcache.default_kivi_layout(formats.preset("kivi4"), 1024, 128, backend="cpu") == ""
  assert kvcache.init_cache(formats.preset("kivi2"), 1, 1, 256, H, kivi_layout="words").k.layout == "words"
  assert kvcache.default_kivi_layout(formats.preset("fp8_e4m3"), 1024, 128, backend="gpu") == ""
  assert kvcache.init_cache(f, 1, 1, 256, 128).k.layout == ("words" if jax.default_backend() == "gpu" else "")


def test_init_cache_rejects_bad_layouts():
  with pytest.raises(ValueError, match="kivi_layout must be '' \\(planar\\) or 'words', got 'tiles'"):
    kvcache.init_cache(formats.preset("kivi2_g128"), 1, 1, 256, H, kivi_layout="tiles")
  with pytest.raises(ValueError, match=r"kivi_layout='words' keys: needs KIVI with bits in \(2, 4\) and group_size"):
    kvcache.init_cache(formats.kivi(4, 64, 128), 1, 1, 256, H, kivi_layout="words")
  with pytest.raises(ValueError, match="kivi_layout='words' format 'int8' is not KIVI"):
    kvcache.init_cache(formats.preset("int8"), 1, 1, 256, H, kivi_layout="words")
  with pytest.raises(ValueError, match="head_dim that is a multiple of 128, got 96"):
    kvcache.init_cache(formats.preset("kivi2"), 1, 1, 256, 96, kivi_layout="words")


def test_writers_and_kernels_that_decline_fall_back(monkeypatch):
  _, words = _pair(2, 256, kv_heads=1, stale=False)
  kv = jnp.ones((2, 1, 3, H))
  out = dispatch.append(words, kv, kv, implementation="pallas_gpu")  # the one-kernel writer takes "words"
  _same_tokens(kvcache.append(words, kv, kv), out)
  q = jnp.ones((2, 4, 5, H))  # 4 heads x 5 tokens = 20 query rows: over the Mosaic kernel's 16
  with pytest.raises(NotImplementedError, match=r"at most 16 query rows .* got q \(2, 4, 5, 128\)"):
    ops.decode_attention(q, out)
  with pytest.raises(NotImplementedError, match="tune the Triton kernels"):
    ops.decode_attention(q[:, :, :1], out, block=64)
  with pytest.raises(NotImplementedError, match="soft-cap or sliding window with the residual window in the kernel"):
    ops.decode_attention(q[:, :, :1], out, logit_softcap=30.0, pallas_merge=False)  # the window in XLA: declined
  _, words4 = _pair(2, 256, kv_heads=1, stale=False, fmt="kivi4")
  kv20 = jnp.ones((2, 1, 20, H))  # compiled: at most 16 tokens an append into 4-bit words
  with pytest.raises(NotImplementedError, match=r"more than 16 tokens into 4-bit 'words' natively"):
    write.append(words4, kv20, kv20, interpret=False)
  monkeypatch.setattr(write, "NATIVE_WORDS_BITS", (2,))  # a width held back natively: refused
  with pytest.raises(NotImplementedError, match=r"'words' codes of 4 bits natively"):
    write.write_rows(words4, [], interpret=False)
  _, wide = _pair(2, 256, kv_heads=1, stale=False, fmt="kivi2", head_dim=256)
  assert write.write_rows(wide, [], interpret=False) is wide  # G=32 at head_dim 256, batch 2: compiled natively
  monkeypatch.setattr(write, "NATIVE_WIDE_WORDS_GROUPS", {128: None, 32: 1})  # past its largest batch: refused
  with pytest.raises(NotImplementedError, match=r"head_dim 256 at G=32, batch 2 natively \(NATIVE_WIDE_WORDS_GROUPS"):
    write.write_rows(wide, [], interpret=False)
  monkeypatch.setattr(write, "NATIVE_WIDE_WORDS_GROUPS", {128: None})  # a group held back natively: refused
  with pytest.raises(NotImplementedError, match=r"head_dim 256 at G=32, batch 2 natively"):
    write.write_rows(wide, [], interpret=False)
  ref = dispatch.decode_attention(q, out, implementation="xla")
  np.testing.assert_array_equal(np.asarray(dispatch.decode_attention(q, out, implementation=("pallas_gpu", "xla"))),
                                np.asarray(ref))


def test_default_splits():
  assert mosaic_decode.default_splits(8, 8, 256) == 8     # B=8, 32k: 512 programs
  assert mosaic_decode.default_splits(1, 8, 256) == 32    # B=1, 32k: capped at the most timed
  assert mosaic_decode.default_splits(64, 8, 256) == 8     # B=64, 32k: 8 splits of 32 tiles (session 26)
  assert mosaic_decode.default_splits(69, 8, 256) == 8     # issue 7's KIVI-2 G=128 batch: 809.0 us against 1089.6
  assert mosaic_decode.default_splits(52, 8, 1024) == 8    # B=52, 128k: no more than LARGE_BATCH_SPLITS
  assert mosaic_decode.default_splits(64, 8, 128) == 4     # 16k: splits of at least 32 tiles
  assert mosaic_decode.default_splits(64, 8, 32) == 1      # 4k: one split, as before
  assert mosaic_decode.default_splits(465, 8, 32) == 1     # issue 7's 4k batch
  assert mosaic_decode.default_splits(32, 8, 256) == 2     # 256 pairs: target / pairs = 2, unchanged
  assert mosaic_decode.default_splits(64, 8, 256, large_batch=False) == 1
  assert mosaic_decode.default_splits(8, 8, 12, min_tiles=1) == 4  # the largest power of two dividing the tiles
  assert mosaic_decode.default_splits(8, 8, 12) == 2      # ... leaving each split 4 tiles or more (session 17)
  assert mosaic_decode.default_splits(8, 8, 5) == 1
  assert mosaic_decode.default_splits(8, 8, 8) == 2       # B=8 1k: 2 splits of 4 tiles, not 8 of 1
  assert mosaic_decode.default_splits(1, 8, 32) == 8      # B=1 4k
  assert mosaic_decode.default_splits(1, 8, 3) == 1
  assert mosaic_decode.default_splits(1, 8, 256, tiles_per_step=2) == 32
  assert mosaic_decode.default_splits(1, 8, 32, tiles_per_step=2) == 8
  assert mosaic_decode.default_splits(1, 8, 32, tiles_per_step=2, min_tiles=1) == 16


def test_module_decodes_a_words_cache_through_the_mosaic_kernel(monkeypatch):
  """The GPU default (a "words" cache, `ops` -> Mosaic) forced on CPU: a KVAttention prefill (XLA:
  several query tokens) then a decode step (the interpreted Mosaic kernel) equal the XLA path."""
  from flax import nnx
  from kvjax.module import KVAttention
  monkeypatch.setattr(kvcache, "default_kivi_layout", lambda *a, **k: "words")
  attn = KVAttention(features=64, num_heads=4, num_kv_heads=1, head_dim=H, fmt=formats.preset("kivi2_g128"),
                     rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(2), (2, 140, 64))
  cache = attn.new_cache(2, 256)
  assert cache.k.layout == cache.v.layout == "words"
  cache, _ = attn(x[:, :139], None, cache, num_new=jnp.asarray([139, 60]))
  # "pallas_gpu" alone (no fallback): a decline would raise, so the kernel served this step
  (_, got), (_, want) = [attn(x[:, 139:], None, cache, implementation=impl) for impl in ("pallas_gpu", "xla")]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("fmt", ["kivi2_g128", "kivi2", "kivi4"])
def test_with_kivi_layout_round_trips(fmt):
  """`cache.with_kivi_layout`: planar -> "words" holds the same tokens as a cache filled in "words", and
  back gives the planar codes bit for bit; non-KIVI formats and layouts it cannot hold are refused."""
  rng = np.random.default_rng(3)
  planar, words = _pair(2, 256, stale=False, fmt=fmt)
  kv = [jnp.asarray(rng.standard_normal((2, 2, 150, H)), jnp.float32) for _ in range(2)]
  planar, words = kvcache.append(planar, *kv, jnp.asarray([150, 33])), kvcache.append(words, *kv, jnp.asarray([150, 33]))
  relaid = kvcache.with_kivi_layout(planar, "words")
  assert relaid.k.layout == relaid.v.layout == "words"
  for a, b in zip(jax.tree_util.tree_leaves(relaid), jax.tree_util.tree_leaves(words), strict=True):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
  back = kvcache.with_kivi_layout(relaid, "")
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(planar), strict=True):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
  assert kvcache.with_kivi_layout(words, "words") is not None
  with pytest.raises(ValueError, match="kivi_layout='words' format 'int8' is not KIVI"):
    kvcache.with_kivi_layout(kvcache.init_cache(formats.preset("int8"), 1, 1, 256, H), "words")
  with pytest.raises(ValueError, match="group_size in"):
    kvcache.with_kivi_layout(kvcache.init_cache(formats.kivi(2, 64, 128), 1, 1, 256, H), "words")
