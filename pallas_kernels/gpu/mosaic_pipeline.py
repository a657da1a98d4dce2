"""The Mosaic kernels' tile pipeline with its copies issued by one warp at a time (`Options.warp_fetch`,
`Fp8Options.warp_fetch`).

`plgpu.emit_pipeline` issues each step's TMA copies from the warpgroup: under Warpgroup lowering every one of
the 4 warps runs the copies' descriptor and coordinate arithmetic (100-114 SASS a tile for the KIVI kernel's
6 copies, compiled for an H200), and only the copy itself is predicated on one elected thread of warp 0. Every
warp of every program on an SM pays it, on every one of the SM's 4 schedulers. Here the refetch after tile t
runs inside `pl.core_map(plgpu.WarpMesh)` under `warp == t % 4`: one warp issues it (its elected lane copies,
its 32 lanes arrive for the warpgroup), the other three branch past, and over 4 tiles each scheduler carries a
quarter of the copies of each program it holds. The steps, slots and barriers are `emit_pipeline`'s: `stages`
buffers and barriers, the first `stages` steps fetched before the loop, step t waiting on its slot's barrier
and, after the step function (whose last barrier must leave the slot free), refetching step t + stages into it.
In the interpreter the copies are issued as they are (no warps to choose among)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["emit", "WARPS", "WARP_AXIS"]

WARPS = 4  # a warpgroup's warps
WARP_AXIS = "kvjax_warp"


def _block_slices(spec, t):
  """spec's gmem slice for step t: block index i a dimension -> rows [i n, (i + 1) n)."""
  return tuple(pl.ds(i * n, n) for i, n in zip(spec.index_map(t), spec.block_shape, strict=True))


def emit(step_fn, *, steps, stages: int, init_carry, in_specs, warp_fetch: bool, interpret: bool):
  """`plgpu.emit_pipeline(step_fn, grid=(steps,), max_concurrent_steps=stages, init_carry=..., in_specs=...)`,
  with warp_fetch each refetch issued by one warp (t % WARPS for the refetch after step t). in_specs:
  `plgpu.BlockSpec`s with full block shapes and their transforms; steps: a traced or static count >= 0.
  Returns a function of the gmem refs -> the final carry, as `emit_pipeline`'s does."""
  if not isinstance(stages, int) or stages < 1:
    raise ValueError(f"stages must be a positive int, got {stages!r}")
  if not warp_fetch:
    return plgpu.emit_pipeline(step_fn, grid=(steps,), max_concurrent_steps=stages, init_carry=init_carry,
                               in_specs=in_specs)
  for spec in in_specs:
    if spec.block_shape is None or any(not isinstance(n, int) for n in spec.block_shape):
      raise ValueError(f"in_specs need full integer block shapes, got {spec.block_shape!r}")

  def run(*gmem_refs):
    if len(gmem_refs) != len(in_specs):
      raise ValueError(f"got {len(gmem_refs)} gmem refs for {len(in_specs)} in_specs")
    bufs = [plgpu.SMEM((stages, *spec.block_shape), ref.dtype, transforms=tuple(spec.transforms or ()))
            for spec, ref in zip(in_specs, gmem_refs)]

    def scoped(*refs):
      *smem, bar = refs

      def fetch(t, slot):
        for spec, src, dst in zip(in_specs, gmem_refs, smem):
          plgpu.copy_gmem_to_smem(src.at[_block_slices(spec, t)], dst.at[slot], bar.at[slot])

      def fetch_by(t, slot, warp):
        if interpret:
          fetch(t, slot)
          return

        @pl.core_map(plgpu.WarpMesh(axis_name=WARP_AXIS))
        def _():
          @pl.when(lax.axis_index(WARP_AXIS) == warp)
          def _():
            fetch(t, slot)

      for s in range(stages):
        @pl.when(s < steps)
        def _(s=s):
          fetch_by(jnp.int32(s), s, s % WARPS)

      def body(t, carry):
        slot = lax.rem(t, stages)
        plgpu.barrier_wait(bar.at[slot])
        carry = step_fn((t,), *(buf.at[slot] for buf in smem), carry)

        @pl.when(t + stages < steps)
        def _():
          fetch_by(t + stages, slot, lax.rem(t, WARPS))
        return carry

      return lax.fori_loop(jnp.int32(0), jnp.asarray(steps, jnp.int32), body, init_carry)

    return pl.run_scoped(scoped, *bufs, plgpu.Barrier(num_arrivals=len(in_specs), num_barriers=stages))
  return run
