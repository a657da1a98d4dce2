"""TPU (Pallas Mosaic) fused dequantize+attend decode: the wrapper around `kernel.py`.

`decode_attention(q, cache)` equals `kvjax.attention.decode_attention` for
every kvjax format it accepts (`plan.make_plan` lists the rules; anything else
raises `NotImplementedError`, which `kvjax.dispatch` turns into a fallback to
the XLA reference). The wrapper only touches small arrays per step:
  * q [B, N, T, H] -> [B, K, planes, rep*T, H/planes] f32, pre-multiplied by
    sm_scale and by static FP8 key scales (folded: the kernel never sees them);
  * per-token scales keep their granularity (one value per token, or per token
    and KIVI channel group) and are only re-laid out lane-major
    ``[B, K, groups, S]`` -- class-ordered ``[B, K, groups, 4, S/4]`` for the
    packed formats whose kernel visits tokens by ``t % 4``;
  * KIVI: the R keys of the newest quantized packing block are dequantized and
    merged with the residual keys (an O(R) gather, independent of context);
  * static FP8 value scales multiply the (tiny) output.
Lengths enter as scalar-prefetch arrays: nothing recompiles per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kvjax import quant
from kvjax.cache import KVCache
from kvjax.formats import FP8Spec
from pallas_kernels.tpu import kernel as kernel_lib
from pallas_kernels.tpu.plan import Plan, make_plan

__all__ = ["decode_attention", "make_plan"]

F32 = jnp.float32


def _static_scale(spec, scale, kv_heads, head_dim):
  """Static FP8 scale as [K, 1 or H] f32, or None."""
  if not (isinstance(spec, FP8Spec) and spec.static):
    return None
  s = jnp.asarray(scale, F32)  # [1, K|1, 1, H|1]
  return jnp.broadcast_to(s, (1, kv_heads, 1, s.shape[-1]))[0, :, 0, :]


def _token_major(scale, plan: Plan, class_order: bool):
  """[B, K, S, g] per-token scales -> lane-major [B, K, g, S] (class-ordered [.., g, 4, S/4])."""
  b, k, s, g = scale.shape
  if not class_order:
    return jnp.swapaxes(scale, 2, 3)  # g == 1 here: a reshape
  bs = plan.block
  x = scale.reshape(b, k, s // bs, bs // 4, 4, g)
  return x.transpose(0, 1, 5, 4, 2, 3).reshape(b, k, g, 4, s // 4)


def _kivi_tail_keys(cache: KVCache) -> jax.Array:
  """[B, K, R, H] f32: slot x holds key Lq + x (x < L % R, residual) or Lq - R + x (quantized)."""
  r_len = cache.fmt.residual
  n = 8 // cache.fmt.key.bits
  g = cache.fmt.key.group_size
  lengths = cache.lengths
  lq = lengths - lengths % r_len
  blk = jnp.maximum(lq // r_len - 1, 0)  # newest full packing block

  def take(a, rows):
    return jax.vmap(lambda x, i: jax.lax.dynamic_slice_in_dim(x, i * rows, rows, axis=1))(a, blk)
  qa = quant.QArray(codes=take(cache.k.codes, r_len // n), scale=take(cache.k.scale, r_len // g),
                    zero=take(cache.k.zero, r_len // g), spec=cache.fmt.key, block=r_len)
  kq = quant.dequantize(qa, F32)
  x = jnp.arange(r_len)[None, None, :, None]
  return jnp.where(x < (lengths % r_len)[:, None, None, None], cache.k_res.astype(F32), kq)


def _operands(q, cache: KVCache, plan: Plan):
  """(names, arrays, block specs) of the VMEM inputs, in kernel order."""
  p = plan
  b, kh, h, rows, bs = p.batch, p.kv_heads, p.head_dim, p.rows, p.block
  fmt = cache.fmt
  lim_blocks = lambda lim_ref, bi: jnp.maximum(jax.lax.div(lim_ref[bi] + bs - 1, bs) - 1, 0)

  def tok_spec(rows_per_block, cols):  # blocks along the token axis (-2)
    return pl.BlockSpec((None, None, rows_per_block, cols),
                        lambda bi, hi, j, lens, lim: (bi, hi, jnp.minimum(j, lim_blocks(lim, bi)), 0))

  def lane_spec(g):  # per-token scales, tokens on lanes
    if p.class_order:
      return pl.BlockSpec((None, None, g, 4, bs // 4),
                          lambda bi, hi, j, lens, lim: (bi, hi, 0, 0, jnp.minimum(j, lim_blocks(lim, bi))))
    return pl.BlockSpec((None, None, g, bs),
                        lambda bi, hi, j, lens, lim: (bi, hi, 0, jnp.minimum(j, lim_blocks(lim, bi))))

  def whole(shape):  # one block per (b, h), fetched once
    return pl.BlockSpec((None, None) + shape, lambda bi, hi, j, lens, lim: (bi, hi) + (0,) * len(shape))

  # Queries: GQA rows (rep query heads x T tokens) of one KV head together.
  qf = q.astype(F32).reshape(b, kh, rows, h) * p.sm_scale
  ks_static = _static_scale(fmt.key, cache.k.scale, kh, h)
  if ks_static is not None:
    qf = qf * ks_static[None, :, None, :]
  planes_q = p.key_planes
  qf = qf.reshape(b, kh, rows, planes_q, h // planes_q).transpose(0, 1, 3, 2, 4)
  names, arrays, specs = ["q"], [qf], [whole((planes_q, rows, h // planes_q))]

  def add(name, arr, spec):
    names.append(name)
    arrays.append(arr)
    specs.append(spec)

  kc, vc = cache.k.codes, cache.v.codes
  if p.kind == "kivi":
    n = p.per_word
    add("kc", kc, tok_spec(bs // n, h))
    add("ks", cache.k.scale, tok_spec(bs // p.group, h))
    add("kz", cache.k.zero, tok_spec(bs // p.group, h))
    add("vc", vc, tok_spec(bs, h // n))
    g = h // p.group
    add("vs", _token_major(cache.v.scale, p, True), lane_spec(g))
    add("vz", _token_major(cache.v.zero, p, True), lane_spec(g))
    add("kt", _kivi_tail_keys(cache), whole((p.residual, h)))
    add("vr", cache.v_res, whole((p.residual, h)))
    return names, arrays, specs
  add("kc", kc, tok_spec(bs, kc.shape[-1]))
  if p.key_token_scale:
    add("ks", _token_major(cache.k.scale, p, p.class_order), lane_spec(1))
  add("vc", vc, tok_spec(bs, vc.shape[-1]))
  if p.value_token_scale:
    add("vs", _token_major(cache.v.scale, p, p.class_order), lane_spec(1))
  return names, arrays, specs


def _limits(cache: KVCache, plan: Plan) -> jax.Array:
  """[B] tokens the block loop must visit (KIVI: the rest is the tail)."""
  lengths = cache.lengths.astype(jnp.int32)
  if plan.kind == "kivi":
    return jnp.maximum(lengths - plan.residual, 0)
  return lengths


def decode_attention(q, cache: KVCache, *, sm_scale: float | None = None,
                     logit_softcap: float | None = None, window: int | None = None,
                     block_size: int | None = None, interpret=None):
  """Fused decode attention on TPU; same contract as `kvjax.attention.decode_attention`.

  Args:
    q: queries [B, N, T, H].
    cache: one layer's `KVCache`.
    sm_scale, logit_softcap, window: as the reference.
    block_size: tokens per grid step (default: `plan.choose_block`).
    interpret: None/False on a TPU; a `pltpu.InterpretParams` to run on CPU.

  Raises:
    NotImplementedError: the format or shape is outside the kernel's rules.
  """
  plan = make_plan(q, cache, sm_scale=sm_scale, logit_softcap=logit_softcap, window=window,
                   block_size=block_size)
  names, arrays, specs = _operands(q, cache, plan)
  kernel = kernel_lib.make_kernel(plan, tuple(names))
  b, kh, rows, h = plan.batch, plan.kv_heads, plan.rows, plan.head_dim
  w = h // plan.planes
  whole = lambda shape: pl.BlockSpec((None, None) + shape,
                                     lambda bi, hi, j, lens, lim: (bi, hi) + (0,) * len(shape))
  out_shape = [jax.ShapeDtypeStruct((b, kh, plan.planes, rows, w), F32)]
  out_specs = [whole((plan.planes, rows, w))]
  scratch = [pltpu.VMEM((rows, 1), F32), pltpu.VMEM((rows, 1), F32),
             pltpu.VMEM((plan.planes, rows, w), F32)]
  if plan.kind == "kivi":
    out_shape.append(jax.ShapeDtypeStruct((b, kh, rows, h), F32))
    out_specs.append(whole((rows, h)))
    scratch.append(pltpu.VMEM((rows, h), F32))
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2, grid=(b, kh, plan.num_blocks), in_specs=specs,
      out_specs=out_specs, scratch_shapes=scratch)
  outs = pl.pallas_call(
      kernel, grid_spec=grid_spec, out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=interpret if interpret is not None else False,
      name=f"kvjax_decode_{plan.kind}",
  )(cache.lengths.astype(jnp.int32), _limits(cache, plan), *arrays)
  out = outs[0].transpose(0, 1, 3, 2, 4).reshape(b, kh, rows, h)  # planes -> channels
  if plan.kind == "kivi":
    out = out + outs[1]
  vs_static = _static_scale(cache.fmt.value, cache.v.scale, kh, h)
  if vs_static is not None:
    out = out * vs_static[None, :, None, :]
  return out.reshape(q.shape).astype(q.dtype)


def dispatch_entry(q, cache, **options):
  """`kvjax.dispatch` entry: declines (NotImplementedError) off-TPU unless `interpret` is given."""
  if options.get("interpret") is None and jax.default_backend() != "tpu":
    raise NotImplementedError(f"pallas_tpu needs a TPU backend (have {jax.default_backend()!r}); "
                              "pass interpret=pltpu.InterpretParams() to run it on CPU")
  return decode_attention(q, cache, **options)
