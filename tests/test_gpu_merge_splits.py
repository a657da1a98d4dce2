"""The flash-decoding split merge (`pallas_kernels.gpu.merge`, against the jnp `decode.combine`) and
the split-count rule of the tiled-value kernels (`ops.tiled_splits`), in interpret mode on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import cache as cache_lib, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import decode, merge, ops

INTERPRET = jax.default_backend() != "gpu"


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("ns,rows,m_rows", [(1, 1, 16), (8, 3, 16), (9, 4, 16), (33, 12, 16), (17, 32, 32)])
def test_merge_states_matches_combine(ns, rows, m_rows, transposed):
  """The one-kernel split merge equals the jnp reference, including splits that saw nothing
  (m = NEG, l = 0), a (b, k) that saw nothing at all (zero output), and a tail chunk of splits;
  transposed: the states' o as [B, K, NS, H, M] (the Mosaic kernels')."""
  rng = np.random.default_rng(ns * 100 + rows)
  o = jnp.asarray(rng.normal(size=(2, 3, ns, m_rows, 32)), jnp.float32)
  m = jnp.asarray(rng.normal(size=(2, 3, ns, m_rows)) * 8, jnp.float32)
  l = jnp.asarray(rng.uniform(0.5, 4.0, size=(2, 3, ns, m_rows)), jnp.float32)
  m, l = m.at[0, 0].set(decode.NEG), l.at[0, 0].set(0.0)
  m, l = m.at[1, 2, -1].set(decode.NEG), l.at[1, 2, -1].set(0.0)
  ref = np.asarray(decode.combine(o, m, l, rows))
  for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)):
    o_in = o.swapaxes(-1, -2) if transposed else o
    out = merge.merge_states(o_in, m, l, rows, dtype, interpret=INTERPRET, transposed=transposed)
    assert out.shape == (2, 3, merge.out_rows(rows), 32) and out.dtype == dtype
    out = np.asarray(out[:, :, :rows], np.float32)
    assert np.abs(out[0, 0]).max() == 0.0
    assert test_base.relative_error(out, ref) < tol, dtype


def test_merge_states_checks_its_inputs():
  o, m = jnp.zeros((1, 2, 3, 16, 32)), jnp.zeros((1, 2, 3, 16))
  with pytest.raises(ValueError, match=r"rows must be in \[1, 16\].*got 17"):
    merge.merge_states(o, m, m, 17, jnp.float32, interpret=True)
  with pytest.raises(ValueError, match=r"m and l must be \[B, K, NS, M\] = \(1, 2, 3, 16\), got \(1, 2, 3, 8\)"):
    merge.merge_states(o, m[..., :8], m, 4, jnp.float32, interpret=True)
  assert [merge.out_rows(r) for r in (1, 2, 3, 4, 5, 12, 16)] == [1, 2, 4, 4, 8, 16, 16]
  with pytest.raises(ValueError, match=r"cols must be a power of two dividing the head dim 32, got 24"):
    merge.merge_states(o, m, m, 4, jnp.float32, interpret=True, cols=24)


def test_merge_grid_rules():
  """Columns narrow until ~TARGET_PROGRAMS programs (not below MIN_COLS); o is loaded in one piece
  when [NS', R, cols] fits LOAD_ELEMS, else in power-of-two chunks of splits."""
  assert [merge.merge_cols(b, 8, 128) for b in (1, 2, 8, 16, 64)] == [16, 16, 64, 128, 128]
  assert merge.merge_cols(1, 1, 64) == 16 and merge.merge_cols(1, 4, 256) == 16
  assert merge.chunk_splits(8, 4, 128) == 8 and merge.chunk_splits(9, 4, 64) == 16
  assert merge.chunk_splits(33, 4, 128) == 8 and merge.chunk_splits(33, 12, 16) == 16
  assert merge.chunk_splits(1, 32, 256) == 1 and merge.chunk_splits(5, 32, 256) == 1


MERGE_CASES = [("fp8_e4m3", 1, 4), ("kivi2", 3, 4), ("fp8_e4m3_static", 1, 4), ("bf16", 3, 1)]


@pytest.mark.parametrize("fmt_name,t,rep", MERGE_CASES, ids=[f"{f}-T{t}-rep{r}" for f, t, r in MERGE_CASES])
def test_pallas_merge_in_decode_attention(fmt_name, t, rep):
  """decode_attention with the merge kernel (the GPU default) equals the XLA merge: rows 4 (a power
  of two), 12 (sliced from 16) and 3; the static-FP8 value scale applied after the merge."""
  q, c = test_base.make_case(fmt_name, [0, 1, 130, test_base.CAPACITY], num_queries=t, rep=rep)
  a = ops.decode_attention(q, c, interpret=INTERPRET, pallas_merge=True, num_splits=3)
  b = ops.decode_attention(q, c, interpret=INTERPRET, pallas_merge=False, num_splits=3)
  assert a.shape == b.shape == q.shape and a.dtype == q.dtype
  np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=2e-2)
  assert np.abs(np.asarray(a[0], np.float32)).max() == 0.0


@pytest.mark.parametrize("b,ctx,want", [(8, 1024, 4), (8, 2048, 4), (16, 1024, 2), (1, 4096, 16),
                                        (1, 8192, 16), (1, 1024, 16), (2, 4096, 16), (4, 4096, 8),
                                        (8, 4096, 8), (8, 32768, 8), (1, 32768, 66),
                                        (8, 131072, 8), (64, 32768, 1), (1, 256, 4)])
def test_tiled_caches_split_to_one_wave(b, ctx, want):
  """Tiled-value caches (the GPU default): one wave of programs, half a wave (at most 16 splits) for
  small caches (session-9 sweep), never more splits than blocks; token-major caches keep `quant_target`."""
  c = cache_lib.init_cache(formats.preset("fp8_e4m3"), b, 8, ctx, 128, value_tile=64)
  assert ops.plan_for(c, 1, 4).num_splits == want == ops.tiled_splits(b, 8, ctx // 64)
  assert ops.plan_for(c, 1, 4, num_splits=5).num_splits == 5
  c0 = cache_lib.init_cache(formats.preset("fp8_e4m3"), b, 8, ctx, 128, value_tile=0)
  assert ops.plan_for(c0, 1, 4).num_splits == ops.default_splits(b, 8, ctx // 64, ops.quant_target(b, 8, ctx // 64))
