"""The experimental Mosaic GPU KIVI-2 kernel (`pallas_kernels.gpu.mosaic_kivi`): its split states equal
the jnp reference in Mosaic GPU's CPU interpreter (ragged lengths, an empty sequence, a split past the
length), its packing puts plane m at bits 2m, bad shapes are refused, and it lowers for CUDA where the
CUDA plugin (which holds Mosaic GPU's lowering) is installed."""

import dataclasses
import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import test_base
from pallas_kernels.gpu import decode, mosaic_decode, mosaic_kivi as mk, mosaic_planes as planes
from pallas_kernels.gpu.mosaic_kivi_ref import NEG


def _case(lengths=(512, 200)):
  return test_base.kivi2_unpacked_case(lengths, rows=mk.ROWS)


def test_packing_puts_plane_m_at_bits_2m():
  codes = jnp.asarray(np.random.default_rng(1).integers(0, 4, (1, 1, 256, 128)), jnp.uint8)
  kw, vw = np.asarray(mk.pack_keys(codes)), np.asarray(mk.pack_values(codes))
  c = np.asarray(codes)
  assert kw.shape == (1, 1, 256, 16) and vw.shape == (1, 1, 2, 128, 16) and kw.dtype == np.uint16
  np.testing.assert_array_equal(np.asarray(mk.unpack_keys(mk.pack_keys(codes))), np.asarray(codes))
  for m in range(8):
    np.testing.assert_array_equal((kw >> (2 * m)) & 3, c[..., 16 * m:16 * m + 16])
    # value tile i, channel d, word j: token 128 i + j + 16 m
    np.testing.assert_array_equal(((vw[0, 0, 1] >> (2 * m)) & 3).T, c[0, 0, 128 + 16 * m:128 + 16 * m + 16])


# the default's tile step over the fixed splits the reference takes (balanced splits differ per split:
# their own merged test below): subnormal planes, 32-bit shifts, hand-placed barriers
DENORM_FIXED = mk.Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True, shift32=True,
                          manual_barriers=True)
# session 16's default (0x6400 read at run time) over fixed splits
MASK_OM_FIXED = mk.Options(dequant_in_a=True, lazy_sums=True, unpack="mask", scales_once=True, opaque_magic=True)
# every option of `mk.Options` on and off at least once (all presets interpreted would add a minute)
INTERPRETED = ("offset", "exact", "lean", "folded_mask", "folded_lazy_mask", "dequant_sum", "dequant2",
               "dequant_mask_s16_stop", DENORM_FIXED, MASK_OM_FIXED)
_name = lambda v: {DENORM_FIXED: "denorm_fixed", MASK_OM_FIXED: "mask_om_fixed"}.get(v, v)
_opts = lambda v: v if isinstance(v, mk.Options) else mk.VARIANTS[v]


def test_interpreted_presets_cover_every_option():
  for field in dataclasses.fields(mk.Options):
    if field.name in ("timing_only", "narrow_softmax", "narrow_mma", "smem_pad_kb", "fp8_mma", "xwarp_split",
                      "ptx_words", "redux_max", "full_tiles", "f16_rest"):  # own tests (narrow: needs live_rows
      # <= 8; narrow_mma and the e4m3 step's options: also test_mosaic_decode; session 41's: test_mosaic_pipeline)
      continue
    # the default and min_share=4 run in test_balanced_splits_share_the_live_tiles
    seen = {getattr(_opts(v), field.name) for v in INTERPRETED + (mosaic_decode.DEFAULT_VARIANT, "dequant_denorm_s32_mb4")}
    assert len(seen) >= 2, field.name


def _check_states(out, ref, variant, tol=2e-3):
  """unpack="denorm" rounds the keys to a floor of 2^(DENORM_LOG2 - 25) where |k| < 1 (the test's keys
  are ~0.3): its max logits (log2) sit within 4e-3 of the reference, 0.3% in p, not 2e-3."""
  o, m, l = map(np.asarray, out)
  ro, rm, rl = map(np.asarray, ref)
  seen = rl > 0
  assert np.array_equal(l > 0, seen)  # splits past a sequence's length saw nothing
  np.testing.assert_allclose(m[seen], rm[seen], atol=6e-3 if _opts(variant).unpack == "denorm" else tol)
  assert test_base.relative_error(l, rl) < tol
  assert test_base.relative_error(o, ro) < tol  # fp16 q * s and p * s, as the Triton kernels
  assert np.abs(o[~seen.any(-1)]).max(initial=0.0) == 0.0


@pytest.mark.parametrize("variant", INTERPRETED, ids=_name)
@pytest.mark.parametrize("lengths,splits", [((512, 200), 2), ((0, 129), 4), ((384, 1), 1)])
def test_states_match_reference_in_the_interpreter(lengths, splits, variant):
  if 512 // mk.TILE // splits % _opts(variant).tiles_per_step:
    pytest.skip("a split of one tile cannot take two per step (test_bad_shapes_are_refused)")
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=lengths)
  out = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz,
                        num_splits=splits, interpret=True, variant=variant)
  _check_states(out, mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=splits), variant)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the compiled kernel needs an H100/H200")
@pytest.mark.parametrize("variant", [DENORM_FIXED, mosaic_decode.DEFAULT_VARIANT, "dequant_denorm_s32_mb4"],
                         ids=_name)
@pytest.mark.parametrize("scale_dtype", [jnp.bfloat16, jnp.float16])
def test_states_match_reference_natively(variant, scale_dtype):
  """The compiled kernel (Mosaic GPU on the device; `benchmarks/runs/session17_{a,c,e}.sh`) == the reference:
  ragged lengths, an empty sequence, one token, a split past the length; bf16 scales converted once per
  tile, fp16 ones read in place. The balanced preset's splits differ: merged, as the default."""
  lengths = (512, 0, 1, 200)
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=lengths)
  ks, kz, vs, vz = (x.astype(scale_dtype) for x in (ks, kz, vs, vz))
  args = (q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  out = mk.kivi2_states(*args, num_splits=2, variant=variant)
  ref = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=2)
  if _opts(variant).balance:
    merged = lambda o, m, l: decode.combine(np.swapaxes(np.asarray(o), -1, -2), m, l, mk.ROWS)
    assert test_base.relative_error(merged(*out), merged(*ref)) < 2e-3
  else:
    _check_states(out, ref, variant)


@pytest.mark.parametrize("variant", ["dequant_mask", "dequant_mask_s16"])
def test_bf16_scales_match_reference(variant):
  """The cache's scales and zeros are bf16: converted to fp16 per plane, or once per tile
  (`Options.scales_once`); both == the reference on the same bf16 values."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(512, 130))
  ks, kz, vs, vz = (jnp.asarray(x, jnp.bfloat16) for x in (ks, kz, vs, vz))
  out = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz,
                        num_splits=2, interpret=True, variant=variant)
  ref = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=2)
  assert test_base.relative_error(out[0], ref[0]) < 2e-3
  assert test_base.relative_error(out[2], ref[2]) < 2e-3
  with pytest.raises(ValueError, match="scales_once needs dequant_in_a"):
    mk.Options(scales_once=True)


def test_stopping_at_the_lengths_changes_no_bit():
  """`Options.stop_at_length` (each split's pipeline over its steps below the length, none past it)
  == the masked walk over the whole capacity, bit for bit: empty, one-token, ragged and full."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(384, 129, 0, 1, 512))
  args = (q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  full, stop = (mk.kivi2_states(*args, num_splits=2, interpret=True, variant=v)
                for v in ("dequant_mask_s16", "dequant_mask_s16_stop"))
  for a, b in zip(full, stop, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("variant", [mosaic_decode.DEFAULT_VARIANT, "dequant_denorm_s32_mb4"])
def test_balanced_splits_share_the_live_tiles(variant):
  """`Options.balance`: the splits share the tiles below each length (split s of 4 over a 1-tile length
  has tile s only if s == 0; over 3 tiles, tiles s), at least `min_share` tiles a split (min_share=4:
  a 5-tile length in splits 0 and 1 only), so the per-split states differ from the fixed slices but
  merge to the same attention; splits with no tile saw nothing (l = 0, o = 0)."""
  lengths = (384, 129, 0, 1, 1024, 600)
  q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case(lengths, rows=mk.ROWS, capacity=1024)
  args = (q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  o, m, l = map(np.asarray, mk.kivi2_states(*args, num_splits=4, interpret=True, variant=variant))
  ref = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=4)
  merged = lambda o, m, l: decode.combine(np.swapaxes(o, -1, -2), m, l, mk.ROWS)  # states -> attention
  assert test_base.relative_error(merged(o, m, l), merged(*ref)) < 2e-3
  # with c = max(ceil(live tiles / 4), min_share) tiles a split, split s holds a token iff s c < live tiles
  live = -(-np.asarray(lengths) // mk.TILE)
  share = np.maximum(-(-live // 4), mk.VARIANTS[variant].min_share)
  holds = np.arange(4)[None, :] * share[:, None] < live[:, None]
  np.testing.assert_array_equal((l > 0).any(-1).all(1), holds)
  assert holds.sum(1).tolist() == ([3, 2, 0, 1, 4, 3] if share.min() == 1 else [1, 1, 0, 1, 2, 2])
  assert np.abs(o[~(l > 0)[:, :, :, None, :].repeat(128, 3)]).max(initial=0.0) == 0.0
  with pytest.raises(ValueError, match="balance needs stop_at_length"):
    mk.Options(balance=True)


@pytest.mark.parametrize("variant", ["folded", "lean", "dequant_mask"])
def test_unwritten_slots_with_zero_scales_stay_finite(variant):
  """Past a sequence's length the cache may hold zero scales and zeros (never written): the folded zero
  / scale must not turn them into NaN x 0 in the value MMA."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(300, 0))
  tok = np.arange(512)[None, None, :] >= np.asarray(ln)[:, None, None]
  grp = np.arange(4)[None, None, :, None] * 128 >= np.asarray(ln)[:, None, None, None]
  vs, vz = (jnp.where(tok, 0, x) for x in (vs, vz))
  ks, kz = (jnp.where(grp, 0, x) for x in (ks, kz))
  out = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz,
                        num_splits=2, interpret=True, variant=variant)
  ref = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=2)
  assert all(np.isfinite(np.asarray(x)).all() for x in out)
  assert test_base.relative_error(out[0], ref[0]) < 2e-3


def test_balanced_splits_need_not_divide_the_tiles():
  """A balanced variant shares the live steps among any number of splits (3 over 4 tiles, 5 over 4: one empty),
  as the cluster merge's NS + 1 <= 8 states want (7 splits and the window)."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case()
  args = (ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  ref = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=1)
  for splits in (3, 5):
    out = mk.kivi2_states(q_t, *args, num_splits=splits, interpret=True, variant=mosaic_decode.DEFAULT_VARIANT)
    merged = lambda o, m, l: decode.combine(jnp.swapaxes(o, -1, -2), m, l, mk.ROWS)
    assert test_base.relative_error(merged(*out), merged(*ref)) < 2e-3, splits


@pytest.mark.parametrize("variant", ["folded_lazy", "dequant_denorm_s32_mb"])
def test_query_rows_prepared_in_the_kernel(variant):
  """q_scale: the query rows as given ([B, K, rows, H] bf16 or f32) scaled, transposed and padded inside the
  kernel: the same states as from the XLA-prepared q_t (f32 rows: exactly; bf16 rows: the same bf16 query)."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case()
  args = (ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  scale = 0.6
  for dtype, rows in ((jnp.float32, 4), (jnp.bfloat16, 16), (jnp.bfloat16, 1)):
    q = (jnp.swapaxes(q_t, -1, -2)[:, :, :rows] / scale).astype(dtype)
    prepared = jnp.pad(jnp.swapaxes(q.astype(jnp.float32) * scale, -1, -2),
                       ((0, 0), (0, 0), (0, 0), (0, mk.ROWS - rows)))
    ref = mk.kivi2_states(prepared, *args, num_splits=2, interpret=True, variant=variant)
    out = mk.kivi2_states(q, *args, num_splits=2, interpret=True, variant=variant, q_scale=scale)
    for a, b in zip(out, ref):
      np.testing.assert_allclose(np.asarray(a)[..., :rows], np.asarray(b)[..., :rows], rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match=r"with q_scale, q_t must be the query rows"):
    mk.kivi2_states(q_t, *args, num_splits=2, interpret=True, q_scale=scale)


def test_bad_shapes_are_refused():
  q_t, ln, kc, ks, kz, vc, vs, vz = _case()
  args = (ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  with pytest.raises(ValueError, match=r"q_t must be \[B, K, H in \(128, 256\), 16\], got \(2, 2, 128, 8\)"):
    mk.kivi2_states(q_t[..., :8], *args, num_splits=1, interpret=True)
  with pytest.raises(ValueError, match=r"capacity 512 must be a multiple of 128 x tiles_per_step \(1\) x num_splits \(3\)"):
    mk.kivi2_states(q_t, *args, num_splits=3, interpret=True)
  with pytest.raises(ValueError, match=r"vs must be \(2, 2, 512\), got \(2, 2, 256\)"):
    mk.kivi2_states(q_t, *args[:5], vs[..., :256], vz, num_splits=1, interpret=True)
  with pytest.raises(ValueError, match=r"capacity 512 must be a multiple of 128 x tiles_per_step \(2\) x num_splits \(4\)"):
    mk.kivi2_states(q_t, *args, num_splits=4, interpret=True, variant="dequant2")
  with pytest.raises(ValueError, match=r"variant must be an Options or one of \('offset', 'exact', .*\), got 'fast'"):
    mk.kivi2_states(q_t, *args, num_splits=1, interpret=True, variant="fast")
  with pytest.raises(ValueError, match=r"lengths must be \[2\] int32 \(or None with a window\), got None"):
    mk.kivi2_states(q_t, None, *args[1:], num_splits=1, interpret=True)
  with pytest.raises(ValueError, match=r"lengths must be \[2\] int32 \(or None with a window\), got \(3,\)"):
    mk.kivi2_states(q_t, jnp.zeros(3, jnp.int32), *args[1:], num_splits=1, interpret=True)


@pytest.mark.parametrize("lengths,splits,group", [((512, 200), 2, 128), ((0, 129), 4, 128), ((512, 200), 2, 32)])
def test_head_dim_256_states_match_reference(lengths, splits, group):
  """Gemma 2's head_dim 256, fp16 scales (converted once a tile anyway: G=128's value scales per token and half
  made half-major, `mosaic_groups.split_halves`; G=32's regrouped per 128-channel half): 16 key k-slabs, two
  128-channel value accumulators."""
  q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case(lengths, rows=mk.ROWS, head_dim=256, group=group)
  assert kc.shape[-1] == 256 and vs.shape[-1] == 256 // group
  out = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz, num_splits=splits,
                        interpret=True, variant=DENORM_FIXED)
  _check_states(out, mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=splits), DENORM_FIXED)


def test_head_dim_256_refusals():
  q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case((300,), rows=mk.ROWS, head_dim=256)
  args = (q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  with pytest.raises(ValueError, match="head_dim 256 needs a dequant_in_a variant with scales_once, got 'lean'"):
    mk.kivi2_states(*args, num_splits=1, interpret=True, variant="lean")
  with pytest.raises(ValueError, match=r"vs must be \(1, 2, 512, 2\), got \(1, 2, 512\)"):
    mk.kivi2_states(*args[:6], vs[..., 0], vz, num_splits=1, interpret=True, variant=DENORM_FIXED)


def test_options_are_validated():
  with pytest.raises(ValueError, match="zero_mma needs exact planes"):
    mk.Options(exact=False, zero_mma=True)
  with pytest.raises(ValueError, match="fold_zeros needs exact planes and no zero_mma"):
    mk.Options(fold_zeros=True, zero_mma=True)
  with pytest.raises(ValueError, match="dequant_in_a needs exact planes and neither zero_mma nor fold_zeros"):
    mk.Options(dequant_in_a=True, fold_zeros=True)
  with pytest.raises(ValueError, match="tiles_per_step must be 1, or 2 with dequant_in_a, got 2"):
    mk.Options(tiles_per_step=2)
  with pytest.raises(ValueError, match="unpack must be 'shift', 'mask' or 'denorm', got 'lut'"):
    mk.Options(unpack="lut")
  with pytest.raises(ValueError, match="unpack='denorm' needs dequant_in_a"):
    mk.Options(unpack="denorm")
  with pytest.raises(ValueError, match="shift32 needs unpack='mask' or 'denorm'"):
    mk.Options(shift32=True)
  with pytest.raises(ValueError, match="manual_barriers needs dequant_in_a"):
    mk.Options(manual_barriers=True)
  with pytest.raises(ValueError, match=r"min_share must be >= 1 \(> 1 needs balance\), got 4"):
    mk.Options(min_share=4)
  with pytest.raises(ValueError, match="unpack='mask' needs exact planes"):
    mk.Options(exact=False, unpack="mask")
  with pytest.raises(ValueError, match="lag must be None or 0..8 WGMMA groups in flight, got 9"):
    mk.Options(lag=9)
  with pytest.raises(ValueError, match="opaque_magic needs unpack='mask'"):
    mk.Options(opaque_magic=True)


@pytest.mark.parametrize("narrow_mma", [False, True], ids=["n16", "n8"])
@pytest.mark.parametrize("lengths,splits,live", [((512, 200), 2, 4), ((0, 129), 4, 8), ((384, 1), 1, 1)])
def test_narrow_softmax_computes_the_live_rows_only(lengths, splits, live, narrow_mma):
  """live_rows <= 8 (`Options.narrow_softmax`, the default): the first 8 rows' states equal the reference,
  the other 8 are those of no token; narrow_softmax=False or live_rows > 8 keep all 16 (natively on a GPU).
  narrow_mma: the products at N = 8 too (K-major query and probabilities)."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=lengths)
  args = (q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz)
  ref = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=splits)
  native = jax.default_backend() == "gpu"  # compiled on an H100 / H200, else Mosaic GPU's interpreter
  run = lambda opt, rows: mk.kivi2_states(*args, num_splits=splits, interpret=not native, variant=opt, live_rows=rows)
  narrow_opt = dataclasses.replace(DENORM_FIXED, narrow_mma=narrow_mma)
  o, m, l = map(np.asarray, run(narrow_opt, live))
  n = mk.NARROW_ROWS
  _check_states((o[..., :n], m[..., :n], l[..., :n]), [np.asarray(x)[..., :n] for x in ref], DENORM_FIXED)
  assert (m[..., n:] == NEG).all() and (l[..., n:] == 0).all()
  assert (o[..., n:] == 0).all()
  for opt, rows in ((dataclasses.replace(DENORM_FIXED, narrow_softmax=False), live), (narrow_opt, n + 1)):
    _check_states(run(opt, rows), ref, opt)  # all 16 rows computed (narrow_mma too: N = 16 past 8 rows)
  with pytest.raises(ValueError, match=r"live_rows must be in \[1, 16\] \(the query rows that hold queries\), got 17"):
    run(DENORM_FIXED, 17)


@pytest.mark.parametrize("drop", ["scale", "unpack"])
def test_timing_only_builds_drop_the_dequant(drop):
  """`Options.timing_only` (a timing diagnostic for mosaic_sass.py) runs the same step shapes but skips the
  dequantization, so its states differ from the reference's (decode_attention refuses it: test_mosaic_decode)."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(512, 200))
  opt = dataclasses.replace(DENORM_FIXED, timing_only=drop)
  o, m, l = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz, num_splits=2,
                            interpret=True, variant=opt)
  ro, rm, rl = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=2)
  assert o.shape == ro.shape and m.shape == rm.shape and l.shape == rl.shape
  finite = np.isfinite(np.asarray(o))
  assert not finite.all() or test_base.relative_error(np.asarray(o), np.asarray(ro)) > 0.1
  with pytest.raises(ValueError, match="timing_only must be '', 'l2', or 'scale' / 'unpack' with unpack='denorm'"):
    mk.Options(dequant_in_a=True, unpack="mask", timing_only="scale")
  with pytest.raises(ValueError, match="timing_only must be"):
    mk.Options(dequant_in_a=True, unpack="denorm", timing_only="all")


def test_timing_only_l2_reads_one_sequence_and_head():
  """timing_only="l2" (a timing diagnostic) runs every program over (b=0, k=0)'s tiles with its own query and
  length: its states are the reference's over that one cache broadcast to every (b, k)."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(512, 200))
  opt = dataclasses.replace(DENORM_FIXED, timing_only="l2")
  o, m, l = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz, num_splits=2,
                            interpret=True, variant=opt)
  first = lambda x: jnp.broadcast_to(x[:1, :1], x.shape)  # (0, 0)'s cache at every (b, k)
  ref = mk.reference_states(q_t, ln, *map(first, (kc, ks, kz, vc, vs, vz)), num_splits=2)
  _check_states((o, m, l), ref, opt)
  own = mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=2)
  assert test_base.relative_error(np.asarray(o), np.asarray(own[0])) > 0.1  # not the caller's own cache


def test_smem_pad_changes_nothing_but_the_allocation():
  """Options.smem_pad_kb (a timing diagnostic: fewer programs per SM) leaves the states as they are."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(384, 1))
  run = lambda opt: mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz, num_splits=1,
                                    interpret=True, variant=opt)
  for a, b in zip(run(dataclasses.replace(DENORM_FIXED, smem_pad_kb=10)), run(DENORM_FIXED)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="smem_pad_kb must be in \\[0, 160\\].*got 161"):
    mk.Options(smem_pad_kb=161)


def test_exact_planes_are_the_codes():
  words = jnp.asarray(np.random.default_rng(2).integers(0, 1 << 16, (64,)), jnp.uint16)
  w = np.asarray(words).astype(np.int64)
  for m in range(8):
    off, ex = planes.plane(words, m), planes.plane(words, m, exact=True)
    np.testing.assert_array_equal(np.asarray(ex, np.float32), (w >> (2 * m)) & 3)
    np.testing.assert_array_equal(np.asarray(off, np.float32), 1024 + ((w >> (2 * m)) & 3))
    for magic in (None, jnp.uint16(0x6400)):  # the literal, or the scalar read at run time (opaque_magic)
      masked = planes.plane_masked(words, words >> 10, m, magic)
      assert masked.dtype == jnp.float16
      np.testing.assert_array_equal(np.asarray(masked, np.float32), (w >> (2 * m)) & 3)
    # unpack="denorm": the masked word is the subnormal c 4^j 2^-24, j = m (m < 5) or m - 5
    sub = np.asarray(planes.plane_denorm(words, words >> 10, m), np.float64)
    j = m if m < 5 else m - 5
    np.testing.assert_array_equal(sub * 2.0 ** 24 / 4.0 ** j, (w >> (2 * m)) & 3)
    assert 2.0 ** planes.denorm_scale_log2(m) == 4.0 ** -j * 2.0 ** 24 / 2.0 ** mk.DENORM_LOG2


def test_4bit_planes_are_the_codes():
  """KIVI-4 words (4 codes a uint16, plane m at bits 4m): planes 0-1 from w, 2-3 from w >> 8, masked with
  0x6400 (the codes themselves) or read as fp16 subnormals (c 16^j 2^-24); the 32-bit pair shift by 8 keeps
  bits 0-7; the once-per-tile factors are each slab's plane's 2^denorm_scale_log2."""
  words = jnp.asarray(np.random.default_rng(4).integers(0, 1 << 16, (128, 16)), jnp.uint16)
  w = np.asarray(words).astype(np.int64)
  assert planes.hi_shift(4) == 8 and planes.hi_shift(2) == 10
  hi = planes.shr_pairs(words, 8, interpret=True)
  np.testing.assert_array_equal(np.asarray(hi).astype(np.int64) & 255, w >> 8)
  for m in range(4):
    code = (w >> (4 * m)) & 15
    np.testing.assert_array_equal(np.asarray(planes.plane_masked(words, hi, m, bits=4), np.float32), code)
    j = m % 2
    sub = np.asarray(planes.plane_denorm(words, hi, m, bits=4), np.float64)
    np.testing.assert_array_equal(sub * 2.0 ** 24 / 16.0 ** j, code)
    assert 2.0 ** planes.denorm_scale_log2(m, 4) == 16.0 ** -j * 2.0 ** 24 / 2.0 ** mk.DENORM_LOG2
  for bits in (2, 4):
    f, z = planes.denorm_factors(256, bits)
    want = [2.0 ** planes.denorm_scale_log2(i % (16 // bits), bits) for i in range(8)]
    np.testing.assert_array_equal(np.asarray(f).reshape(2, 8, 16), np.broadcast_to(np.asarray(want)[None, :, None], (2, 8, 16)))
    assert z == 2.0 ** -mk.DENORM_LOG2


def test_32bit_shift_leaves_planes_5_to_7_intact():
  """`Options.shift32`: each pair of words shifted as one 32-bit word puts the high word's bits into the
  low word's bits 6-15, never into bits 0-5, which are all planes 5-7 read."""
  words = jnp.asarray(np.random.default_rng(3).integers(0, 1 << 16, (128, 16)), jnp.uint16)
  pairs = np.asarray(planes.shr10_pairs(words, interpret=True)).astype(np.int64)
  w = np.asarray(words).astype(np.int64)
  np.testing.assert_array_equal(pairs & 63, w >> 10)
  assert (pairs[:, 0::2] >> 6 == w[:, 1::2] & 1023).all()  # the low words do hold the high words' bits
  np.testing.assert_array_equal(pairs[:, 1::2], w[:, 1::2] >> 10)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])  # converted once per tile / read in place
def test_subnormal_planes_bound_the_scales(dtype):
  """unpack="denorm" keeps (c s + z) / 2^DENORM_LOG2 in fp16: scales below 2^(DENORM_LOG2 - 8) are
  exact to the subnormal floor; above it plane 0's scale overflows and the states are NaN, not wrong."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(256, 200))
  ks, kz, vs, vz = (x.astype(dtype) for x in (ks, kz, vs, vz))
  bound = 2.0 ** (mk.DENORM_LOG2 - 8)
  for scale, finite in ((0.9 * bound, True), (1.1 * bound, False)):
    ks2 = ks.at[0, 0, 0, 3].set(scale / 64)  # one key channel's group in the first sequence
    vs2 = vs.at[0, 0, 5].set(scale)  # one value token's scale
    out = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks2, kz, mk.pack_values(vc), vs2, vz, num_splits=2,
                          interpret=True, variant=DENORM_FIXED)
    assert np.isfinite(np.asarray(out[0][0, 0, 0])).all() == finite
    if finite:
      _check_states(out, mk.reference_states(q_t, ln, kc, ks2, kz, vc, vs2, vz, num_splits=2), DENORM_FIXED)


@pytest.mark.parametrize("key_scale,value_scale,finite,xwarp", [
    (None, None, True, False), (30.0, 100.0, True, False), (1e4, None, True, False), (None, 120.0, False, False),
    (30.0, 100.0, True, True)])
def test_fp8_mma_ranges(key_scale, value_scale, finite, xwarp):
  """`Options.fp8_mma` (over fixed splits, as the reference): the keys' B is scaled per tile and column by its
  largest value, so any key scale is in e4m3's range, and B's values within ~500x of that largest keep about
  bf16's 8 bits (a channel's scale 100x the others' here; at 3e4x, 1e4, only the states' finiteness is
  checked: the others lose bits). Value scales below `mosaic_kivi_fp8.SCALE_LIMIT` (112) are in range; at or
  above it the states are NaN (e4m3's conversion would saturate: wrong, silently). 4 live query rows."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case(lengths=(256, 200))
  ks2 = ks if key_scale is None else ks.at[0, 0, 0, 3].set(key_scale)
  vs2 = vs if value_scale is None else vs.at[0, 0, 5].set(value_scale)
  out = mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks2, kz, mk.pack_values(vc), vs2, vz, num_splits=2,
                        interpret=True, live_rows=4, variant=dataclasses.replace(
                            DENORM_FIXED, fp8_mma=True, manual_barriers=xwarp, xwarp_split=xwarp))
  assert np.isfinite(np.asarray(out[0][0, 0])).all() == finite
  if finite and (key_scale or 0) < 1e3:
    ref = mk.reference_states(q_t, ln, kc, ks2, kz, vc, vs2, vz, num_splits=2)
    (o, m, l), (ro, rm, rl) = ([np.asarray(x)[..., :4] for x in r] for r in (out, ref))
    seen = rl > 0
    np.testing.assert_allclose(m[seen], rm[seen], rtol=2e-3, atol=3e-3)
    assert test_base.relative_error(l, rl) < 3e-3 and test_base.relative_error(o, ro) < 3e-3


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None,
                    reason="Mosaic GPU's CUDA lowering needs jax-cuda12-plugin")
@pytest.mark.parametrize("variant", mk.VARIANTS)
def test_lowers_for_cuda_with_registers_as_the_a_operand(variant):
  q_t, ln, kc, ks, kz, vc, vs, vz = _case()
  fn = jax.jit(lambda *a: mk.kivi2_states(*a, num_splits=2, variant=variant))
  text = fn.trace(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "kvjax_mosaic_kivi2" in text


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None,
                    reason="Mosaic GPU's CUDA lowering needs jax-cuda12-plugin")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_lowers_for_cuda_with_the_window_as_one_more_program(dtype):
  """The residual window's program (ring keys from shared memory against q = hi + lo in the ring's
  dtype, the quantized tile as register A, the values as a transposed shared-memory A) lowers."""
  q_t, ln, kc, ks, kz, vc, vs, vz = _case()
  ring = jnp.ones(q_t.shape[:2] + (mk.TILE, 128), dtype)
  fn = jax.jit(lambda *a: mk.kivi2_states(*a[:8], num_splits=2, variant=mosaic_decode.DEFAULT_VARIANT,
                                          window=(a[8], ring, ring, 2)))
  text = fn.trace(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz, ln + 128).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "kvjax_mosaic_kivi2" in text
  merged = jax.jit(lambda *a: mk.kivi2_states(*a[:8], num_splits=2, variant=mosaic_decode.DEFAULT_VARIANT,
                                              window=(a[8], ring, ring, 2), merged=(8, jnp.bfloat16)))
  text = merged.trace(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc), vs, vz, ln + 128).lower(
      lowering_platforms=("cuda",)).as_text()  # the 3 states merged in a cluster
  assert "kvjax_mosaic_kivi2" in text


def test_bench_script_checks_and_times_in_the_interpreter(tmp_path, monkeypatch):
  """`benchmarks/mosaic_kivi_bench.py` end to end on the CPU (interpreter): the check passes and a
  timed row per split count lands in its JSON."""
  import os
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
  import mosaic_kivi_bench as bench
  monkeypatch.setattr(bench.dk, "steps_for", lambda us: 1)  # one interpreted step, one cache copy
  monkeypatch.setattr(bench.dk, "n_sets", lambda nbytes: 1)
  out = tmp_path / "m.json"
  res = bench.main(["--points", "1:512", "--splits", "2,3,4", "--stages", "2", "--peers", "", "--reps", "1",
                    "--variants", "exact,dequant2", "--stream-gb", "0.01", "--interpret", "--out", str(out)])
  assert res["meta"]["check_worst_rel_err"] < 1e-2
  # 3 splits do not divide 4 tiles; dequant2 takes tiles in pairs, so not 4 splits of one tile either
  assert [(r["options"]["variant"], r["options"]["num_splits"]) for r in res["rows"]] == [
      ("exact", 2), ("exact", 4), ("dequant2", 2)]
  assert json.loads(out.read_text())["rows"] == res["rows"]
  assert out.exists() and res["rows"][0]["us"] > 0 and res["rows"][0]["bytes_read"] > 0
  # a cache holding a quarter of its capacity (`--fill`), bf16 scales: bytes counted for the tokens held
  part = bench.main(["--points", "1:512", "--splits", "2", "--peers", "", "--reps", "1", "--no-check",
                     "--variants", "dequant_mask_s16_stop", "--stream-gb", "0.01", "--interpret", "--fill", "0.25",
                     "--scale-dtype", "bfloat16", "--out", str(tmp_path / "p.json")])["rows"]
  assert [(r["options"]["fill"], r["options"]["scale_dtype"]) for r in part] == [(0.25, "bfloat16")]
  assert part[0]["bytes_read"] == res["rows"][0]["bytes_read"] / 2  # 128 tokens held against 512 - 256
