"""`mosaic_pipeline.emit` (`Options.warp_fetch`): the KIVI kernel's tile pipeline with each refetch issued by
one warp, rotating. Natively on a GPU (the warp map), else interpreted (the same steps, slots and barriers)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import attention, cache as kvcache, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import mosaic_decode as md, mosaic_kivi as mk, mosaic_pipeline

INTERPRET = jax.default_backend() != "gpu"


def _cache(lengths, capacity, fmt="kivi2_g128", h=128):
  rng = np.random.default_rng(11)
  b = len(lengths)
  c = kvcache.init_cache(formats.preset(fmt), b, 1, capacity, h, kivi_layout="words")
  t = max(max(lengths), 1)
  kv = lambda: jnp.asarray(rng.normal(size=(b, 1, t, h)) + rng.normal(size=(1, 1, 1, h)), jnp.float32)
  return kvcache.prefill(c, kv(), kv(), jnp.asarray(lengths, jnp.int32))


def _decode(q, c, splits, variant):
  """The kernel's output for variant, with the window and glue in the kernel, as f32."""
  return np.asarray(md.decode_attention(q, c, num_splits=splits, interpret=INTERPRET, variant=variant,
                                        window="kernel", glue_in_kernel=True), np.float32)


GROUPED = ("dequant_denorm_s32_mb_lag0w", "dequant_denorm_s32_mb_lag0")


@pytest.mark.parametrize("fmt,splits,variants,h", [
    ("kivi2_g128", 1, ("dequant_fp8xpw", "dequant_fp8xp"), 128),
    ("kivi2_g128", 2, ("dequant_fp8xpw", "dequant_fp8xp"), 128),
    ("kivi2", 2, GROUPED, 128),  # G=32: the grouped build
    ("kivi4", 1, GROUPED, 128),  # 4-bit codes
    ("kivi2", 1, GROUPED, 256),  # Gemma's head_dim (not the default there until it has run natively)
])
def test_warp_fetch_is_bit_for_bit_the_default_pipeline(fmt, splits, variants, h):
  """The same tiles into the same slots: the states equal the build's without warp_fetch exactly, at lengths
  that leave a split no step, fewer steps than stages, and (1 split, 1100 tokens: 8 tiles) every warp's turn
  twice."""
  lengths = (1100, 0, 129, 300)
  c = _cache(lengths, capacity=1280, fmt=fmt, h=h)
  q = jnp.asarray(np.random.default_rng(5).normal(size=(len(lengths), 4 * 128 // h, 1, h)), jnp.bfloat16)
  run = lambda v: _decode(q, c, splits, v)
  warp, base = map(run, variants)
  np.testing.assert_array_equal(warp, base)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
  assert test_base.relative_error(warp, ref) < 4e-3


@pytest.mark.parametrize("fmt,variants", [
    ("kivi2_g128", ("dequant_fp8xpwr", "dequant_fp8xpw")),  # the key-scale max by REDUX
    ("kivi2_g128", ("dequant_fp8xpwrm", "dequant_fp8xpw")),  # and the mask on the partial tiles alone
    ("kivi2", ("dequant_denorm_s32_mb_lag0wm", "dequant_denorm_s32_mb_lag0w")),  # G=32's, the mask alone
    ("kivi4", ("dequant_denorm_s32_mb_lag0wm", "dequant_denorm_s32_mb_lag0w")),
])
def test_redux_max_and_full_tiles_are_bit_for_bit(fmt, variants):
  """`Options.redux_max` / `full_tiles`: the states equal the build's without them exactly, at lengths that end
  on a tile (every tile full: no masked branch), inside one (the last tile masked), 1 and 0, over 2 splits."""
  lengths = (1024, 1100, 256, 129, 1, 0)
  c = _cache(lengths, capacity=1280, fmt=fmt)
  q = jnp.asarray(np.random.default_rng(7).normal(size=(len(lengths), 4, 1, 128)), jnp.bfloat16)
  run = lambda v: _decode(q, c, 2, v)
  new, base = map(run, variants)
  np.testing.assert_array_equal(new, base)
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
  assert test_base.relative_error(new, ref) < 4e-3


def test_f16_rest_stays_within_bf16_error():
  """`Options.f16_rest` (B's lo words from the rest in fp16: not bit for bit the f32 rest) on the default
  build: the states within bf16's error of the reference and of the build without it."""
  lengths = (1024, 1100, 129, 0)
  c = _cache(lengths, capacity=1280)
  q = jnp.asarray(np.random.default_rng(9).normal(size=(len(lengths), 4, 1, 128)), jnp.bfloat16)
  run = lambda v: _decode(q, c, 2, v)
  new, base = run("dequant_fp8xpwrmh"), run("dequant_fp8xpwrm")
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c))
  assert test_base.relative_error(new, ref) < 4e-3
  assert test_base.relative_error(new, base) < 4e-3
  assert not np.array_equal(new, base)  # the rest did round differently somewhere


def test_warp_fetch_validation():
  with pytest.raises(ValueError, match="warp_fetch needs manual_barriers"):
    dataclasses.replace(mk.VARIANTS["dequant_fp8xpw"], manual_barriers=False, xwarp_split=False)
  with pytest.raises(ValueError, match="stages must be a positive int, got 0"):
    mosaic_pipeline.emit(lambda *a: a[-1], steps=4, stages=0, init_carry=0, in_specs=[], warp_fetch=True,
                         interpret=True)
  with pytest.raises(ValueError, match="f16_rest needs fp8_mma"):
    dataclasses.replace(mk.VARIANTS["dequant_denorm_s32_mb_lag0w"], f16_rest=True)
  with pytest.raises(ValueError, match="redux_max needs fp8_mma"):
    dataclasses.replace(mk.VARIANTS["dequant_denorm_s32_mb_lag0w"], redux_max=True)


def test_the_defaults_take_warp_fetch_where_it_ran_natively():
  """KIVI-2 G=128 and the grouped build at head_dim 128 issue their refetches one warp a tile (timed and bit for
  bit natively, session 40); head_dim 256 (Gemma) keeps the build without it until it has run natively."""
  fetch = lambda fmt, h: mk.VARIANTS[md.default_variant(
      kvcache.init_cache(formats.preset(fmt), 1, 1, 256, h, kivi_layout="words"))].warp_fetch
  assert fetch("kivi2_g128", 128) and fetch("kivi2", 128) and fetch("kivi4", 128)
  assert not fetch("kivi2_g128", 256) and not fetch("kivi2", 256)
  assert md.default_variant(kvcache.init_cache(formats.preset("kivi2"), 1, 1, 256, 256, kivi_layout="words")) \
      == md.WIDE_HEAD_VARIANT


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.int8], ids=["e4m3", "int8"])
def test_fp8_kernel_warp_fetch_is_bit_for_bit(dtype):
  """The Mosaic FP8 / INT8 kernel with `Fp8Options.warp_fetch`: the same states as without, over 9 steps in one
  split (every warp's turn twice), an empty sequence and one shorter than the stages; validated."""
  from fp8_cases import fp8_case  # tests/fp8_cases.py, a plain module (conftest)
  from pallas_kernels.gpu import mosaic_fp8 as mf
  q_t, ln, k, ks, v, vs = fp8_case((1100, 0, 129), dtype, capacity=1152, kv_heads=1)
  run = lambda o: [np.asarray(x) for x in mf.fp8_states(q_t, ln, k, ks, v, vs, num_splits=1, interpret=INTERPRET,
                                                         options=o)]
  for warp, base in zip(run(mf.Fp8Options(warp_fetch=True)), run(mf.Fp8Options()), strict=True):
    np.testing.assert_array_equal(warp, base)
  with pytest.raises(ValueError, match="warp_fetch needs manual_barriers"):
    mf.Fp8Options(warp_fetch=True, manual_barriers=False)
