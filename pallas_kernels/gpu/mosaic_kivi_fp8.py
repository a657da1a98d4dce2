"""The KIVI-2 tile step on e4m3 WGMMAs (`Options.fp8_mma`, session 37): the pieces of `mosaic_fp8_planes`
put together for `mosaic_kivi.kivi2_states` (KIVI-2 G=128 at head_dim 128, at most 8 query rows).

Per 128-token tile, with the code words as e4m3 A operands (4 planes of k = 32, 8 WGMMAs a product):

  logits [128 tok, 8] = ((A_K . B_K)[:, hi] + (A_K . B_K)[:, lo]) 2^et + q . z_K   (et per tile and column)
  B_K = e4m3 words of q s_K 2^-et   (et puts a bound on each column's |B_K| in [128, 256): the column's
                                     largest |q| x the tile's largest scale, that one read by every warp)
  o' [128 ch, 8]     = o' alpha + (A_V . B_V)[:, hi] + (A_V . B_V)[:, lo]   (o = o' 2^-VALUE_SCALE_LOG2 at the end)
  B_V = e4m3 words of p s_V 2^VALUE_SCALE_LOG2, and sum_t p z_V kept as lazy per-thread sums

Session 38 (`Options.xwarp_split`, `Options.ptx_words`): q . z's and the softmax max's cross-warp reductions
split around the step's own barriers (`mosaic_xwarp`), B's words from one PTX block a register pair.

Each product accumulates fresh (the fp8 accumulator keeps fewer bits than f32) and is added in f32.
Ranges: e4m3 holds 2^-9 to 448, and the lo terms stay in its normal range (2^-6 up) only if B's largest values
are near the top: B_K's bound is put in [128, 256) per tile and column, whatever the scales (values within ~2^9
of it keep ~8 bits: the bound is max |q| max s, at or above max |q s|). B_V = p s 2^9 2^-7 / f <= 4 s
(p <= 1): value scales below SCALE_LIMIT = 112 are in range (unpack="denorm"'s fp16 build takes below 64); at
or above it the states are NaN (checked per tile). The probabilities' range is fixed: small p s lose
relative precision there, but their terms are small against o's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu import mosaic_fp8_planes as f8
from pallas_kernels.gpu import mosaic_xwarp as xw

__all__ = ["VALUE_SCALE_LOG2", "SCALE_LIMIT", "query_halves", "scales_max", "scratch", "make_step", "finish"]

VALUE_SCALE_LOG2 = -7  # B_V = p s 2^9 / f 2^this
SCALE_LIMIT = 448.0 / 4  # B_V <= 4 s: a value scale at or above this makes the states NaN, not wrong


def _pow2(x):
  """2^x for int32 x in [-126, 127] (from the exponent bits: Mosaic GPU lowers no floor / exp2 of ints)."""
  return lax.bitcast_convert_type((x + 127) << 23, jnp.float32)


def _exponent(x):
  """floor(log2(x)) of f32 x >= 0 from its exponent bits, clipped to [-100, 100] (0 gives -100)."""
  return jnp.clip((lax.bitcast_convert_type(x, jnp.int32) >> 23) - 127, -100, 100)


def _checked(s):
  """A tile's value scales, NaN at or above SCALE_LIMIT (e4m3's conversion saturates: wrong, silently)."""
  return jnp.where(s < SCALE_LIMIT, s, jnp.nan)


def query_halves(q16_ref, width: int, *, interpret: bool):
  """The program's query for B_K: (q_lo, q_hi [64, width] f32: channels 0-63 and 64-127; top [width]: each
  column's largest magnitude), from the fp16 query [128, 16] in shared memory."""
  q = q16_ref[...] if interpret else plgpu.load(q16_ref, (), layout=plgpu.Layout.WGMMA)
  q = q.astype(jnp.float32)[:, :width]
  return q[:64], q[64:], jnp.max(jnp.abs(q), axis=0)


def scales_max(ref, width: int, *, interpret: bool, redux: bool = False):
  """The largest of a tile's 128 scales (ref [128], shared memory; KIVI's, >= 0), as a [width] column vector:
  each warp reads all of them (4 a lane) and reduces by 5 shuffles and maxima, no barrier. redux
  (`Options.redux_max`): the lanes' maxima as f32 bit patterns reduced by one `redux.sync.max.s32` (REDUX), not
  the shuffles: as signed integers floats keep their order where one is >= 0, so the same value (NaN wins).
  Compiled for an H200 (KIVI-2 G=128, B=8 32k): 562 -> 554 loop SASS (session 41)."""
  if interpret:
    return jnp.full((width,), jnp.max(ref[...].astype(jnp.float32)), jnp.float32)
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import arith, vector  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import FragmentedArray, utils  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import fragmented_array as fa  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                     return_type=plgpu.ShapeDtypeStruct((width,), jnp.float32, layout=plgpu.Layout.WGMMA.reduce(0)))
  def f(ctx, r):
    del ctx
    f32, index, i32 = ir.F32Type.get(), ir.IndexType.get(), ir.IntegerType.get_signless(32)
    elt = ir.MemRefType(r.type).element_type
    lane = arith.remui(utils.thread_idx(), arith.constant(i32, 32))
    start = arith.index_cast(index, arith.muli(lane, arith.constant(i32, 4)))
    v = vector.load(ir.VectorType.get((4,), elt), r, [start])
    m = None
    for i in range(4):
      x = vector.extract(v, [], [i])
      x = x if elt == f32 else arith.extf(f32, x)
      m = x if m is None else arith.maximumf(m, x)
    if redux:
      bits = utils.redux(arith.bitcast(i32, m), arith.constant(i32, 0xFFFFFFFF), utils.ReductionKind.MAX)
      m = arith.bitcast(f32, bits)
    else:
      m = utils.warp_tree_reduce(m, arith.maximumf, 32)
    return FragmentedArray.splat(m, (width,), fa.WGMMA_COL_LAYOUT)
  return f(ref)


def scratch(n: int, width: int, *, xwarp: bool, interpret: bool):
  """The step's shared buffers: B_K's and B_V's (`f8.b_buffers(n)`), with `xwarp` the two reductions'
  [4, width] scratch."""
  return (f8.b_buffers(n, interpret=interpret),) * 2 + ((xw.scratch(width),) * 2 if xwarp else ())


def make_step(*, mma, softmax, l_update, width: int, interpret: bool, manual_barriers: bool, xwarp: bool = False,
              ptx_words: bool = False, redux_max: bool = False, f16_rest: bool = False):
  """step(length, first, bufs, query, lo0) -> the pipeline's step over one tile; bufs: `scratch`'s buffers,
  query: `query_halves`' output. mma / softmax / l_update: `kivi2_states`' own. xwarp (`Options.xwarp_split`):
  q . z's cross-warp sum split around the key commit's barrier, the softmax's max with one barrier, not two
  (`mosaic_xwarp`); the values' commit and the step's last barrier keep each scratch from being rewritten
  before it is read; that last barrier without a proxy fence. ptx_words (`Options.ptx_words`): B's words from
  one PTX block a register pair (`f8.e4m3_words(..., interpret=False)`), else from jnp's conversions.
  redux_max (`Options.redux_max`): the tile's largest key scale through `scales_max(..., redux=True)`.
  f16_rest (`Options.f16_rest`): B's lo words from the rest in fp16 (`f8.e4m3_words(..., f16_rest=True)`)."""
  jnp_words = interpret or not ptx_words
  if xwarp and not manual_barriers:
    raise ValueError("xwarp needs manual_barriers (the step's own barriers order its scratch)")

  def build(length, first, bufs, query, lo0):
    bk, bv, *xs = bufs
    q_lo, q_hi, q_top = query
    load = (lambda ref: ref[...]) if interpret else (
        lambda ref: plgpu.load(ref, (), layout=plgpu.Layout.WGMMA))
    row = (lambda ref: ref[...]) if interpret else (
        lambda ref: plgpu.load(ref, (), layout=plgpu.Layout.WGMMA.reduce(1)))

    def product(words_ref, views):
      by = f8.words_as_bytes(load(words_ref), interpret=interpret)
      pairs = [(lambda p=p: f8.fp8_plane(by, p, interpret=interpret), f8.b_slab(views, p, interpret=interpret))
               for p in range(f8.PLANES)]
      acc = mma(jnp.zeros((by.shape[0], 2 * width), jnp.float32), pairs)
      return acc[:, :width] + acc[:, width:]

    def step(idx, kc_s, vc_s, ks_s, kz_s, vs_s, vz_s, carry):
      o, m_prev, l_prev, cv = carry
      fac = f8.word_factors()
      with jax.named_scope("kprep"):
        y_lo, y_hi = (q * (f8.rows_half(ks_s, i, interpret=interpret) * fac)[:, None]
                      for i, q in enumerate((q_lo, q_hi)))
        # each column's bound on |B_K| (its largest |q| x the tile's largest scale x 2^9) into [128, 256)
        s_top = scales_max(ks_s, q_top.shape[0], interpret=interpret, redux=redux_max)
        et = _exponent(q_top * s_top * 2.0 ** 9) - 7
        f8.store_b(bk, f8.e4m3_words(y_lo * _pow2(-et)[None, :], y_hi * _pow2(-et)[None, :],
                                     interpret=jnp_words, f16_rest=f16_rest), interpret=interpret)
        z_lo, z_hi = (f8.rows_half(kz_s, i, interpret=interpret) for i in range(2))
        qz = q_lo * z_lo[:, None] + q_hi * z_hi[:, None]  # q . z's terms, summed over the rows (channels)
        if xwarp:  # each warp's part now, the 4 parts after the commit's barrier
          xw.warp_partials(qz, xs[0], "add", interpret=interpret)
        else:
          dz = jnp.sum(qz, axis=0)
        plgpu.commit_smem()
      with jax.named_scope("kmma"):
        if xwarp:
          dz = xw.combine(xs[0], qz.shape[1], "add", barrier=False, interpret=interpret)
        sc = product(kc_s, bk) * _pow2(et)[None, :] + dz[None, :]
      with jax.named_scope("softmax"):
        col_max = functools.partial(xw.reduce_rows, ref=xs[1], op="max", interpret=interpret) if xwarp else None
        (p,), m_new, alpha = softmax([sc], first + idx[0], m_prev, length, lo0, col_max=col_max)
      with jax.named_scope("vprep"):
        vfac = fac * 2.0 ** VALUE_SCALE_LOG2
        v_lo, v_hi = (_checked(f8.rows_half(vs_s, i, interpret=interpret)) * vfac for i in range(2))
        f8.store_b(bv, f8.e4m3_words(p[:64] * v_lo[:, None], p[64:] * v_hi[:, None], interpret=jnp_words,
                                     f16_rest=f16_rest), interpret=interpret)
        cv = cv * alpha[None, :] + p * row(vz_s).astype(jnp.float32)[:, None]  # sum_t p z_t, lazily
        l_new = l_update(l_prev, alpha, p)
        plgpu.commit_smem()
      with jax.named_scope("vmma"):
        o = (o[0] * alpha[None, :] + product(vc_s, bv),)  # o x 2^VALUE_SCALE_LOG2 through the loop (`finish`)
      if manual_barriers:  # every thread is done with this slot before the pipeline refetches into it (xwarp:
        # a barrier alone: no smem write since the values' commit to make visible to the async proxy)
        xw.barrier(interpret=interpret) if xwarp else plgpu.commit_smem()
      return o, m_new, l_new, cv
    return step
  return build


def finish(o, cv):
  """The program's o [128 ch, width] (kept x 2^VALUE_SCALE_LOG2 through the loop: one FMUL an element a tile
  less) plus the values' zero term (the lazy sums over the tokens)."""
  return o * 2.0 ** -VALUE_SCALE_LOG2 + jnp.sum(cv, axis=0)[None, :]

