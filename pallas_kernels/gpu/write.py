"""In-place append for decode: every row an append stores, in one Pallas kernel.

`kvjax.cache.append` computes the new tokens' codes and scales (a small
elementwise + reduction over ``[B, K, T, H]``) and a list of `RowWrite`s: for
each cache leaf, the rows to store and where. Its default writer applies
each as an XLA scatter, one kernel per leaf (codes, scales, zeros, KIVI
rings and key-block flush): at decode those kernels are a few microseconds
of launches each, not bytes (session 1: ~11 us for FP8, ~25 us for KIVI at
B = 8). `write_rows` here stores all of them from one kernel: one program
per (sequence, KV head) copies its rows into the leaves, which the kernel
aliases to its outputs (`input_output_aliases`); under
``jax.jit(..., donate_argnums=...)`` no cache byte is copied.

`append` is the "pallas_gpu" entry of `kvjax.dispatch.append`; `decode_step`
fuses append + attend in one jitted, donated call, the shape of a real decode
step. Interpret mode runs the same kernel on any backend (tests).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kvjax import cache as cache_lib
from kvjax import dispatch
from kvjax.cache import KVCache, RowWrite

__all__ = ["write_rows", "append", "append_inplace", "decode_step"]


def _flat(w: RowWrite, leaf) -> tuple[tuple[int, int, int, int], jax.Array]:
  """The leaf's [B, K, S', X] view and the write's rows [B, K, n, X] (X = the row's elements)."""
  view = tuple(leaf.reshape(w.view).shape)
  x = math.prod(view[3:])
  b, k, n = w.new.shape[:3]
  return (view[0], view[1], view[2], x), w.new.reshape(b, k, n, x)


def _kernel(*refs, rows, n_writes):
  pos_refs = refs[:n_writes]
  new_refs = refs[n_writes:2 * n_writes]
  out_refs = refs[3 * n_writes:]  # aliased to the leaves refs[2n:3n], which are never read
  b, h = pl.program_id(0), pl.program_id(1)
  for i in range(n_writes):
    out, new, pos = out_refs[i], new_refs[i], pos_refs[i]
    for j in range(rows[i]):  # static: T tokens (decode: 1), or the flush blocks
      r = pos[b, j]

      @pl.when((r >= 0) & (r < out.shape[2]))
      def _store(r=r, j=j, out=out, new=new):
        out[b, h, pl.ds(r, 1), :] = new[b, h, pl.ds(j, 1), :].astype(out.dtype)


def write_rows(cache: KVCache, writes: Sequence[RowWrite], *, interpret=None,
               num_warps=1) -> KVCache:
  """`kvjax.cache.scatter_writes` as one Pallas kernel (a `write_rows` for `cache.append`).

  Raises NotImplementedError where Triton cannot tile a row (its element count
  is not a power of two), so `dispatch.append` falls back to XLA scatters.
  """
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  if not writes:
    return cache
  names = [w.leaf for w in writes]
  if len(set(names)) != len(names):
    raise NotImplementedError(f"pallas_gpu append: two writes to one leaf ({names})")
  leaves = [cache_lib.get_leaf(cache, n) for n in names]
  views, news = zip(*(_flat(w, a) for w, a in zip(writes, leaves)))
  for name, v in zip(names, views):
    if v[3] & (v[3] - 1):
      raise NotImplementedError(f"pallas_gpu append: {name} rows of {v[3]} elements (needs a power of two)")
  b, k = views[0][:2]
  dsts = [a.reshape(v) for a, v in zip(leaves, views)]
  pos = [jnp.asarray(w.pos, jnp.int32) for w in writes]
  n = len(writes)
  kernel = functools.partial(_kernel, rows=tuple(x.shape[2] for x in news), n_writes=n)
  out = pl.pallas_call(
      kernel, grid=(b, k),
      out_shape=[jax.ShapeDtypeStruct(d.shape, d.dtype) for d in dsts],
      input_output_aliases={2 * n + i: i for i in range(n)},
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="kvjax_append_rows",
  )(*pos, *news, *dsts)
  return cache_lib.set_leaves(cache, {nm: o.reshape(a.shape) for nm, o, a in zip(names, out, leaves)})


def append(cache: KVCache, k, v, num_new=None, *, interpret=None) -> KVCache:
  """`kvjax.cache.append` with its rows stored by one Pallas kernel (same result, bit for bit)."""
  return cache_lib.append(cache, k, v, num_new,
                          write_rows=functools.partial(write_rows, interpret=interpret))


@functools.partial(jax.jit, donate_argnums=(0,), static_argnames=("implementation",))
def append_inplace(cache, k, v, num_new=None, implementation=None):
  """`kvjax.dispatch.append` with the cache donated: codes/scales/residuals updated in place."""
  return dispatch.append(cache, k, v, num_new, implementation=implementation)


@functools.partial(jax.jit, donate_argnums=(3,), static_argnames=("implementation",))
def decode_step(q, k, v, cache, implementation="pallas_gpu"):
  """Appends k, v [B, K, T, H] in place, then attends q [B, N, T, H]; returns (out, cache)."""
  cache = dispatch.append(cache, k, v, implementation=implementation)
  out = dispatch.decode_attention(q, cache, implementation=implementation)
  return out, cache
