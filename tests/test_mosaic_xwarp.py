"""`pallas_kernels.gpu.mosaic_xwarp` (session 38): a column reduction over a warpgroup's rows in two halves
(each warp's part into shared memory, then the 4 parts combined after a barrier) equals jnp's, for sums and
maxima, 64 and 128 rows, 8 and 16 columns; in Mosaic GPU's interpreter here, compiled on an H100 / H200."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu import mosaic_xwarp as xw

NATIVE = jax.default_backend() == "gpu"


@functools.partial(jax.jit, static_argnames=("op",))
def _reduced(x, op: str):
  """[M, W] f32 -> [M, W]: each row the column reduction (`reduce_rows`: warp_partials, combine after a
  barrier)."""
  m, w = x.shape
  interpret = not NATIVE

  def body(x_g, o_g, x_s, o_s, part, bar):
    plgpu.copy_gmem_to_smem(x_g, x_s, bar)
    plgpu.barrier_wait(bar)
    v = x_s[...] if interpret else plgpu.load(x_s, (), layout=plgpu.Layout.WGMMA)
    r = xw.reduce_rows(v, part, op, interpret=interpret)
    o_s[...] = jnp.broadcast_to(r[None, :], (m, w))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_g)
    plgpu.wait_smem_to_gmem(0)

  kw = {"interpret": plgpu.InterpretGPUParams()} if interpret else {}
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((m, w), jnp.float32),
                      scratch_types=[plgpu.SMEM((m, w), jnp.float32), plgpu.SMEM((m, w), jnp.float32),
                                     xw.scratch(w), plgpu.Barrier(num_arrivals=1)],
                      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
                      **kw)(x)


@pytest.mark.parametrize("op", xw.OPS)
@pytest.mark.parametrize("m,w", [(64, 8), (128, 8), (128, 16)])
def test_two_half_reduction_equals_jnp(op, m, w):
  x = jax.random.normal(jax.random.PRNGKey(m + w), (m, w), jnp.float32) * 3.0
  x = x.at[37, 1].set(50.0).at[m - 1, w - 1].set(-40.0)  # a row far from warp 0's; the last warp's last row
  got = np.asarray(_reduced(x, op))
  want = np.asarray(jnp.sum(x, axis=0) if op == "add" else jnp.max(x, axis=0))
  np.testing.assert_allclose(got, np.broadcast_to(want, (m, w)), rtol=1e-6, atol=1e-5)


def test_the_interpreter_groups_rows_by_warp():
  """Warp w's part holds rows 16 w .. 16 w + 15 of each 64-row block (WGMMA's layout)."""
  x = jnp.zeros((128, 8), jnp.float32).at[16 * 2 + 3, 0].set(1.0).at[64 + 16 * 2, 0].set(2.0).at[5, 4].set(7.0)
  part = np.zeros((xw.WARPS, 8), np.float32)  # any array-like ref
  xw.warp_partials(x, part, "add", interpret=True)
  got = part
  assert got[2, 0] == 3.0 and got[0, 4] == 7.0 and got.sum() == 10.0


def test_bad_inputs_are_refused():
  ref = np.zeros((xw.WARPS, 8), np.float32)
  with pytest.raises(ValueError, match="op='min': expected one of"):
    xw.warp_partials(jnp.zeros((64, 8)), ref, "min", interpret=True)
  with pytest.raises(ValueError, match="width=12: expected a positive multiple of 8"):
    xw.warp_partials(jnp.zeros((64, 12)), ref, "add", interpret=True)
  with pytest.raises(ValueError, match=r"x.shape=\(48, 8\): expected rows in multiples of 64"):
    xw.warp_partials(jnp.zeros((48, 8)), ref, "add", interpret=True)
  with pytest.raises(ValueError, match=r"ref.shape=\(4, 8\): expected \(4, 16\)"):
    xw.warp_partials(jnp.zeros((64, 16)), ref, "add", interpret=True)
  with pytest.raises(ValueError, match=r"ref.shape=\(4, 8\): expected \(4, 16\)"):
    xw.combine(ref, 16, "max", barrier=True, interpret=True)
  with pytest.raises(ValueError, match="width=0"):
    xw.scratch(0)
