"""Kernel option variants for `decode_kernels.py`: which exist per format, the GPU correctness
check of each against the XLA reference (--check), and the sweep grid (--sweep)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from kvjax import attention
from kvjax import cache as cache_lib
from pallas_kernels.gpu import ops


@dataclasses.dataclass(frozen=True)
class HeadShape:
  """Attention heads of the benchmarked model: query heads, KV heads, head_dim, logit soft-cap."""

  n_heads: int
  k_heads: int
  head_dim: int
  softcap: float | None = None

  def __post_init__(self):
    for name in ("n_heads", "k_heads", "head_dim"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    if self.n_heads % self.k_heads:
      raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of k_heads ({self.k_heads})")
    if self.softcap is not None and not self.softcap > 0:
      raise ValueError(f"softcap must be positive or None, got {self.softcap!r}")

  @property
  def rep(self) -> int:
    return self.n_heads // self.k_heads


SHAPES = {"llama3_8b": HeadShape(32, 8, 128), "gemma2_2b": HeadShape(8, 4, 256, softcap=50.0)}
N_HEADS, K_HEADS = SHAPES["llama3_8b"].n_heads, SHAPES["llama3_8b"].k_heads  # the default shape

# Neighbours of the defaults: fp8/int8 with tiled values run 4 warps (session 8, decode_s8_b8.json;
# token-major 2 warps, session 5), int4 and KIVI unpack with inline PTX, KIVI G=32 runs 2 warps
# (decode_parts/decode_s5.json). Older variants (prefetch, block, narrow dots, joined values, tile
# loop) are settled in decode_s3/s4/s5.json.
# Values in tiles (`init_cache(value_tile=)`, the GPU default since session 8; `value_tile` is a cache
# option, the rest kernel options): CPU-compiled SASS, session 7: fp8 0.113 -> 0.083 warp-instructions
# per byte (no byte-wise LDS.U8 for the p.v operand), 243 -> 167 registers. Fully channel-major [H, S]
# codes timed slower on the H200 (fp8 179 vs 171 us, decode_s7_value_t.json); 64-token tiles faster:
# 158 us, 149 with 4 warps, vs 172 (decode_s7_value_t_tiled.json); int8 180 / 168 vs 182
# (decode_s7_value_t_int8.json). Token-major (value_tile=0) variants keep the old layout in the sweep.
TILED = (dict(num_warps=2), dict(num_warps=8), dict(value_tile=128), dict(num_stages=4), dict(prefetch=0),
         dict(pallas_merge=False))  # the XLA split merge instead of `merge.merge_states` (session 9)
TOKEN_MAJOR = (dict(value_tile=0), dict(value_tile=0, num_warps=4), dict(value_tile=0, num_warps=4, block=32))
# int8 q.k runs 8-bit tensor-core dots by default (NARROW_QK_KINDS, session 3, token-major): re-checked
# with tiles by `narrow_qk=False` (not yet timed).
# The Mosaic GPU FP8 kernel (`pallas_kernels.gpu.mosaic_fp8`, session 18; values in 64-token tiles, the GPU
# default, named so the CPU's token-major default is re-laid too): checked and swept beside Triton's.
MOSAIC_FP8 = (dict(mosaic_fp8=True, value_tile=64),)
VARIANTS = {"fp8_e4m3": TILED + TOKEN_MAJOR + MOSAIC_FP8, "fp8_e5m2": MOSAIC_FP8,
            "int8": TILED + TOKEN_MAJOR + (dict(narrow_pv=True), dict(narrow_qk=False)),
            "int4": (dict(num_warps=2), dict(packed_unpack=False)),
            "kivi2": (dict(num_warps=4), dict(packed_unpack=False)),
            "kivi2_g128": (dict(packed_unpack=False), dict(fold_value_scales=False), dict(pallas_merge=False)),
            "kivi4": (dict(num_warps=4), dict(packed_unpack=False))}
# fold_value_scales (session 9, CPU-compiled SASS, /tmp run of kernel_sass.py, NOTES_gpu.md): G=128 loop
# 675 -> 628 instructions, G=32 1032 -> 1342 (four groups: four scaled p tiles and row sums), so only
# kivi2_g128 carried it into the GPU check and sweep; session 10 timed it (321.5 vs 342.7 us) and made it
# kivi2_g128's default, so the variant is now the unfolded kernel.
# ^ kernel options checked (--check) and swept (--sweep) beside the defaults. Session 3's
# variants (narrow dots, joined values, tile loop) are measured and settled: decode_parts/decode_s3.json


def split_layout(opts):
  """(cache relayout, kernel options) of a variant: `value_tile` re-lays the cache's value codes
  (`kvjax.cache.with_value_tile`), `kivi_layout` its KIVI codes (`kvjax.cache.with_kivi_layout`: "words"
  sends a KIVI-2 G=32 cache to the Mosaic kernel); the other entries are `ops.decode_attention` options."""
  opts = dict(opts or {})
  tile, kivi = opts.pop("value_tile", None), opts.pop("kivi_layout", None)

  def relayout(c):
    c = c if tile is None else cache_lib.with_value_tile(c, tile)
    return c if kivi is None else cache_lib.with_kivi_layout(c, kivi)
  return relayout, opts


def opts_name(f, o):
  return f + "".join(f"+{k}" if v is True else f"+{k}={v}" for k, v in sorted(o.items()) if v is not None)


def check_all(log, names=None, quick=False, shape=SHAPES["llama3_8b"]):
  """Worst relative error vs the XLA reference per format (and per option variant)."""
  from pallas_kernels import test_base as tb
  worst = {}
  for f in names or tb.ALL_FORMATS:
    for o in ({},) + VARIANTS.get(f, ()):
      name = opts_name(f, o)
      try:
        worst[name] = _check_one(tb, f, o, quick, shape)
      except NotImplementedError as e:  # e.g. Triton options on a "words" KIVI cache (the Mosaic kernel's)
        log(f"check {name} n/a: {str(e)[:200]}")
        continue
      except Exception as e:  # a variant that does not compile is reported, not fatal
        log(f"check {name} failed: {repr(e)[:300]}")
        worst[name] = float("inf")
        continue
      log(f"check {name:30s} worst rel err {worst[name]:.2e} {'OK' if worst[name] < 1e-2 else 'FAIL'}")
  return worst


def _check_one(tb, f, opts, quick=False, shape=SHAPES["llama3_8b"]):
  worst = 0.0
  cases = [(L, t, 4, 2) for L in tb.LENGTHS.values() for t in (1, 3)] + [([5, 200], 1, 8, 1)]
  if quick:  # 2 kernel shapes: the ragged batch (0, 1, windows empty/partial/full) with T = 3
    cases = [(tb.LENGTHS["ragged"], 3, 4, 2)]
  layout, opts = split_layout(opts)
  for L, t, rep, kh in cases:
    q, c = tb.make_case(f, L, num_queries=t, rep=rep, num_kv_heads=kh, seed=len(L) + t)
    ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c), np.float32)
    out = np.asarray(ops.decode_attention(q, layout(c), **opts), np.float32)
    assert np.isfinite(out).all(), f
    for bi, l in enumerate(L):
      e = (float(np.abs(out[bi]).max()) if l == 0 else
           tb.relative_error(out[bi][:, max(0, t - l):], ref[bi][:, max(0, t - l):]))
      worst = max(worst, e)
  # a larger ragged case with the benchmark's head shape (and its soft-cap)
  L = [0, 1, 127, 128, 129, 1000, 2047, 2048]
  q, c = tb.make_case(f, L, num_kv_heads=shape.k_heads, rep=shape.rep, head_dim=shape.head_dim,
                      capacity=2048, seed=3)
  cap = {"logit_softcap": shape.softcap}
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), c, **cap), np.float32)
  out = np.asarray(ops.decode_attention(q, layout(c), **cap, **opts), np.float32)
  for bi, l in enumerate(L):
    e = float(np.abs(out[bi]).max()) if l == 0 else tb.relative_error(out[bi], ref[bi])
    worst = max(worst, e)
  return worst


def sweep_grid(f, variants_only=False):
  """Kernel options tried per format at B=8, 32k (--sweep); the first entry is the default."""
  if variants_only:
    return [{}] + list(VARIANTS.get(f, ()))
  if f.startswith("kivi"):
    return [dict(n, num_stages=st, num_splits=sp) for n in ({},) + VARIANTS.get(f, ())
            for sp in (None, 64) for st in (3, 2)]
  return [dict(n, num_stages=st, num_splits=sp) for n in ({},) + VARIANTS.get(f, ())
          for sp in (None, 64) for st in (3, 4)]
