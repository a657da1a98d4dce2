"""The glue of a Mosaic GPU decode kernel done inside it: the query read as the caller holds it (no XLA
scale / transpose / pad before the call) and the flash-decoding splits merged in the kernel (no XLA merge
after it). Both are for the transposed problem of `mosaic_fp8` / `mosaic_kivi`, whose per-program state
is o^T [H, 16] in WGMMA's accumulator layout with m, l [16] per query row.

Why: at B=8 32k the FP8 kernel alone is 127.0 us of a 138.6 us call; the rest is the XLA q prep (pad,
convert) and merge (reduce, broadcast) and the launch gaps between them (session 19's profile,
`benchmarks/NOTES_gpu.md`), and at short contexts the glue is a third of the call.

The merge (`MERGES`): each program stores its state to global memory and fences it GPU-wide. Then either
- "count" (`merge_by_last`, the default): one thread adds 1 to a global counter of the (sequence, KV head)
  (acquire-release, GPU scope; `pl.get_global`, zeroed at every launch); the program that counts last reads
  every state back by TMA, merges them by log-sum-exp and stores the normalized rows, transposed back to
  [rows, H] in the output's dtype, by TMA. No co-scheduling: the splits need not be resident together.
- "cluster" (`merge_in_cluster`): the splits are one cluster (`cluster=(num_splits,)`, at most
  `CLUSTER_MAX`, the portable size), resident together; each arrives at a cluster barrier and waits, and
  the first program merges. Session 21 on an H100: clusters of 4 made the FP8 kernel 36% slower at B=8 32k
  (`benchmarks/NOTES_gpu.md`), the count 0%.
`fence.proxy.async.global` sits between the generic stores of the states and TMA's reads of them. The
states' global buffers are outputs of the kernel that the caller drops.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.gpu import mosaic_common as common
from pallas_kernels.gpu.mosaic_options import MERGES  # merge_by_last, merge_in_cluster

__all__ = ["CLUSTER_MAX", "MERGES", "load_query_t", "merge_in_cluster", "merge_by_last", "store_rows", "normalize",
           "publish_global", "cluster_merge_ok", "merge_mesh", "merge_scratch", "merge_counters", "merge_states",
           "tma_padded", "TMA_SMEM_ALIGN", "ZERO_FILL_MAX_ROWS"]

CLUSTER_MAX = 8  # CUDA's portable cluster size: the most splits merged in the kernel


def _ptx(text: str, *, warpgroup_sync: bool = False):
  """Inline PTX run by every thread of the warpgroup, then (warpgroup_sync) a warpgroup barrier."""
  from jax.experimental.mosaic.gpu import utils  # noqa: PLC0415 (kernel only)

  @plgpu.inline_mgpu()
  def emit(ctx):
    del ctx
    utils.inline_ptx(text, has_side_effects=True)
    if warpgroup_sync:
      utils.warpgroup_barrier()
  emit()


ACQUIRE = "fence.acq_rel.gpu;\n\tfence.proxy.async.global;"  # generic stores before, TMA reads after


def publish_global(interpret: bool):
  """Before a cluster barrier's arrive (which one thread per peer makes, with release at CTA scope only):
  every thread's global stores made visible GPU-wide (`fence.acq_rel.gpu`, and to TMA), then the
  warpgroup synchronized, so no thread arrives before all of them have stored."""
  if not interpret:
    _ptx(ACQUIRE, warpgroup_sync=True)


def _load(ref, layout, interpret, optimized=True):
  return ref[...] if interpret else plgpu.load(ref, (), layout=layout, optimized=optimized)


# The alignment, in bytes, of a TMA's shared-memory address (CUDA's tensor-map copies). Session 25: the KIVI
# in-kernel merge, with NS + 1 states (3 at 2 splits), read l into a buffer 3 x 64 = 192 bytes past m's, and
# failed natively with CUDA_ERROR_MISALIGNED_ADDRESS; FP8's merges (2, 4 or 8 states: 128-byte multiples)
# pass. Padded away (`tma_padded`): the KIVI merge tests pass natively since (session 26, H100).
TMA_SMEM_ALIGN = 128
# Up to this many query rows `load_query_t` zero-fills its buffer before the TMA; above it, it masks the rows
# after the load. The fill fails Mosaic GPU's layout inference at 8 rows and more (session 24, compiled for an
# H200 on the CPU: "failed to find a solution" after 20-400 s); the mask builds at any row count in ~4 s but costs
# registers: at 4 rows the KIVI kernel's glue build went from 128 to 133 (G=128) and 130 (KIVI-4) registers, 3
# programs per SM instead of 4, and B=8 32k from 112 to 144 us (G=128) and 159 to 199 (KIVI-4) on an H100
# (session 25, `benchmarks/mosaic_sass.py --builds g:VARIANT:glue`, `decode_parts/session25/`).
ZERO_FILL_MAX_ROWS = 4


def load_query_t(q_ref, scale, q_smem, bar, *, interpret: bool, k_major: bool = False):
  """q_ref [rows, H] (global, the caller's dtype) -> q_smem [H, N] (its dtype: fp16 for the FP8 kernel's B
  operand, f32 for the KIVI-2 kernel's) = (q x scale)^T, rows past `rows` zero (a zero fill up to
  `ZERO_FILL_MAX_ROWS` rows, masked above). By way of a scoped [N, H] buffer of q_ref's dtype (free again for
  the pipeline). Once per program: the transposed load is unoptimized. k_major: q_smem is [N, H] instead (the
  B operand of N = 8 MMAs, `mosaic_common.kmajor_slab`), written through its transposed view."""
  rows = q_ref.shape[0]
  n, h = q_smem.shape if k_major else (q_smem.shape[1], q_smem.shape[0])
  fill = rows <= ZERO_FILL_MAX_ROWS

  def prep(qin):
    if fill:
      qin[...] = jnp.zeros(qin.shape, qin.dtype)
      plgpu.commit_smem()  # the zeros before the TMA's rows
    plgpu.copy_gmem_to_smem(q_ref, qin.at[pl.ds(0, rows)], bar)
    plgpu.barrier_wait(bar)
    x = _load(qin.transpose((1, 0)), plgpu.Layout.WGMMA, interpret, optimized=False).astype(jnp.float32)
    if not fill:  # rows past `rows` are whatever the buffer held
      x = jnp.where(lax.broadcasted_iota(jnp.int32, x.shape, 1) < rows, x, 0.0)
    if k_major:
      common.store_kmajor(q_smem, x * scale, interpret=interpret)
    else:
      q_smem[...] = (x * scale).astype(q_smem.dtype)
    plgpu.commit_smem()
  pl.run_scoped(prep, plgpu.SMEM((n, h), q_ref.dtype))


def store_rows(res, out_ref, out_smem, *, interpret: bool):
  """res [H, N] f32 (WGMMA layout) -> out_ref [rows, H] (global) in out_ref's dtype, by way of out_smem
  [N, H] (written transposed) and one TMA of its first rows."""
  rows = out_ref.shape[0]
  out_smem.transpose((1, 0))[...] = res.astype(out_smem.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_smem.at[pl.ds(0, rows)], out_ref)
  plgpu.wait_smem_to_gmem(0)


def normalize(o, l):
  """o [H, N] / l [N], zero where l is 0 (no token seen)."""
  return o * jnp.where(l > 0, 1.0 / jnp.where(l > 0, l, 1.0), 0.0)[None, :]


def tma_padded(count: int, row_bytes: int) -> int:
  """The least row count >= count whose rows of row_bytes end on a TMA_SMEM_ALIGN boundary (so that a buffer
  placed after them is a valid TMA destination)."""
  if count < 1 or row_bytes < 1:
    raise ValueError(f"count and row_bytes must be positive, got {count} and {row_bytes}")
  step = TMA_SMEM_ALIGN // math.gcd(TMA_SMEM_ALIGN, row_bytes)
  return -(-count // step) * step


def _merge(states, out_ref, merger, *, num_splits: int, interpret: bool):
  """The states (st_o [NS, H, N], st_m, st_l [NS, N], global, written by other programs and published) merged
  by log-sum-exp into out_ref [rows, H] (global) by the program where merger(flag) (flag: a shared int32 [1]
  it may use) holds: a GPU-scope acquire, then TMA's reads. The buffers are scoped (the pipeline's memory by
  now) in every program (the interpreter allocates collectively)."""
  st_o, _, _ = states
  h, n = st_o.shape[1:]

  # m and l one buffer: each scoped buffer takes whole KBs (the KIVI-2 kernel's 4 programs per SM need it). l's
  # half starts at a multiple of TMA_SMEM_ALIGN bytes (a TMA's shared-memory address must be): its split axis
  # padded, since at N = 16 a split is 64 bytes and a KIVI kernel merges NS + 1 states, often an odd count.
  padded = tma_padded(num_splits, n * 4)

  def merge(o_smem, ml_smem, out_smem, flag, bar):
    buffers = (o_smem, ml_smem.at[0, pl.ds(0, num_splits)], ml_smem.at[1, pl.ds(0, num_splits)], out_smem, bar)
    pl.when(merger(flag))(lambda: _merge_here(states, out_ref, buffers, num_splits=num_splits, interpret=interpret))
  pl.run_scoped(merge, plgpu.SMEM((num_splits, h, n), jnp.float32), plgpu.SMEM((2, padded, n), jnp.float32),
                plgpu.SMEM((n, h), out_ref.dtype), plgpu.SMEM((1,), jnp.int32), plgpu.Barrier(num_arrivals=3))


def _merge_here(states, out_ref, buffers, *, num_splits, interpret):
  o_smem, m_smem, l_smem, out_smem, bar = buffers
  if not interpret:  # acquire GPU-wide (a cluster barrier's wait is CTA scope), then TMA's reads
    _ptx(ACQUIRE)
  for src, dst in zip(states, (o_smem, m_smem, l_smem)):
    plgpu.copy_gmem_to_smem(src, dst, bar)
  plgpu.barrier_wait(bar)
  col = plgpu.Layout.WGMMA.reduce(0)
  ms = [_load(m_smem.at[j], col, interpret) for j in range(num_splits)]
  top = functools.reduce(jnp.maximum, ms)
  ws = [jnp.exp2(mj - top) for mj in ms]  # 0 for an empty split (m = NEG) beside a seen one
  l_tot = functools.reduce(jnp.add, [w * _load(l_smem.at[j], col, interpret) for j, w in enumerate(ws)])
  acc = functools.reduce(jnp.add, [_load(o_smem.at[j], plgpu.Layout.WGMMA, interpret) * w[None, :]
                                   for j, w in enumerate(ws)])
  store_rows(normalize(acc, l_tot), out_ref, out_smem, interpret=interpret)


def _publish(o, m, l, states, split, interpret):
  st_o, st_m, st_l = states
  st_o[split] = o
  st_m[split] = m
  st_l[split] = l
  publish_global(interpret)


def merge_in_cluster(o, m, l, states, out_ref, cluster_barrier, *, split, num_splits: int, interpret: bool):
  """Every program of the cluster: its state (o [H, N] f32, m, l [N], m in the log2 domain) into
  states = (st_o [NS, H, N], st_m [NS, N], st_l [NS, N]) (global, this (b, k)'s slices) at `split`; then
  the first program merges all of them into out_ref [rows, H] (global)."""
  _publish(o, m, l, states, split, interpret)
  plgpu.barrier_arrive(cluster_barrier)
  plgpu.barrier_wait(cluster_barrier)
  _merge(states, out_ref, lambda flag: split == 0, num_splits=num_splits, interpret=interpret)


def _count_arrival(counter, flag, num_splits: int):
  """One thread of the warpgroup adds 1 to counter (global int32 [1]; acquire-release at GPU scope) and
  puts the count before its add in flag (shared int32 [1]); then the warpgroup barrier. The last of the
  num_splits (it saw num_splits - 1) sets the counter back to 0: every other program has counted by then, so
  the counter is zero after every launch whether or not Pallas zeroes it before the next."""
  from jax.experimental.mosaic.gpu import utils  # noqa: PLC0415 (kernel only)
  from jaxlib.mlir import ir  # noqa: PLC0415
  from jaxlib.mlir.dialects import arith, memref  # noqa: PLC0415

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def emit(ctx, counter, flag):
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    ptr = utils.memref_ptr(counter)
    with utils.single_thread(utils.ThreadSubset.WARPGROUP):
      # the fence again in this thread after publish's barrier (the CTA's stores, cumulatively), then the count
      old = utils.inline_ptx("fence.acq_rel.gpu;\n\tatom.add.acq_rel.gpu.global.u32 $0, [$1], 1;", ptr,
                             result_types=i32, has_side_effects=True)
      memref.store(old, flag, [arith.constant(ir.IndexType.get(), 0)])
      last = arith.cmpi(arith.CmpIPredicate.eq, old, arith.constant(i32, num_splits - 1))
      utils.inline_ptx("st.relaxed.gpu.global.u32 [$0], 0;", ptr, predicate=last)
    utils.warpgroup_barrier()
  emit(counter, flag)


def merge_by_last(o, m, l, states, out_ref, counter, *, split, num_splits: int, interpret: bool):
  """As `merge_in_cluster`, without a cluster: each program publishes its state and counts itself in
  counter (global int32 [1], this (b, k)'s, zero at the launch: `pl.get_global`); the program that
  counts last merges. The splits need not be resident together (no co-scheduling). The counter is indexed
  by (b, k) only: a `jax.vmap` of the kernel (a grid axis more) would share it between the mapped calls, so
  the kernels that use it are not to be vmapped (none is: ops calls them on whole batches)."""
  if interpret:
    raise NotImplementedError("the counted merge is native only (Mosaic GPU's interpreter has no get_global)")
  _publish(o, m, l, states, split, interpret)

  def last(flag):
    _count_arrival(counter, flag, num_splits)
    return flag[0] == num_splits - 1
  _merge(states, out_ref, last, num_splits=num_splits, interpret=interpret)


def merge_mesh(batch: int, kv_heads: int, num_states: int, merge_by: str | None) -> dict:
  """`plgpu.kernel`'s grid for the (b, k, s) programs of a kernel merging its states `merge_by` (`MERGES`;
  None: not in the kernel)."""
  if merge_by == "cluster":
    return dict(grid=(batch, kv_heads), grid_names=("b", "k"), cluster=(num_states,), cluster_names=("s",))
  return dict(grid=(batch, kv_heads, num_states), grid_names=("b", "k", "s"))


def merge_scratch(merge_by: str) -> tuple:
  """The scratch `merge_states` takes as `sync`: the cluster's barrier, or none for the count."""
  if merge_by == "cluster":
    return (plgpu.ClusterBarrier(collective_axes=("s",), num_arrivals=1),)
  return ()


def merge_counters(merge_by: str, batch: int, kv_heads: int):
  """The global counters of merge_by "count" (int32 [B x K], zero at each launch: `pl.get_global`); None for
  "cluster". Called once at the top of the kernel's body (each call is another allocation)."""
  return pl.get_global(plgpu.SemaphoreType.REGULAR((batch * kv_heads,))) if merge_by == "count" else None


def merge_states(o, m, l, states, out_ref, sync, counters, *, merge_by: str, num_splits: int, interpret: bool):
  """This program's state into the in-kernel merge of its (b, k) (`merge_in_cluster` or `merge_by_last`):
  states = (st_o, st_m, st_l) (global, [B, K, NS, ...]), out_ref [B, K, rows, H] (global), sync from
  `merge_scratch` (a list: empty for the count), counters from `merge_counters`; the program's (b, k, s)
  from the axes "b", "k", "s" (`merge_mesh`)."""
  bi, ki, si = lax.axis_index("b"), lax.axis_index("k"), lax.axis_index("s")
  mine = tuple(x.at[bi, ki] for x in states)
  if merge_by == "cluster":
    merge_in_cluster(o, m, l, mine, out_ref.at[bi, ki], sync[0], split=si, num_splits=num_splits,
                     interpret=interpret)
  else:
    counter = counters.at[pl.ds(bi * states[0].shape[1] + ki, 1)]
    merge_by_last(o, m, l, mine, out_ref.at[bi, ki], counter, split=si, num_splits=num_splits,
                  interpret=interpret)


def cluster_merge_ok(num_splits: int) -> bool:
  """Whether `merge_in_cluster` takes this many splits (1 needs no merge)."""
  return 1 < num_splits <= CLUSTER_MAX

