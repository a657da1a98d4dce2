"""`pallas_kernels.gpu.window_merge` (the KIVI-2 window + split merge in one Pallas kernel) equals its
XLA reference (`mosaic_decode.window_states` + `decode.combine`) and the library's attention, in the
Triton interpreter, with split states from the jnp reference of the Mosaic kernel
(`mosaic_kivi.reference_states`, so these run fast). The interpreter computes the kernel's tf32 dots in
f32: the tolerances here bound the algorithm, not the GPU's precision (its check, `decode_kernels.py
--check`, measured 1.76e-3 end to end on the H200). Lengths 0, 1, below / at / past the residual,
at a group edge and full; 1, 4 and 16 query heads per KV head; column blocks; bad shapes; and the
kernel lowers to Triton IR for an H200."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import attention, cache as kvcache, formats, quant
from pallas_kernels import test_base
from pallas_kernels.gpu import decode, mosaic_decode as md, mosaic_kivi as mk, ops, window_merge as wm

CAP = 512


def _cache(lengths, kv_heads=2, appends=1, seed=0, residual_dtype="bfloat16"):
  rng = np.random.default_rng(seed)
  b = len(lengths)
  fmt = dataclasses.replace(formats.preset("kivi2_g128"), residual_dtype=residual_dtype)
  c = kvcache.init_cache(fmt, b, kv_heads, CAP, 128, kivi_layout="words")
  kv = lambda t: jnp.asarray(rng.normal(size=(b, kv_heads, t, 128)) * 2 + rng.normal(size=(1, kv_heads, 1, 128)),
                             jnp.float32)
  c = kvcache.prefill(c, kv(max(lengths)), kv(max(lengths)), jnp.asarray(lengths, jnp.int32))
  for _ in range(appends):  # a decode step: keys flush to a quantized group when one fills
    c = kvcache.append(c, kv(1), kv(1))
  return c


def _parts(c, rep, seed=1, splits=2, num_queries=1):
  """q (scaled, transposed, padded) and the kernel's split states over [0, L - 128) (jnp reference)."""
  b, kh, t = c.batch, c.num_kv_heads, num_queries
  q = jnp.asarray(np.random.default_rng(seed).normal(size=(b, kh * rep, t, 128)), jnp.float32)
  qs = q.reshape(b, kh, rep * t, 128) * (128 ** -0.5 * decode.LOG2E)
  q_t = jnp.pad(qs.swapaxes(-1, -2), ((0, 0), (0, 0), (0, 0), (0, mk.ROWS - rep * t)))
  kc, ks, kz, vc, vs, vz = md.repack(c)
  o_t, m, l = mk.reference_states(q_t, jnp.maximum(c.lengths - 128, 0), quant.unpacked_codes(c.k), ks, kz,
                                  quant.unpacked_codes(c.v)[..., 0:128], vs, vz, num_splits=splits)
  return q, qs, q_t, (kc, ks, kz), (o_t, m, l)


def _xla(c, qs, keys, states, rep, num_queries=1):
  o_t, m, l = states
  ow, mw, lw = md.window_states(qs, c, *keys, num_queries)
  o = jnp.concatenate([o_t.swapaxes(-1, -2)[:, :, :, :rep], ow], axis=2)
  return decode.combine(o, jnp.concatenate([m[..., :rep], mw], axis=2),
                        jnp.concatenate([l[..., :rep], lw], axis=2), rep)


@pytest.mark.parametrize("lengths,appends,rep,t,cols", [
    ((0, 1, 127, 128), 0, 4, 1, None),     # empty; one token; below / at the residual (all in k_res)
    ((128, 255, 256, 300), 1, 4, 1, 16),   # one past: a group flushes; the window straddles a group edge
    ((CAP - 1, 129, 384, 2), 1, 1, 1, 64),  # a full cache; one query head per KV head
    ((200, 511, 1, 0), 1, 16, 1, 128),     # 16 query heads (every row of the kernel's tile is real)
    ((0, 1, 127, 128), 2, 4, 3, None),     # 3 query tokens (speculative verify), causal among them;
                                           # lengths 2 and 3: fewer tokens before than queries
    ((128, 255, 256, 300), 1, 2, 8, 32),   # 8 tokens x 2 heads; the window straddles a group edge
])
def test_matches_the_xla_window_and_the_library(lengths, appends, rep, t, cols):
  c = _cache(lengths, appends=appends)
  q, qs, q_t, keys, states = _parts(c, rep, num_queries=t)
  out = wm.window_merge(q_t, c.lengths, *keys, c.k_res, c.v_res, *states, jnp.float32, num_queries=t,
                        interpret=True, cols=cols)[:, :, :rep * t]
  ref = _xla(c, qs, keys, states, rep * t, t)
  lib = attention.decode_attention(q, c).reshape(ref.shape)
  # row h T + t is query t at L - T + t: nothing to see where that is negative (the library's 0 too)
  seen = (np.asarray(c.lengths)[:, None] - t + np.arange(rep * t)[None, :] % t >= 0)[:, None, :, None]
  seen = np.broadcast_to(seen, out.shape)
  assert test_base.relative_error(np.asarray(out)[seen], np.asarray(ref)[seen]) < 1e-5
  assert test_base.relative_error(np.asarray(out)[seen], np.asarray(lib)[seen]) < 1e-4
  np.testing.assert_array_equal(np.asarray(out)[~seen], 0.0)
  np.testing.assert_array_equal(np.asarray(lib)[~seen], 0.0)


def test_other_residual_and_output_dtypes():
  c = _cache((300, 77, 0, 128), residual_dtype="float16")
  q, qs, q_t, keys, states = _parts(c, 4)
  out = wm.window_merge(q_t, c.lengths, *keys, c.k_res, c.v_res, *states, jnp.bfloat16, interpret=True)
  assert out.dtype == jnp.bfloat16 and out.shape == (4, 2, mk.ROWS, 128)
  ref = _xla(c, qs, keys, states, 4)
  assert test_base.relative_error(np.asarray(out[:, :, :4], np.float32), np.asarray(ref)) < 1e-2


def test_bad_shapes_and_cols_are_refused():
  c = _cache((300, 5, 6, 7))
  _, _, q_t, keys, (o_t, m, l) = _parts(c, 4)
  args = (q_t, c.lengths, *keys, c.k_res, c.v_res)
  with pytest.raises(ValueError, match=r"cols must be a power of two >= 16 dividing the head dim 128, got 24"):
    wm.window_merge(*args, o_t, m, l, jnp.float32, cols=24)
  with pytest.raises(ValueError, match=r"o_t must be \[B, K, NS, H, ROWS\] .* got \(4, 2, 2, 16, 128\)"):
    wm.window_merge(*args, o_t.swapaxes(-1, -2), m, l, jnp.float32)
  with pytest.raises(ValueError, match=r"num_queries must be in \[1, 16\], got 17"):
    wm.window_merge(*args, o_t, m, l, jnp.float32, num_queries=17)
  with pytest.raises(ValueError, match=r"k_res and v_res must be \[B, K, R, H\] = \(4, 2, 128, 128\), got "
                     r"\(4, 2, 64, 128\), \(4, 2, 128, 128\)"):
    wm.window_merge(q_t, c.lengths, *keys, c.k_res[:, :, :64], c.v_res, o_t, m, l, jnp.float32)
  with pytest.raises(ValueError, match=r"v_res must .* got \(4, 2, 128, 128\), \(4, 2, 128, 64\)"):
    wm.window_merge(q_t, c.lengths, *keys, c.k_res, c.v_res[..., :64], o_t, m, l, jnp.float32)
  kc, ks, kz = keys
  with pytest.raises(ValueError, match=r"kc must be \[B, K, S, 16\] .* got \(4, 2, 512, 8\)"):
    wm.window_merge(q_t, c.lengths, kc[..., :8], ks, kz, c.k_res, c.v_res, o_t, m, l, jnp.float32)
  with pytest.raises(ValueError, match=r"q_t must be \[B, K, 128, ROWS\] with ROWS a power of two >= 16, "
                     r"got \(4, 2, 128, 12\)"):
    wm.window_merge(q_t[..., :12], c.lengths, *keys, c.k_res, c.v_res, o_t, m, l, jnp.float32)


@pytest.fixture
def fresh_decode():
  """`mosaic_decode._decode` is jitted: its cache is cleared around a test that patches what it calls
  (a cached trace would skip the patch, and a patched trace must not outlive the test)."""
  md._decode.clear_cache()
  yield
  md._decode.clear_cache()


@pytest.mark.parametrize("t", [1, 2])
def test_decode_uses_it_when_told_and_agrees_with_the_xla_window(monkeypatch, fresh_decode, t):
  c = _cache((300, 0, 17, 130), appends=0)
  q = jnp.asarray(np.random.default_rng(3).normal(size=(4, 8, t, 128)), jnp.float32)
  calls = []
  real = wm.window_merge
  monkeypatch.setattr(wm, "window_merge", lambda *a, **k: calls.append(1) or real(*a, **k))
  # the jnp states stand in for the interpreted Mosaic kernel (slow; `test_mosaic_decode` runs it)
  monkeypatch.setattr(mk, "kivi2_states", lambda q_t, ln, kc, ks, kz, vc, vs, vz, num_splits, **_: mk.reference_states(
      q_t, ln, mk.unpack_keys(kc), ks, kz, _unpack_values(vc), vs, vz, num_splits=num_splits))
  fused = md.decode_attention(q, c, num_splits=2, interpret=True, window="pallas")  # ("auto" takes the
  # Mosaic kernel's own window for caches this short: test_mosaic_decode.py)
  assert calls == [1]
  xla = md.decode_attention(q, c, num_splits=2, interpret=True, window="xla")
  via_ops = ops.decode_attention(q, c, num_splits=2, interpret=True, pallas_merge=False)  # the XLA merge
  assert calls == [1]  # (each a new trace: window is a static argument)
  np.testing.assert_array_equal(np.asarray(via_ops), np.asarray(xla))
  assert test_base.relative_error(np.asarray(fused), np.asarray(xla)) < 1e-5
  lib = np.asarray(attention.decode_attention(q, c))
  seen = np.asarray(c.lengths) >= t  # every query token has a non-negative position
  assert test_base.relative_error(np.asarray(xla)[seen], lib[seen]) < 1e-4
  np.testing.assert_array_equal(np.asarray(fused[1]), 0.0)  # length 0


def _unpack_values(vc):
  """[B, K, S/128, 128, 16] value words (tiles transposed) -> codes [B, K, S, 128]."""
  b, kh, nt, h, _ = vc.shape
  return mk.unpack_keys(vc).reshape(b, kh, nt, h, mk.TILE).swapaxes(-1, -2).reshape(b, kh, nt * mk.TILE, h)


def test_lowers_to_triton_for_an_h200():
  pytest.importorskip("jax._src.pallas.triton.pallas_call_registration")
  from pallas_kernels.gpu import lowering_check
  c = _cache((300, 5, 0, 128), appends=0)
  _, _, q_t, keys, states = _parts(c, 4, splits=4)
  with lowering_check.triton_modules() as modules:
    fn = jax.jit(lambda *a: wm.window_merge(*a, jnp.bfloat16, interpret=False))
    fn.trace(q_t, c.lengths, *keys, c.k_res, c.v_res, *states).lower(lowering_platforms=("cuda",))
  # 16-channel slices of k_res and of the dequantized key tile, then p.v; all on the tensor cores (tf32): f32
  # dots at HIGHEST precision became FMA loops that spilled (216 us at B=8 on the H200, session 13)
  assert len(modules) == 1 and modules[0].count("tt.dot ") == 2 * mk.PLANES + 1
  assert modules[0].count("inputPrecision = tf32") == 2 * mk.PLANES + 1
