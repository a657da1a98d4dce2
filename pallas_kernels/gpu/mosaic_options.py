"""How the Mosaic GPU kernels build their tile step: the KIVI-2 kernel's (`mosaic_kivi.kivi2_states`)
`Options` and the named presets sessions 11-15 timed on the H200 (`benchmarks/NOTES_gpu.md`;
`mosaic_decode.DEFAULT_VARIANT` names the default), and the FP8 kernel's (`mosaic_fp8`) `Fp8Options`."""

from __future__ import annotations

import dataclasses

__all__ = ["Options", "VARIANTS", "DENORM_LOG2", "Fp8Options"]

MERGES = ("count", "cluster")  # `mosaic_epilogue`: merge_by_last, merge_in_cluster

DENORM_LOG2 = 14  # unpack="denorm": A holds (c s + z) / 2^14; scales < 64 (2-bit key or value ranges < 192)


@dataclasses.dataclass(frozen=True)
class Options:
  """How `kivi2_states` builds its tile step (session 11's sweep on the H200 picks the preset).

  exact: planes are the codes themselves (fp16 1024 + code, minus 1024: exact), else 1024 + code with the
    offset removed in the per-column constants (the same fp16-rounded q s / p s the tensor cores see).
  zero_mma: the key zeros' logit term q . z_g on the tensor cores (the zero row broadcast over the tile,
    16 columns at a time, against the fp16 query), else a cross-warp sum per tile. Needs `exact`.
  fold_zeros: each zero folded into its plane as zero / scale (fp16 code + z / s, one more fp16 add per
    pair of codes): no zero term, so no cross-warp sum but the max's per tile. Needs `exact`.
  dequant_in_a: the A registers hold the dequantized tile (code * scale + zero, fp16; scale and zero per
    k column: key channel or value token), against the query and the probabilities as stored (fp16):
    no per-tile q * s product, store or commit for the keys, no zero terms. Needs `exact`.
  tiles_per_step: 128-token tiles per pipeline step (1 or 2; 2 needs `dequant_in_a`): one max, one store
    and commit, one set of copies per 256 tokens.
  lazy_sums: l and the value zeros' term kept as per-thread [128, 16] sums, reduced once at the end
    (+32 registers), else a cross-warp sum each per tile.
  unpack: "shift" shifts each word per plane (uint16 shifts are scalar in PTX: session 11's PTX has 224
    shr.u16 per tile); "mask" masks planes 0-4 in place and shifts once for 5-7
    (`mosaic_planes.plane_masked`), one fp16 multiply per pair of codes instead. Needs `exact`.
    "denorm" (needs `dequant_in_a`): the masked word itself read as an fp16 subnormal,
    (w & 3 << 2j) = c 4^j 2^-24 exactly (`mosaic_planes.plane_denorm`), its scale and zero carrying the
    rest: A = x (s 4^-j 2^24 / 2^DENORM_LOG2) + z / 2^DENORM_LOG2 = (c s + z) / 2^DENORM_LOG2, one HFMA2
    per pair of codes after the mask (no 0x6400 and no 1024 to remove: one fp16 op less a pair; session
    17's SASS: 865 instructions a tile against 988). The logits are scaled back by 2^DENORM_LOG2 in f32
    (exact), the probabilities stored as p 2^DENORM_LOG2 (l divided once at the end). Exact as "mask" but
    for the subnormal floor, |error| <= 2^(DENORM_LOG2 - 25) on dequantized values below
    2^(DENORM_LOG2 - 14) in magnitude (fp16's own 2^-11 relative above); a scale at or above
    2^(DENORM_LOG2 - 8) overflows plane 0's factor and makes the states NaN (loud, not wrong).
  lag: WGMMA groups left in flight while the next plane is unpacked (each plane's registers are free
    once its group retires); None issues all planes, then waits.
  q_in_smem: the query read from shared memory every tile instead of held in 16 registers.
  approx_math: ex2.approx (Mosaic GPU's approx_math).
  scales_once: with `dequant_in_a`, scales and zeros that are not fp16 (the cache's bf16) converted
    once per tile into fp16 shared memory (keys': one more commit before the logits; values': with the
    probabilities' commit) rather than per plane where each A operand is built.
  stop_at_length: each split's pipeline runs over the steps holding tokens below the sequence's length
    only (a dynamic grid; none for a split past it), else over the whole capacity, masked.
  balance: with `stop_at_length`, the splits share the steps below the length evenly (split s takes
    steps [s c, (s + 1) c), c = ceil(live steps / splits)), so a long cache holding few tokens still
    spreads them over every split; else split s keeps its fixed slice of the capacity.
  opaque_magic: with unpack="mask", the fp16 exponent 0x6400 OR'ed into each masked plane is read from
    memory at run time: ptxas then keeps it in one register and makes (w & mask) | it one LOP3 with the
    mask as the immediate. As a literal, the LOP3 takes 0x6400 as its immediate and each plane's mask
    is rematerialized into a register first (session 16's SASS: 128 MOVs in the 1114-instruction loop).
  shift32: with unpack "mask" or "denorm", w >> 10 (planes 5-7) on each register's pair of uint16 words
    as one 32-bit shift (`mosaic_planes.shr10_pairs`): one SHF a pair instead of two scalar shifts and a
    repack (session 17's SASS: 795 instructions a tile against 865).
  manual_barriers: Mosaic GPU's automatic barriers off (`unsafe_no_auto_barriers`): none around each
    shared-memory store or before each TMA refetch (20 BAR.SYNC a tile -> 5); the step's own commits and
    the softmax's cross-warp max order every shared buffer, and one commit at the step's end lets the
    pipeline refetch into the slot just read. Needs `dequant_in_a` (the step checked for it).
  min_share: with `balance`, each split takes at least this many steps of the live ones (the splits past
    them none): a short sequence in a long cache keeps a few programs of several tiles rather than many
    of one (session 17, H200: 4 tiles a program beat 1 or 2 at 1k and 4k, `mosaic_decode.default_splits`).
  narrow_softmax: with `dequant_in_a`, where at most 8 of the 16 query rows hold queries (`kivi2_states`'
    live_rows: GQA 4 heads x 1 token, Llama-3-8B; Gemma 2's 2 heads x up to 4 tokens), the tiles' softmax
    over those 8 columns only, the other 8's probabilities stored as 0 (session 35, KIVI-2 G=128 through
    `decode_attention`: 758 -> 675 SASS a tile compiled for an H200, 128 -> 117 registers; B=8 32k on an H100
    113.15 -> 104.94 us).
  narrow_mma: with the narrow softmax in effect, the tile's two products at WGMMA's N = 8 (m64n8k16) rather
    than 16: the fp16 query and the probabilities stored K-major ([8, K], through transposed views), the
    logits and the value accumulators [128, 8]. Compiled for an H200 (session 36): 16 registers less (117 ->
    101; 93 with lag 0, 5 programs per SM with the window's 32-channel key parts), no fewer loop instructions
    (ptxas had already dropped the padding columns' work). The window program keeps N = 16 (its own fp16
    query copy).
  fp8_mma: where the narrow softmax applies to KIVI-2 G=128 at head_dim 128 (else the fp16 step), both
    products as e4m3 WGMMAs of k = 32 on the code bytes themselves (`mosaic_fp8_planes`: 8 a product, not 16,
    and no dequantized A), their B built each tile as hi + lo e4m3 words (the query times the keys' scales;
    the probabilities times the values' scales), the zeros' terms as a per-tile sum (keys) and lazy
    per-thread sums (values); the softmax in natural units (no 2^DENORM_LOG2). B holds about bf16's 8 bits (the fp16 build: fp16's 11),
    each B_K column scaled per tile to e4m3's top range; value scales below `mosaic_kivi_fp8.SCALE_LIMIT` (112;
    NaN states above). Session 37 (H100, B=8 32k through ops, the fp16 build 103 us) timed a first
    build at 93.1 us (its B range too coarse: 7e-3 in o) and an exact-range one at 100.3; this build's range
    (max |q| x the tile's max scale) 96.0 (session 38). With xwarp_split and ptx_words it is the default.
  xwarp_split: with fp8_mma and manual_barriers, its two cross-warp reductions a tile (the keys' zero term
    q . z, the softmax's max) through `mosaic_xwarp`: q . z's warp parts stored before the key commit and
    summed after its barrier (no barrier of its own), the max with one barrier, not Mosaic's two (7 BAR.SYNC
    a tile -> 4), and the step's last barrier without a proxy fence (`mosaic_xwarp.barrier`). H100, B=8 32k
    through ops: 96.0 -> 93.3 us (the fp16 build 101.0); B=64 620.4 -> 596.3 (686.3) (session 38).
  ptx_words: with fp8_mma, B's e4m3 hi + lo words from one PTX block a register pair
    (`mosaic_fp8_planes.e4m3_words(..., interpret=False)`: each word one conversion of the pair (y_lo, y_hi),
    no byte permutes), not from jnp's conversions; compiled for an H200: 652 -> 600 loop SASS a tile, 126
    registers. H100, B=8 32k alone 95.8 -> 91.0 us; the words bit for bit the jnp ones natively (session 38).
    With xwarp_split: the default (`dequant_fp8xp`).
  warp_fetch: with manual_barriers, the pipeline's refetch after tile t issued by warp t % 4 alone
    (`mosaic_pipeline.emit`: `pl.core_map(plgpu.WarpMesh)`), not by all 4 warps with one elected thread
    copying: the 6 copies' descriptor and coordinate arithmetic (100-114 loop SASS a warp, compiled for an H200)
    on one scheduler of 4 a tile, rotating, rather than on every scheduler every tile.
  redux_max: with fp8_mma, the tile's largest key scale (B_K's bound; every warp computes it) reduced over the
    warp by one `redux.sync.max.s32` on the f32 bits of the lanes' maxima, not 5 shuffles and 5 maxima
    (`mosaic_kivi_fp8.scales_max`); the same value for KIVI's scales (>= 0).
  f16_rest: with fp8_mma, B's lo words (what e4m3's rounding of a value left) from the value in fp16 minus
    its hi word unpacked to fp16 (exact), not in f32 (`mosaic_fp8_planes.e4m3_words(f16_rest=True)`): 5
    conversions and subtractions a value pair rather than 7; lo off by at most fp16's 2^-11 of the value.
  full_tiles: the softmax's length mask only on the tiles that hold a token at or past the length: a
    warp-uniform branch a tile (`lax.cond` on (tile + 1) 128 <= length) takes full tiles past the mask's
    compares and selects (sliding windows still mask every tile).
  timing_only: a diagnostic that makes the states WRONG, to time what the rest of the step costs
    (`benchmarks/mosaic_sass.py` builds only; `mosaic_decode` refuses it): "scale" drops the dequantization
    (A is the masked plane as read, no scale or zero: one HFMA2 a pair of codes less), "unpack" drops the
    unpacking too (A is the code word itself read as fp16, the same for every plane). Needs unpack="denorm".
    "l2": every program's tiles read from sequence 0, KV head 0 (the same instructions, the bytes from L2
    rather than HBM: what the loads cost beyond the loop's issue); right states, of that one cache.
  smem_pad_kb: a timing diagnostic: this many KB of shared memory allocated and never touched, so fewer
    programs fit an SM (the same code at 4, 3, 2 programs per SM: what occupancy is worth).
  """
  exact: bool = True
  zero_mma: bool = False
  fold_zeros: bool = False
  dequant_in_a: bool = False
  tiles_per_step: int = 1
  lazy_sums: bool = False
  unpack: str = "shift"
  lag: int | None = 1
  q_in_smem: bool = True
  approx_math: bool = True
  scales_once: bool = False
  stop_at_length: bool = False
  balance: bool = False
  opaque_magic: bool = False
  shift32: bool = False
  manual_barriers: bool = False
  min_share: int = 1
  narrow_softmax: bool = True
  narrow_mma: bool = False
  fp8_mma: bool = False
  xwarp_split: bool = False
  ptx_words: bool = False
  warp_fetch: bool = False
  redux_max: bool = False
  full_tiles: bool = False
  f16_rest: bool = False
  timing_only: str = ""
  smem_pad_kb: int = 0

  def __post_init__(self):
    if self.timing_only not in ("", "scale", "unpack", "l2") or \
        self.timing_only in ("scale", "unpack") and self.unpack != "denorm":
      raise ValueError(f"timing_only must be '', 'l2', or 'scale' / 'unpack' with unpack='denorm', got "
                       f"{self.timing_only!r} (unpack={self.unpack!r})")
    if self.fp8_mma and (not self.dequant_in_a or not self.narrow_softmax or self.narrow_mma
                         or self.tiles_per_step != 1 or self.timing_only in ("scale", "unpack")):
      raise ValueError("fp8_mma needs dequant_in_a and narrow_softmax, one tile a step, neither narrow_mma nor a "
                       "timing_only that drops the dequantization")
    if self.ptx_words and not self.fp8_mma:
      raise ValueError("ptx_words needs fp8_mma (they are the e4m3 step's B words)")
    if self.xwarp_split and not (self.fp8_mma and self.manual_barriers):
      raise ValueError("xwarp_split needs fp8_mma and manual_barriers (the step's own barriers order its scratch)")
    if self.f16_rest and not self.fp8_mma:
      raise ValueError("f16_rest needs fp8_mma (it is the e4m3 step's B words)")
    if self.redux_max and not self.fp8_mma:
      raise ValueError("redux_max needs fp8_mma (it is the e4m3 step's key-scale bound)")
    if self.warp_fetch and not self.manual_barriers:
      raise ValueError("warp_fetch needs manual_barriers (a warp map under Mosaic's automatic barriers costs two "
                       "warpgroup barriers a tile)")
    if self.narrow_mma and not self.narrow_softmax:
      raise ValueError("narrow_mma needs narrow_softmax (the N = 8 products hold the narrow softmax's 8 rows)")
    if not 0 <= self.smem_pad_kb <= 160:
      raise ValueError(f"smem_pad_kb must be in [0, 160] (KB of unused shared memory), got {self.smem_pad_kb}")
    if self.zero_mma and not self.exact:
      raise ValueError("zero_mma needs exact planes (the offset's correction is a cross-warp sum anyway)")
    if self.fold_zeros and (self.zero_mma or not self.exact):
      raise ValueError("fold_zeros needs exact planes and no zero_mma")
    if self.dequant_in_a and (self.zero_mma or self.fold_zeros or not self.exact):
      raise ValueError("dequant_in_a needs exact planes and neither zero_mma nor fold_zeros")
    if self.tiles_per_step not in (1, 2) or self.tiles_per_step == 2 and not self.dequant_in_a:
      raise ValueError(f"tiles_per_step must be 1, or 2 with dequant_in_a, got {self.tiles_per_step}")
    if self.unpack not in ("shift", "mask", "denorm"):
      raise ValueError(f"unpack must be 'shift', 'mask' or 'denorm', got {self.unpack!r}")
    if self.unpack == "mask" and not self.exact:
      raise ValueError("unpack='mask' needs exact planes")
    if self.unpack == "denorm" and not self.dequant_in_a:
      raise ValueError("unpack='denorm' needs dequant_in_a (the subnormal planes' factors ride on the scales)")
    if self.scales_once and not self.dequant_in_a:
      raise ValueError("scales_once needs dequant_in_a (the other presets read scales once per tile)")
    if self.shift32 and self.unpack not in ("mask", "denorm"):
      raise ValueError("shift32 needs unpack='mask' or 'denorm' (one shift a word, by 10)")
    if self.manual_barriers and not self.dequant_in_a:
      raise ValueError("manual_barriers needs dequant_in_a (the step whose shared-memory hazards are checked)")
    if self.opaque_magic and self.unpack != "mask":
      raise ValueError("opaque_magic needs unpack='mask' (the shift unpacking ORs after shifting)")
    if self.min_share < 1 or self.min_share > 1 and not self.balance:
      raise ValueError(f"min_share must be >= 1 (> 1 needs balance), got {self.min_share}")
    if self.balance and not self.stop_at_length:
      raise ValueError("balance needs stop_at_length (the splits share the steps below the length)")
    if self.lag is not None and not 0 <= self.lag <= 8:
      raise ValueError(f"lag must be None or 0..8 WGMMA groups in flight, got {self.lag}")


VARIANTS = {
    "offset": Options(exact=False, lag=None, q_in_smem=False, approx_math=False),  # session 10's kernel
    "exact": Options(zero_mma=True, lazy_sums=True, lag=None, q_in_smem=False, approx_math=False),
    "lean": Options(),
    "lean_lag2": Options(lag=2),
    "lean_lazy": Options(lazy_sums=True),
    "lean_zmma": Options(zero_mma=True),
    "folded": Options(fold_zeros=True),
    "folded_lazy": Options(fold_zeros=True, lazy_sums=True),
    "folded_mask": Options(fold_zeros=True, unpack="mask"),
    "folded_lazy_mask": Options(fold_zeros=True, lazy_sums=True, unpack="mask"),
    "dequant": Options(dequant_in_a=True, lazy_sums=True),
    "dequant_mask": Options(dequant_in_a=True, lazy_sums=True, unpack="mask"),
    "dequant_sum": Options(dequant_in_a=True, unpack="mask"),
    "dequant2": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", tiles_per_step=2),
    "dequant2_sum": Options(dequant_in_a=True, unpack="mask", tiles_per_step=2),
    # session 14: bf16 scales (the cache's) converted once per tile; WGMMA groups in flight
    "dequant_mask_s16": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", scales_once=True),
    "dequant_mask_lag2": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", lag=2),
    "dequant_mask_lag4": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", lag=4),
    "dequant_mask_s16_lag2": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", scales_once=True, lag=2),
    "dequant_mask_s16_stop": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", scales_once=True,
                                     stop_at_length=True),
    "dequant_mask_s16_bal": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", scales_once=True,
                                    stop_at_length=True, balance=True),
    # session 16: 0x6400 from memory (one LOP3 per masked pair of codes, no mask MOVs)
    "dequant_mask_s16_bal_om": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", scales_once=True,
                                       stop_at_length=True, balance=True, opaque_magic=True),
    # session 17: the planes as fp16 subnormals, the 4^-j and the 1024 folded into the scales
    "dequant_denorm": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                              stop_at_length=True, balance=True),
    "dequant_denorm_s32": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                  stop_at_length=True, balance=True, shift32=True),
    "dequant_denorm_s32_mb": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                     stop_at_length=True, balance=True, shift32=True, manual_barriers=True),
    "dequant_denorm_s32_mb4": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                      stop_at_length=True, balance=True, shift32=True, manual_barriers=True,
                                      min_share=4),
    # session 22: G=32 (`mosaic_groups`); lag 0 keeps it at 124 registers, 4 programs per SM (lag 1: 130, 3)
    "dequant_denorm_s32_mb_lag0": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                          stop_at_length=True, balance=True, shift32=True, manual_barriers=True,
                                          lag=0),
    # session 40: G=32's build with the refetch issued by one warp a tile, rotating (`mosaic_pipeline`)
    "dequant_denorm_s32_mb_lag0w": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                           stop_at_length=True, balance=True, shift32=True, manual_barriers=True,
                                           lag=0, warp_fetch=True),
    # session 41: and only the tiles holding the length mask (`Options.full_tiles`)
    "dequant_denorm_s32_mb_lag0wm": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                            stop_at_length=True, balance=True, shift32=True, manual_barriers=True,
                                            lag=0, warp_fetch=True, full_tiles=True),
    # session 36: the products at WGMMA's N = 8 where the narrow softmax applies, lag 0: 93 registers, 40 KB
    # (the window's ring keys in 32-channel parts), 5 programs per SM (KIVI-2 G=128 at head_dim 128)
    "dequant_denorm_s32_mb_n8": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                        stop_at_length=True, balance=True, shift32=True, manual_barriers=True,
                                        lag=0, narrow_mma=True),
    # session 37: both products as e4m3 WGMMAs on the code bytes (KIVI-2 G=128, head_dim 128, <= 8 query rows)
    "dequant_fp8": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                           stop_at_length=True, balance=True, shift32=True, manual_barriers=True, fp8_mma=True),
    # session 38: and its two cross-warp reductions around the step's own barriers (`mosaic_xwarp`)
    "dequant_fp8x": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                            stop_at_length=True, balance=True, shift32=True, manual_barriers=True, fp8_mma=True,
                            xwarp_split=True),
    # session 38: and B's e4m3 words from one PTX block a register pair (the default from session 38)
    "dequant_fp8xp": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                             stop_at_length=True, balance=True, shift32=True, manual_barriers=True, fp8_mma=True,
                             xwarp_split=True, ptx_words=True),
    # session 40: and the refetch issued by one warp a tile, rotating (`mosaic_pipeline`)
    "dequant_fp8xpw": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                              stop_at_length=True, balance=True, shift32=True, manual_barriers=True, fp8_mma=True,
                              xwarp_split=True, ptx_words=True, warp_fetch=True),
    # session 41: and the tile's key-scale max by one redux.sync a warp (`mosaic_kivi_fp8.scales_max`)
    "dequant_fp8xpwr": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                               stop_at_length=True, balance=True, shift32=True, manual_barriers=True, fp8_mma=True,
                               xwarp_split=True, ptx_words=True, warp_fetch=True, redux_max=True),
    # session 41: and only the tiles holding the length mask (`Options.full_tiles`)
    "dequant_fp8xpwrm": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                stop_at_length=True, balance=True, shift32=True, manual_barriers=True,
                                fp8_mma=True, xwarp_split=True, ptx_words=True, warp_fetch=True, redux_max=True,
                                full_tiles=True),
    # session 41: and B's lo words from the rest in fp16 (`Options.f16_rest`)
    "dequant_fp8xpwrmh": Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True,
                                 stop_at_length=True, balance=True, shift32=True, manual_barriers=True,
                                 fp8_mma=True, xwarp_split=True, ptx_words=True, warp_fetch=True, redux_max=True,
                                 full_tiles=True, f16_rest=True),
    "dequant_mask_s16_bal_om_s32": Options(dequant_in_a=True, lazy_sums=True, unpack="mask", scales_once=True,
                                           stop_at_length=True, balance=True, opaque_magic=True, shift32=True),
}


@dataclasses.dataclass(frozen=True)
class Fp8Options:
  """How `fp8_states` builds its step.

  tile: tokens per pipeline step (64 or 128; a multiple of the value tile). Shared memory per program
    (compiled for an H200): 128 with 2 stages 76 KB (2 programs per SM), 3 stages 108 KB (2); 64 with 2
    stages 42 KB (5), 3 stages 58 KB (3).
  stages: pipeline stages (TMA copies in flight per program; 256 x tile bytes of codes a stage).
  lag: WGMMA groups left in flight while the next slab is converted (None: all issued, then waited).
  min_share: each split takes at least this many of the live steps (the splits past them none).
  manual_barriers: Mosaic GPU's automatic barriers off; the step's commits order its shared buffers
    (as `mosaic_kivi.Options.manual_barriers`).
  lazy_sums: l kept as per-thread [TILE, N] sums, reduced once at the end.
  approx_math: ex2.approx.
  key_terms: 0, the key slabs converted to fp16 in registers (fp16 q); 2 or 3, the key tile straight from
    shared memory as an 8-bit WGMMA A operand (no loads, no conversions) against the query split into that
    many e4m3 terms (`split_e4m3`; one power-of-two scale per (sequence, KV head)), one 8-bit product per
    term. Relative logit error on random data (codes ~N(0, 40), q ~N(0, 0.13) with outlier channels):
    2 terms 6.3e-4, 3 terms 2.5e-5; fp16 q 1.9e-4, bf16 1.6e-3 (`benchmarks/split_precision.py`).
  upcast_layout: the swizzled tiles loaded in Mosaic's 8-bit upcast layout (32-bit loads), converted, then
    moved to WGMMA's 16-bit A layout (a shuffle a register pair).
  key_perm: the key tile loaded in WGMMA's 8-bit layout (each thread's four codes of a row in one 32-bit
    load) and its registers taken as the 16-bit A layout as they are: slab columns in the order `KEY_PERM`
    (within each 16), which the query's channels are put in before the kernel (a dot product over
    channels does not depend on their order). Half the key loads, no shuffles.
  swizzle: the codes TMA-copied as swizzled tiles of whole rows (keys 128 bytes, values `value_tile` bytes;
    value tiles of 16 tokens stay unswizzled); False: in [8, 16]-byte tiles, each slab whole tiles
    (session 18's first build: 271 us at B=8 32k on the H200, bound by TMA's 16-byte rows).
  fused: through `decode_attention`, the query's prep and the split merge inside the kernel
    (`fp8_attention`, `mosaic_epilogue`) where the splits are at most CLUSTER_MAX and key_terms is 0; else
    XLA's, around `fp8_states`. Off by default: timed only as the kernel alone so far. Session 21, on an
    H100 (`decode_parts/mosaic_sass_fp8_s21b_*_h100.json`), B=8 32k, us: 1 split 316.6 against 321.9 without
    the glue; 2 splits 197.2 / 197.1; 4 splits 200.8 / 200.9; 8 splits 208.3 / 203.4; 128k, 4 splits 758.5 /
    749.3 (merge "count"). Its native tests and the timing through ops (`benchmarks/runs/session21_c.sh`)
    are still to run.
  int8_prmt: INT8 caches' codes converted to fp16 by prmt / xor / sub.f16x2 (three instructions a pair,
    `mosaic_registers.int8_as_f16`) instead of Mosaic's `astype` (one I2F a code plus byte moves). FP8: no effect.
  narrow_softmax: where at most 8 of the 16 query rows hold queries (`fp8_states`' live_rows), the softmax over
    those 8 columns only (as `Options.narrow_softmax`).
  merge: with fused and splits > 1, how the splits' states meet (`MERGES`): "count" (no
    cluster: each program counts itself in a global counter, the last merges) or "cluster" (the splits of a
    (b, k) one cluster, merged by its first program after a cluster barrier). The cluster of 4 measured 36%
    slower at B=8 32k and 33% at 128k, the kernel alone (272.8 / 998.3 us; 8 splits 223.2 us, 10%) on the H100;
    why, not found.
  warp_fetch: with manual_barriers, each refetch issued by one warp a step, rotating (`mosaic_pipeline.emit`, as
    `Options.warp_fetch`). Off until timed natively.
  """
  tile: int = 128
  stages: int = 2
  lag: int | None = 1
  min_share: int = 1
  manual_barriers: bool = True
  lazy_sums: bool = True
  approx_math: bool = True
  key_terms: int = 0
  swizzle: bool = True
  upcast_layout: bool = False
  key_perm: bool = False
  fused: bool = False
  int8_prmt: bool = True
  narrow_softmax: bool = True
  merge: str = "count"
  warp_fetch: bool = False

  def __post_init__(self):
    if self.warp_fetch and not self.manual_barriers:
      raise ValueError("warp_fetch needs manual_barriers (the step's last commit frees the slot it refetches)")
    if self.tile not in (64, 128):
      raise ValueError(f"tile must be 64 or 128 tokens, got {self.tile}")
    if not 1 <= self.stages <= 4:
      raise ValueError(f"stages must be in [1, 4], got {self.stages}")
    if self.lag is not None and not 0 <= self.lag <= 8:
      raise ValueError(f"lag must be None or 0..8 WGMMA groups in flight, got {self.lag}")
    if self.min_share < 1:
      raise ValueError(f"min_share must be >= 1, got {self.min_share}")
    if self.key_terms not in (0, 2, 3):
      raise ValueError(f"key_terms must be 0 (fp16 keys), 2 or 3 (8-bit key products), got {self.key_terms}")
    if self.merge not in MERGES:
      raise ValueError(f"merge must be one of {MERGES}, got {self.merge!r}")
    if self.key_perm and (self.key_terms or not self.swizzle):
      raise ValueError(f"key_perm converts swizzled fp16 key slabs: it needs swizzle=True and key_terms=0, got "
                       f"swizzle={self.swizzle}, key_terms={self.key_terms}")

  def __str__(self):  # the fields off their defaults, as `benchmarks/mosaic_sass.py` names builds: fp8+tile=64
    return "fp8" + "".join(f"+{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                           if getattr(self, f.name) != f.default)

  @classmethod
  def parse(cls, text: str) -> "Fp8Options":
    """The inverse of `str`: 'fp8' or 'fp8+field=value+...' (ints, True / False, None)."""
    base, *edits = text.split("+")
    fields = {f.name for f in dataclasses.fields(cls)}
    if base != "fp8":
      raise ValueError(f"an Fp8Options build is 'fp8[+field=value...]', got {text!r}")
    changes = {}
    for edit in edits:
      key, _, val = edit.partition("=")
      if key not in fields:
        raise ValueError(f"{key!r} is not an Fp8Options field (one of {sorted(fields)})")
      changes[key] = {"None": None, "True": True, "False": False}.get(val, int(val) if val.lstrip("-").isdigit() else val)
    return cls(**changes)
