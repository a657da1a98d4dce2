"""`pallas_kernels.gpu.mosaic_groups` (the G=32 scale fragments of the Mosaic KIVI-2 kernel): the
interpreter's fragments equal the scales a 32-row group and a k column pick, from each tile layout; the
"packed" order is a permutation that `regroup` writes and the fragments read back; bad inputs are refused.
(The native `inline_mgpu` paths run in the kernel's native tests, `tests/test_mosaic_decode.py`.)"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pallas_kernels.gpu import mosaic_groups as mg


class _Ref:
  """A stand-in for a kernel ref in the interpreter paths: shape, [...] reads and writes."""

  def __init__(self, x):
    self.x = jnp.asarray(x)
    self.shape = self.x.shape

  def __getitem__(self, idx):
    return self.x[idx]

  def __setitem__(self, idx, value):
    assert idx is Ellipsis
    self.x = jnp.asarray(value)


def _rows():
  """[group, column] scales: distinct values, exact in fp16."""
  return (np.arange(512, dtype=np.float32).reshape(4, 128) / 8).astype(np.float16)


def _in(layout, rows):
  if layout == "rows":
    return rows
  if layout == "tokens":  # entry 4 x + g
    return rows.T.reshape(4, 128)
  out = np.empty_like(rows)  # packed: column x at packed_position(x)
  out[:, mg.packed_position(np.arange(128))] = rows
  return out


def test_packed_position_permutes_each_16_columns():
  pos = mg.packed_position(np.arange(128))
  assert sorted(pos) == list(range(128))
  assert list(pos[:16]) == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
  # a thread's 4 columns of a slab (2 q, 2 q + 1, 2 q + 8, 2 q + 9) are adjacent: positions 4 q .. 4 q + 3
  for q in range(4):
    assert list(pos[[2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9]]) == list(range(4 * q, 4 * q + 4))


@pytest.mark.parametrize("layout", ["rows", "tokens", "packed"])
@pytest.mark.parametrize("m", [0, 3, 7])
def test_fragment_picks_group_and_column(layout, m):
  rows = _rows()
  frag = np.asarray(mg.group_fragment(_Ref(_in(layout, rows)), m, layout=layout, interpret=True))
  assert frag.shape == (128, 16) and frag.dtype == np.float16
  r, c = np.meshgrid(np.arange(128), np.arange(16), indexing="ij")
  np.testing.assert_array_equal(frag, rows[r // 32, 16 * m + c])


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["rows", "tokens"]), st.integers(0, 2 ** 31 - 1), st.booleans())
def test_regroup_then_fragment_is_the_scaled_source(layout, seed, with_factors):
  rng = np.random.default_rng(seed)
  rows = rng.uniform(0.05, 0.2, (4, 128)).astype(np.float32)
  factors = tuple(float(2.0 ** e) for e in rng.integers(-4, 10, 8)) if with_factors else None
  dst = _Ref(jnp.zeros((4, 128), jnp.float16))
  mg.regroup(_Ref(jnp.asarray(_in(layout, rows), jnp.bfloat16)), dst, factors, layout=layout, interpret=True)
  scale = np.repeat(np.asarray(factors or (1.0,) * 8, np.float32), 16)[None, :]
  want = (np.asarray(jnp.asarray(rows, jnp.bfloat16), np.float32) * scale).astype(np.float16)
  np.testing.assert_array_equal(np.asarray(dst.x), _in("packed", want))
  for m in range(8):
    frag = np.asarray(mg.group_fragment(dst, m, layout="packed", interpret=True))
    np.testing.assert_array_equal(frag, np.repeat(want[:, 16 * m:16 * m + 16], 32, axis=0))


def test_bad_inputs_are_refused():
  ok = _Ref(jnp.zeros((4, 128), jnp.float16))
  with pytest.raises(ValueError, match=r"ref must hold one tile's scales, \[4 k, 128 j\] .*got \(512,\) at \(0, 0\)"):
    mg.group_fragment(_Ref(jnp.zeros((512,))), 0, layout="rows", interpret=True)
  with pytest.raises(ValueError, match=r"got \(4, 256\) at \(0, 256\)"):  # a window past the ref
    mg.group_fragment(_Ref(jnp.zeros((4, 256))), 0, layout="packed", interpret=True, offset=(0, 256))
  with pytest.raises(ValueError, match=r"layout 'tokens8' takes a \[8, 128\] ref"):
    mg.regroup(ok, _Ref(jnp.zeros((8, 128))), layout="tokens8", interpret=True, offset=(4, 0))
  with pytest.raises(ValueError, match="group_fragment reads 'rows', 'tokens' or 'packed'"):
    mg.group_fragment(_Ref(jnp.zeros((8, 128))), 0, layout="tokens8", interpret=True)
  with pytest.raises(ValueError, match="layout must be one of"):
    mg.group_fragment(ok, 0, layout="cols", interpret=True)
  with pytest.raises(ValueError, match=r"m \(the k-slab of 16 columns\) must be in \[0, 8\), got 8"):
    mg.group_fragment(ok, 8, layout="rows", interpret=True)
  with pytest.raises(ValueError, match="regroup's src must be 'rows', 'tokens' or 'tokens8', got 'packed'"):
    mg.regroup(ok, ok, layout="packed", interpret=True)
  with pytest.raises(ValueError, match=r"dst must hold one tile's scales"):
    mg.regroup(ok, _Ref(jnp.zeros((128, 4))), layout="rows", interpret=True)
  with pytest.raises(ValueError, match=r"factors must hold one float per k-slab \(8\), got \(1.0, 2.0\)"):
    mg.regroup(ok, ok, (1.0, 2.0), layout="rows", interpret=True)


@pytest.mark.parametrize("half", [0, 1])
def test_wide_tiles_regroup_and_read_one_window(half):
  """Head_dim 256 at G=32: a key tile's scales [4 groups, 256 channels] ("rows") and a value tile's [128 tokens,
  8 groups] ("tokens8", entry 8 x + g) regrouped per 128-channel half into a packed [4, 256] / [8, 128] block,
  each half's window read back by `group_fragment`; the other half's window is left as it was."""
  rng = np.random.default_rng(half)
  factors = tuple(float(2.0 ** e) for e in rng.integers(-4, 10, 8))
  f = np.repeat(np.asarray(factors, np.float32), 16)[None, :]
  keys = rng.uniform(0.05, 0.2, (4, 256)).astype(np.float32)  # [group, channel]
  dst = _Ref(jnp.full((4, 256), 7.0, jnp.float16))
  mg.regroup(_Ref(keys), dst, factors, layout="rows", interpret=True, offset=(0, 128 * half))
  want = (keys[:, 128 * half:128 * half + 128] * f).astype(np.float16)
  np.testing.assert_array_equal(np.asarray(dst.x)[:, 128 * half:128 * half + 128], _in("packed", want))
  assert (np.asarray(dst.x)[:, 128 * (1 - half):128 * (2 - half)] == 7.0).all()
  for m in (0, 5):
    frag = np.asarray(mg.group_fragment(dst, m, layout="packed", interpret=True, offset=(0, 128 * half)))
    np.testing.assert_array_equal(frag, np.repeat(want[:, 16 * m:16 * m + 16], 32, axis=0))
  values = rng.uniform(0.05, 0.2, (128, 8)).astype(np.float32)  # [token, group]: groups 4 u .. of half u
  dst = _Ref(jnp.zeros((8, 128), jnp.float16))
  mg.regroup(_Ref(values.reshape(8, 128)), dst, factors, layout="tokens8", interpret=True, offset=(4 * half, 0))
  want = (values[:, 4 * half:4 * half + 4].T * f).astype(np.float16)  # [group, token]
  for m in (0, 7):
    frag = np.asarray(mg.group_fragment(dst, m, layout="packed", interpret=True, offset=(4 * half, 0)))
    np.testing.assert_array_equal(frag, np.repeat(want[:, 16 * m:16 * m + 16], 32, axis=0))


@pytest.mark.parametrize("tiles", [1, 2])
@pytest.mark.parametrize("with_factors", [False, True])
def test_split_halves_makes_each_half_contiguous(tiles, with_factors):
  """Head_dim 256: entry 2 x + u of a tile (token x, half u; the cache's [S, 2]) lands at 128 u + x, times the
  factor of x's 16-token slab."""
  rng = np.random.default_rng(tiles)
  src = rng.uniform(-2, 2, (tiles, 128, 2)).astype(np.float32)
  factors = tuple(float(2.0 ** -i) for i in range(8)) if with_factors else None
  dst = _Ref(np.zeros(tiles * 256, np.float16))
  mg.split_halves(_Ref(src.reshape(-1)), dst, factors, interpret=True)
  f = np.repeat(np.asarray(factors or (1.0,) * 8, np.float32), 16)[None, :, None]
  want = (src * f).transpose(0, 2, 1).reshape(-1).astype(np.float16)
  np.testing.assert_array_equal(np.asarray(dst.x), want)


def test_split_halves_refuses_bad_inputs():
  with pytest.raises(ValueError, match=r"src and dst must be \[n x 256\] alike, got \(128,\)"):
    mg.split_halves(_Ref(np.zeros(128)), _Ref(np.zeros(128)), interpret=True)
  with pytest.raises(ValueError, match="one float per k-slab"):
    mg.split_halves(_Ref(np.zeros(256)), _Ref(np.zeros(256)), (1.0,), interpret=True)
