"""`pallas_kernels.gpu.mosaic_decode`: the Mosaic KIVI-2 kernel over a real `kvjax` cache (built by
`prefill` and `append`, so the library's quantization, packing and residual window) equals
`kvjax.attention.decode_attention` in Mosaic GPU's CPU interpreter: ragged lengths, an empty sequence,
lengths below, at and past the residual, a window that straddles a quantized key group; caches in the
planar layout (converted per call) and in the "words" layout (read as stored, dispatched by `ops`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import attention, cache as kvcache, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import mosaic_decode as md, mosaic_kivi as mk, ops


def _cache(lengths, capacity=512, kv_heads=1, appends=0, seed=0, layout="", fmt="kivi2_g128", head_dim=128):
  fmt = formats.preset(fmt) if isinstance(fmt, str) else fmt
  rng = np.random.default_rng(seed)
  b, h = len(lengths), head_dim
  c = kvcache.init_cache(fmt, b, kv_heads, capacity, h, kivi_layout=layout)
  t = max(max(lengths), 1)
  kv = lambda: jnp.asarray(rng.normal(size=(b, kv_heads, t, h)) + rng.normal(size=(1, kv_heads, 1, h)), jnp.float32)
  c = kvcache.prefill(c, kv(), kv(), jnp.asarray(lengths, jnp.int32))
  for _ in range(appends):  # decode steps: the residual fills and flushes one token at a time
    one = lambda: jnp.asarray(rng.normal(size=(b, kv_heads, 1, h)), jnp.float32)
    c = kvcache.append(c, one(), one())
  return c


@pytest.mark.parametrize("lengths,appends,splits,layout,via_ops,t", [
    ((300, 0), 0, 2, "", False, 1),       # ragged; an empty sequence; planar codes (repacked)
    ((127, 128), 1, 4, "words", True, 1),  # below / at the residual, then one more token (a key group
                                           # flushes at 128); the kernel's layout, through ops
    ((385, 200, 509), 3, None, "words", False, 1),  # the window straddles the last quantized key group;
                                                    # a full cache; default splits
    ((300, 2), 0, 2, "words", True, 4),   # 4 query tokens (speculative verify): 16 rows, causal among
                                          # them; a sequence shorter than the queries
])
def test_matches_the_library_reference(lengths, appends, splits, layout, via_ops, t):
  c = _cache(lengths, appends=appends, layout=layout)
  q = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), 4, t, 128)), jnp.float32)
  if via_ops:
    out = ops.decode_attention(q, c, num_splits=splits, interpret=True)
  else:
    out = md.decode_attention(q, c, num_splits=splits, interpret=True,
                              variant="folded_lazy" if layout == "" else md.DEFAULT_VARIANT)
  ref = attention.decode_attention(q, c)
  # query token i sits at L - T + i: it sees nothing where that is negative
  visible = np.broadcast_to((np.asarray(c.lengths)[:, None] - t + np.arange(t) >= 0)[:, None, :, None], out.shape)
  assert test_base.relative_error(np.asarray(out)[visible], np.asarray(ref)[visible]) < 1e-3  # measured 3e-6 to 7e-5
  np.testing.assert_array_equal(np.asarray(out)[~visible], 0.0)


INTERPRET = jax.default_backend() != "gpu"  # natively on a GPU (benchmarks/runs/session15_b.sh)


@pytest.mark.parametrize("fmt,lengths,appends,t,window,extra", [
    ("kivi2_g128", (385, 200, 0), 3, 1, "kernel", {}),      # ragged, empty; the window straddles a key group
    ("kivi2_g128", (300, 2), 0, 2, "xla", {}),              # the window in XLA; 2 query tokens
    ("kivi2_g128", (509, 260), 1, 1, "kernel", dict(logit_softcap=20.0, sliding_window=150)),  # Gemma 2's options
    (formats.kivi(4, 128, 128), (509, 130), 0, 1, "kernel", {}),  # 4-bit codes: 4 key word tiles a row
    ("kivi2_g128", (300, 129), 2, 1, "ops", {}),            # through ops, its default window
    ("kivi2", (385, 200, 0), 3, 1, "kernel", {}),           # G=32: keys' [4, 256] scale windows, values' 8 groups
    ("kivi4", (509, 130), 1, 2, "kernel", dict(logit_softcap=20.0, sliding_window=150)),  # 4-bit G=32, Gemma's options
])
def test_head_dim_256(fmt, lengths, appends, t, window, extra):  # noqa: PLR0913
  """Gemma 2's head_dim 256: 16 key k-slabs a tile, two 128-channel value accumulators, G=128 value scales per
  token and half (made half-major once a tile, `mosaic_groups.split_halves`), G=32 scales regrouped per half
  (`mosaic_groups.regroup` windows), the window's ring in 4 parts: == the library reference on a "words" cache."""
  c = _cache(lengths, appends=appends, layout="words", fmt=fmt, head_dim=256)
  assert c.v.scale.shape[-1] == 256 // c.fmt.value.group_size and md.supports(c) is None
  q = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), 4, t, 256)), jnp.bfloat16)
  if window == "ops":
    out = ops.decode_attention(q, c, num_splits=2, interpret=INTERPRET)
  else:
    out = md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, window=window, **extra)
  kw = {"logit_softcap": extra.get("logit_softcap"), "window": extra.get("sliding_window")}
  out = np.asarray(out, np.float32)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c, **kw))
  visible = np.broadcast_to((np.asarray(c.lengths)[:, None] - t + np.arange(t) >= 0)[:, None, :, None], out.shape)
  assert test_base.relative_error(out[visible], ref[visible]) < 5e-3  # bf16 output
  np.testing.assert_array_equal(out[~visible], 0.0)
  if extra:
    plain = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
    assert test_base.relative_error(plain[visible], ref[visible]) > 2e-2


def test_head_dim_256_refusals():
  """Head_dim 192 is refused; the window 'pallas' takes 128 channels."""
  assert md.supports(_cache((10,), fmt=formats.kivi(2, 32, 128), head_dim=192)).startswith("head_dim must be in")
  assert kvcache.default_kivi_layout(formats.preset("kivi2_g128"), 512, 256, backend="gpu") == "words"
  c = _cache((10,), layout="words", head_dim=256)
  with pytest.raises(ValueError, match="head_dim 256 cache takes 'kernel' or 'xla'"):
    md.decode_attention(jnp.zeros((1, 4, 1, 256), jnp.bfloat16), c, interpret=True, window="pallas")


def _words_case_matches(fmt, lengths, appends, t, window, via_ops, glue=None):  # noqa: PLR0913
  """A "words" cache of `fmt` through ops (via_ops) or `mosaic_decode` (window, glue_in_kernel=glue): == the
  library reference at bf16 level, zero where a query token sees nothing. Returns (cache, q, ref, visible)."""
  c = _cache(lengths, appends=appends, layout="words", fmt=fmt)
  q = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), 4, t, 128)), jnp.bfloat16)
  if via_ops:
    out = ops.decode_attention(q, c, num_splits=2, interpret=INTERPRET)
  else:
    out = md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, window=window, glue_in_kernel=glue)
  out = np.asarray(out, np.float32)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
  visible = np.broadcast_to((np.asarray(c.lengths)[:, None] - t + np.arange(t) >= 0)[:, None, :, None], out.shape)
  assert test_base.relative_error(out[visible], ref[visible]) < 5e-3  # bf16 output
  np.testing.assert_array_equal(out[~visible], 0.0)
  return c, q, ref, visible


@pytest.mark.parametrize("lengths,appends,t,window,via_ops", [
    ((300, 0, 1, 128), 0, 1, "kernel", True),  # short windows; empty; one token; exactly 128; through ops
    ((127, 385, 509), 1, 1, "kernel", False),  # the window straddles a quantized key group of 4 scale groups
    ((300, 2), 0, 4, "kernel", False),         # 4 query tokens, causal among them
    ((385, 200, 509), 3, 1, "xla", False),     # the window's keys dequantized in XLA
])
def test_g32_cache_matches_the_library_reference(lengths, appends, t, window, via_ops):
  """KIVI-2 G=32 ("kivi2", a "words" cache): scales per 32-token key group and 32-channel value group
  (`mosaic_groups`), GROUPED_VARIANT == the library reference; and a G=128 reading of the same codes
  (its first group's scales for all four) differs, so the test sees the groups."""
  c, q, ref, visible = _words_case_matches("kivi2", lengths, appends, t, window, via_ops)
  coarse = c.replace(k=c.k.replace(scale=jnp.repeat(c.k.scale[:, :, ::4], 4, axis=2)))
  wrong = np.asarray(attention.decode_attention(q.astype(jnp.float32), coarse))
  assert test_base.relative_error(wrong[visible], ref[visible]) > 2e-2


def test_g32_refuses_what_it_cannot_do():
  c = _cache((300,), layout="words", fmt="kivi2")
  q = jnp.zeros((1, 4, 1, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="window 'pallas'"):
    md.decode_attention(q, c, window="pallas", interpret=True)
  assert md.supports(_cache((3,), fmt="kivi4")) is None  # KIVI-4, planar: repacked per call
  mixed = dataclasses.replace(formats.preset("kivi2"), value=formats.KIVISpec(bits=4, group_size=32, axis="channel"))
  assert "keys and values must both be KIVI with bits in (2, 4)" in md.supports(kvcache.init_cache(mixed, 1, 1, 256, 128))
  assert "group sizes must be equal and in (128, 32)" in md.supports(
      kvcache.init_cache(formats.kivi(2, 64, 128), 1, 1, 256, 128))
  with pytest.raises(ValueError, match="needs a dequant_in_a variant"):
    md.decode_attention(q, c, variant="folded_lazy", window="xla", interpret=True)


@pytest.mark.parametrize("lengths,appends,t", [
    ((300, 0, 1, 128), 0, 1),  # a window of fewer than 128 tokens; empty; one token; exactly 128
    ((127, 385, 509), 1, 1),   # the window straddles a quantized key group (slots from both sources)
    ((300, 2), 0, 4),          # 4 query tokens, causal among them; a sequence shorter than the queries
])
def test_window_in_the_kernel(lengths, appends, t):
  """window="kernel": the residual window as program NS of the Mosaic kernel (keys straight from global
  memory into the A registers, values through shared memory as a transposed A, bf16 probabilities)
  == the library reference, and == the Pallas window kernel's result."""
  c = _cache(lengths, appends=appends, layout="words")
  q = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), 4, t, 128)), jnp.bfloat16)
  out = np.asarray(md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, window="kernel"), np.float32)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
  visible = np.broadcast_to((np.asarray(c.lengths)[:, None] - t + np.arange(t) >= 0)[:, None, :, None], out.shape)
  assert test_base.relative_error(out[visible], ref[visible]) < 5e-3  # bf16 output; interpreted 1.5-2.2e-4 in f32
  np.testing.assert_array_equal(out[~visible], 0.0)
  other = np.asarray(md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, window="xla"), np.float32)
  assert test_base.relative_error(out[visible], other[visible]) < 5e-3
  # the query's scale / pad and the quantized lengths in the kernel (no XLA op before it): the same numbers
  glue = md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, window="kernel", glue_in_kernel=True)
  np.testing.assert_array_equal(np.asarray(glue, np.float32), out)
  # and the merge as one Triton kernel (`merge.merge_states` over the states' o^T)
  merged = md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, window="kernel", pallas_merge=True)
  assert merged.dtype == q.dtype and test_base.relative_error(np.asarray(merged, np.float32), out) < 1e-2
  with pytest.raises(ValueError, match="window must be one of"):
    md.decode_attention(q, c, window="triton")


@pytest.mark.parametrize("fmt,head_dim,t,softcap,sliding", [
    ("kivi2_g128", 128, 1, None, None),  # Llama-3-8B's rows (4 heads x 1 token)
    ("kivi2_g128", 128, 2, 2.0, 200),    # 8 rows (the most N = 8 takes), soft-cap and sliding window
    ("kivi2", 256, 1, None, None),       # G=32 at head_dim 256 (two value halves)
    ("kivi4", 128, 1, None, None),       # 4-bit codes
])
def test_narrow_mma_matches_the_16_column_products(fmt, head_dim, t, softcap, sliding):
  """`Options.narrow_mma` (the products at WGMMA's N = 8, the query and probabilities K-major, the window
  program's own fp16 query, its ring keys in 32-channel parts) == the same build at N = 16, and == the
  library reference, over the default call path (window and query preparation in the kernel)."""
  c = _cache((509, 300, 1, 128), appends=1, layout="words", fmt=fmt, head_dim=head_dim)
  q = jnp.asarray(np.random.default_rng(3).normal(size=(4, 4, t, head_dim)), jnp.bfloat16)
  base = mk.VARIANTS[md.FP16_VARIANT if fmt == "kivi2_g128" and head_dim == 128 else md.GROUPED_VARIANT]
  run = lambda opt: np.asarray(md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, variant=opt,
                                                   window="kernel", glue_in_kernel=True, logit_softcap=softcap,
                                                   sliding_window=sliding), np.float32)
  wide, narrow = run(base), run(dataclasses.replace(base, narrow_mma=True))
  assert test_base.relative_error(narrow, wide) < 2e-3  # bf16 outputs of the same arithmetic
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c, logit_softcap=softcap, window=sliding))
  assert test_base.relative_error(narrow, ref) < 5e-3
  with pytest.raises(ValueError, match="narrow_mma needs narrow_softmax"):
    dataclasses.replace(base, narrow_mma=True, narrow_softmax=False)


@pytest.mark.parametrize("variant", ["dequant_fp8", "dequant_fp8x", "dequant_fp8xp"])
@pytest.mark.parametrize("lengths,t,softcap,sliding", [
    ((509, 300, 1, 128), 1, None, None),  # Llama-3-8B's rows (4 heads x 1 token); one and 128 tokens
    ((509, 300, 0, 260), 2, 2.0, 200),    # 8 rows, soft-cap, sliding window; an empty sequence
])
def test_fp8_mma_matches_the_reference(lengths, t, softcap, sliding, variant):
  """`Options.fp8_mma` (both products as e4m3 WGMMAs on the code bytes, B built each tile as hi + lo words,
  the zeros' terms summed) == the library reference as closely as the fp16 build is (bf16-level B), over the
  default call path (window and query preparation in the kernel). Natively on a GPU, else interpreted.
  "dequant_fp8x": with its cross-warp reductions split around the step's barriers (`Options.xwarp_split`)."""
  c = _cache(lengths, appends=1, layout="words", fmt="kivi2_g128")
  q = jnp.asarray(np.random.default_rng(5).normal(size=(len(lengths), 4, t, 128)), jnp.bfloat16)
  run = lambda v: np.asarray(md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, variant=v, window="kernel",
                                                 glue_in_kernel=True, logit_softcap=softcap, sliding_window=sliding),
                             np.float32)
  fp8, base = run(variant), run(md.FP16_VARIANT)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c, logit_softcap=softcap, window=sliding))
  assert test_base.relative_error(fp8, ref) < 4e-3
  assert test_base.relative_error(fp8, base) < 3e-3
  assert np.all(np.isfinite(fp8))


def test_fp8_mma_applies_where_it_can_else_the_fp16_step():
  """More than 8 query rows, or G=32: the fp16 step, bit for bit the default's; the options are validated."""
  with pytest.raises(ValueError, match="fp8_mma needs dequant_in_a and narrow_softmax"):
    dataclasses.replace(mk.VARIANTS["dequant_fp8"], narrow_softmax=False)
  with pytest.raises(ValueError, match="fp8_mma needs dequant_in_a"):
    dataclasses.replace(mk.VARIANTS["dequant_fp8"], narrow_mma=True)
  with pytest.raises(ValueError, match="xwarp_split needs fp8_mma and manual_barriers"):
    dataclasses.replace(mk.VARIANTS["dequant_fp8x"], manual_barriers=False)
  with pytest.raises(ValueError, match="xwarp_split needs fp8_mma"):
    dataclasses.replace(mk.VARIANTS[md.FP16_VARIANT], xwarp_split=True)
  with pytest.raises(ValueError, match="ptx_words needs fp8_mma"):
    dataclasses.replace(mk.VARIANTS[md.FP16_VARIANT], ptx_words=True)
  q = jnp.asarray(np.random.default_rng(2).normal(size=(1, 4, 3, 128)), jnp.bfloat16)  # 12 rows
  for fmt, rows in (("kivi2_g128", 3), ("kivi2", 1)):
    c = _cache((200,), appends=0, layout="words", fmt=fmt)
    run = lambda v, c=c, rows=rows: np.asarray(md.decode_attention(q[:, :, :rows], c, num_splits=1, interpret=True,
                                                                   variant=v, window="kernel", glue_in_kernel=True))
    np.testing.assert_array_equal(run("dequant_fp8"), run("dequant_denorm_s32_mb"))
    np.testing.assert_array_equal(run("dequant_fp8x"), run("dequant_denorm_s32_mb"))


@pytest.mark.parametrize("fmt,lengths,appends,t,softcap,sliding,via_ops", [
    ("kivi2_g128", (509, 300, 0, 1), 1, 1, 2.0, None, False),  # a cap that bites; empty; one token
    ("kivi2_g128", (509, 300, 130), 0, 1, None, 200, False),  # W=200: the first visible tile past 2 of 4 (skipped)
    ("kivi2_g128", (509, 90), 1, 4, 3.0, 100, True),           # W < the ring: every quantized tile masked;
                                                               # 4 query tokens, each its own window; via ops
    ("kivi2", (509, 260), 0, 1, 2.0, 150, False),              # G=32
    ("kivi4", (509, 260), 0, 2, 2.0, 150, False),              # 4-bit codes, 2 query tokens
])
def test_softcap_and_sliding_window_in_the_kernel(fmt, lengths, appends, t, softcap, sliding, via_ops):  # noqa: PLR0913
  """Gemma 2's logit soft-cap and a local layer's sliding window, in the tile loop and the residual window's
  program: == the library reference with the same soft-cap and window, and != the reference without them
  (the test sees both)."""
  c = _cache(lengths, appends=appends, layout="words", fmt=fmt)
  q = jnp.asarray(2.0 * np.random.default_rng(7).normal(size=(len(lengths), 4, t, 128)), jnp.bfloat16)
  kw = dict(logit_softcap=softcap, window=sliding)
  if via_ops:
    out = ops.decode_attention(q, c, num_splits=2, interpret=INTERPRET, **kw)
  else:
    out = md.decode_attention(q, c, num_splits=2, interpret=INTERPRET, window="kernel", logit_softcap=softcap,
                              sliding_window=sliding)
  out = np.asarray(out, np.float32)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c, **kw))
  plain = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
  visible = np.broadcast_to((np.asarray(c.lengths)[:, None] - t + np.arange(t) >= 0)[:, None, :, None], out.shape)
  assert test_base.relative_error(out[visible], ref[visible]) < 5e-3  # bf16 output
  np.testing.assert_array_equal(out[~visible], 0.0)
  assert test_base.relative_error(plain[visible], ref[visible]) > 2e-2


def test_softcap_and_sliding_window_refusals():
  c = _cache((300,), layout="words")
  q = jnp.zeros((1, 4, 1, 128), jnp.bfloat16)
  for kw, match in [(dict(logit_softcap=0.0), "logit_softcap must be a positive"),
                    (dict(sliding_window=0), "sliding_window must be a positive"),
                    (dict(sliding_window=64, window="xla"), "need window 'kernel'"),
                    (dict(logit_softcap=30.0, window="pallas"), "need window 'kernel'")]:
    with pytest.raises(ValueError, match=match):
      md.decode_attention(q, c, interpret=True, **kw)
  with pytest.raises(NotImplementedError, match="residual window in the kernel"):  # `dispatch` falls back to XLA
    ops.decode_attention(q, c, window=64, pallas_merge=False, interpret=True)


def test_glue_in_the_kernel_reads_the_query_at_any_row_count(monkeypatch):
  """With the window in the kernel, the lengths are computed there (lengths=None) and the query read there
  (q_scale) at 1 to 16 rows (session 24 stopped at 4: the zero fill of `load_query_t` failed Mosaic GPU's layout
  inference at 8); glue_in_kernel=False keeps both in XLA. Traced, not run."""
  from pallas_kernels.gpu import mosaic_kivi as mk
  calls, real = [], mk.kivi2_states
  monkeypatch.setattr(mk, "kivi2_states", lambda *a, **k: calls.append((a[1] is None, k.get("q_scale") is not None))
                      or real(*a, **k))
  c = _cache((300, 2), layout="words")
  for heads, t, glue, want in ((4, 1, None, (True, True)), (2, 2, None, (True, True)), (8, 1, None, (True, True)),
                               (4, 4, None, (True, True)), (4, 1, False, (False, False))):
    q = jax.ShapeDtypeStruct((2, heads, t, 128), jnp.bfloat16)
    jax.eval_shape(lambda q_, c_: md.decode_attention(q_, c_, num_splits=2, interpret=True, window="kernel",
                                                      glue_in_kernel=glue), q, c)
    assert calls[-1] == want, (heads, t, glue)


@pytest.mark.skipif(INTERPRET, reason="Mosaic GPU's interpreter has no global semaphores (count) and assumes "
                    "every program of a cluster makes the same scoped allocations, which the window's does not")
@pytest.mark.parametrize("lengths,appends,t,splits", [
    ((300, 0, 1, 128), 0, 1, 2),   # the window and 2 splits: a cluster of 3; empty, one token, exactly 128
    ((127, 385, 509), 1, 1, 4),    # a cluster of 5; the window straddles a quantized key group
    ((300, 2), 0, 4, 1),           # 4 query tokens: 16 rows; a cluster of 2
])
@pytest.mark.parametrize("merge_by,fmt", [("count", "kivi2_g128"), ("cluster", "kivi2_g128"), ("count", "kivi2")])
def test_merge_in_the_kernel(lengths, appends, t, splits, merge_by, fmt, monkeypatch):
  """kernel_merge=True: the NS + 1 states (the window's last) merged inside the kernel (by the last program of
  each (b, k) to count itself, or the first of its cluster), the rows stored in q's dtype: == the XLA merge of
  the same kernel's states, and == the library reference (natively: `benchmarks/runs/session21_a.sh`)."""
  monkeypatch.setattr(md, "MERGE_BY", merge_by)
  c = _cache(lengths, capacity=1024, appends=appends, layout="words", fmt=fmt)
  q = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), 4, t, 128)), jnp.bfloat16)
  run = lambda merge: np.asarray(md.decode_attention(q, c, num_splits=splits, interpret=INTERPRET, window="kernel",
                                                     kernel_merge=merge), np.float32)
  out, xla = run(True), run(False)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
  visible = np.broadcast_to((np.asarray(c.lengths)[:, None] - t + np.arange(t) >= 0)[:, None, :, None], out.shape)
  assert test_base.relative_error(out[visible], xla[visible]) < 4e-3  # both bf16 outputs
  assert test_base.relative_error(out[visible], ref[visible]) < 5e-3
  np.testing.assert_array_equal(out[~visible], 0.0)


def test_merge_in_the_kernel_only_where_the_states_fit():
  """More than CLUSTER_MAX states (16 splits + the window) fall back to XLA's merge; kivi2_states refuses a
  merge it cannot do."""
  from pallas_kernels.gpu import mosaic_epilogue, mosaic_kivi as mk
  c = _cache((3000, 17), capacity=4096, layout="words")
  q = jnp.asarray(np.random.default_rng(7).normal(size=(2, 4, 1, 128)), jnp.bfloat16)
  assert mosaic_epilogue.CLUSTER_MAX == 8
  out = md.decode_attention(q, c, num_splits=16, interpret=INTERPRET, window="kernel", kernel_merge=True)
  ref = attention.decode_attention(q.astype(jnp.float32), c)
  assert test_base.relative_error(np.asarray(out, np.float32), np.asarray(ref)) < 5e-3
  q_t = jnp.zeros((2, 1, 128, mk.ROWS), jnp.float32)
  with pytest.raises(ValueError, match="merged: rows must be"):
    mk.kivi2_states(q_t, c.lengths, *md.repack(c), num_splits=16, interpret=True, merged=(4, jnp.bfloat16))
  with pytest.raises(ValueError, match="merge_by must be one of"):
    mk.kivi2_states(q_t, c.lengths, *md.repack(c), num_splits=2, interpret=True, merged=(4, jnp.bfloat16),
                    merge_by="atomic")


def test_auto_window_takes_the_kernel_where_it_can():
  """"auto" is the kernel's window for a dequant_in_a variant over 16-bit rings (session 16, H200: faster
  than window_merge at every point timed), window_merge otherwise."""
  assert md.DEFAULT_WINDOW == "auto"
  assert md.auto_window(md.DEFAULT_VARIANT, jnp.bfloat16, jnp.bfloat16) == "kernel"
  assert md.auto_window(md.DEFAULT_VARIANT, jnp.float16, jnp.bfloat16) == "kernel"
  assert md.auto_window("folded_lazy", jnp.bfloat16, jnp.bfloat16) == "pallas"  # codes in A, not dequantized
  assert md.auto_window(md.DEFAULT_VARIANT, jnp.float32, jnp.bfloat16) == "pallas"


def test_auto_window_keeps_f32_residual_rings_off_the_kernel():
  """The kernel's window reads the rings as a WGMMA operand (16-bit); an f32 residual ring goes to
  window_merge under "auto" and is refused by name under "kernel"."""
  fmt = dataclasses.replace(formats.preset("kivi2_g128"), residual_dtype="float32")
  c = kvcache.init_cache(fmt, 1, 1, 256, 128, kivi_layout="words")
  rng = np.random.default_rng(0)
  kv = lambda: jnp.asarray(rng.normal(size=(1, 1, 150, 128)), jnp.float32)
  c = kvcache.prefill(c, kv(), kv(), jnp.asarray([150], jnp.int32))
  q = jnp.asarray(rng.normal(size=(1, 4, 1, 128)), jnp.float32)
  out = md.decode_attention(q, c, interpret=INTERPRET)  # "auto"
  assert test_base.relative_error(out, attention.decode_attention(q, c)) < 1e-3
  with pytest.raises(ValueError, match="k_res and v_res must be bfloat16 or float16"):
    md.decode_attention(q, c, interpret=INTERPRET, window="kernel")


def test_refuses_what_it_does_not_take():
  c = _cache((10,), capacity=256)
  q = jnp.zeros((1, 4, 5, 128))  # 4 heads x 5 tokens: 20 rows
  with pytest.raises(ValueError, match=r"q must be \[B, N, T, 128\] .* <= 16 query rows .* got \(1, 4, 5, 128\)"):
    md.decode_attention(q, c, interpret=True)
  with pytest.raises(ValueError, match=r"got \(1, 4, 128\)"):
    md.decode_attention(q[:, :, 0], c, interpret=True)
  other = kvcache.init_cache(formats.kivi(2, 128, 256), 1, 1, 512, 128)
  assert "the residual 128, got 128, 128, 256" in md.supports(other)
  assert md.supports(kvcache.init_cache(formats.preset("kivi2"), 1, 1, 256, 128)) is None  # G=32, repacked
  with pytest.raises(ValueError, match="cache: format .* is not KIVI"):
    md.decode_attention(jnp.zeros((1, 4, 1, 128)), kvcache.init_cache(formats.preset("int8"), 1, 1, 256, 128))
  diag = dataclasses.replace(mk.VARIANTS[md.FP16_VARIANT], timing_only="scale")  # wrong states, timing only
  with pytest.raises(ValueError, match="variant: Options.timing_only='scale' makes wrong attention"):
    md.decode_attention(jnp.zeros((1, 4, 1, 128)), c, variant=diag, interpret=True)


def test_precision_on_the_reference_lm(tmp_path):
  """`benchmarks/mosaic_precision.py` on the shipped reference LM's real keys and values (one layer, one
  window, interpreted): the default kernel == the library reference at bf16 level, far inside the
  quantization's own error, and the cache's scales far under the subnormal planes' bound."""
  import os
  import sys
  from kvjax.quality import reference_lm
  if not reference_lm.available():
    pytest.skip("no reference LM checkpoint")
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
  import mosaic_precision
  res = mosaic_precision.main(["--tokens", "256", "--windows", "1", "--layers", "1",
                               "--variants", md.DEFAULT_VARIANT, "--out", str(tmp_path / "p.json")])
  (row,) = res["rows"]
  err = row[f"{md.DEFAULT_VARIANT}_rel_err"]
  assert 0 < err < 2e-3 and row["quantization_rel_err"] > 20 * err
  assert 0 < max(row["key_scale_max"], row["value_scale_max"]) < res["denorm_scale_bound"] / 4


@pytest.mark.parametrize("fmt,lengths,appends,t,window", [
    ("kivi4", (300, 0, 1, 128), 0, 1, "kernel"),          # G=32: short windows; empty; one token; exactly 128
    ("kivi4", (127, 385, 509), 1, 1, "kernel+glue"),      # the window straddles a quantized key group; the
                                                          # query's prep and the lengths in the kernel
    (formats.kivi(4, 128, 128), (300, 2), 0, 4, "kernel"),  # G=128, 4 query tokens, causal among them
    ("kivi4", (385, 200, 509), 3, 1, "xla"),              # the window's keys dequantized in XLA
])
def test_kivi4_cache_matches_the_library_reference(fmt, lengths, appends, t, window):  # noqa: PLR0913
  """KIVI-4 (4-bit codes, 4 a uint16 word: two word tiles a 128-code row; planes 0-1 from w, 2-3 from
  w >> 8) in a "words" cache, G=32 and 128, through ops or not: == the library reference."""
  window, glue = window.split("+")[0], window.endswith("+glue")
  c, *_ = _words_case_matches(fmt, lengths, appends, t, window, via_ops=window == "kernel" and t == 1 and not glue,
                              glue=glue)
  assert c.k.codes.shape[-1] == c.v.codes.shape[-1] == 32


def test_merge_pads_m_so_l_stays_tma_aligned():
  """The in-kernel merge reads m and l (NS + 1 rows of N f32 each, one buffer) by TMA, whose shared-memory
  destination must sit on a 128-byte boundary: m's rows are padded (`tma_padded`) so that l's start does."""
  from pallas_kernels.gpu import mosaic_epilogue as ep
  assert ep.TMA_SMEM_ALIGN == 128
  for count in range(1, 12):
    for row_bytes in (64, 128, 48, 4):  # N = 16 f32 (the kernels' rows), 32, 12, 1
      padded = ep.tma_padded(count, row_bytes)
      assert padded >= count and padded * row_bytes % 128 == 0
      assert not any(p * row_bytes % 128 == 0 for p in range(count, padded))  # the least such count
  assert [ep.tma_padded(c, 64) for c in (1, 2, 3, 5, 8, 9)] == [2, 2, 4, 6, 8, 10]
  for bad in ((0, 64), (3, 0)):
    with pytest.raises(ValueError, match="count and row_bytes must be positive"):
      ep.tma_padded(*bad)
