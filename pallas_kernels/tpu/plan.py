"""What the TPU decode kernel can run, and how: a static plan per (format, shape).

`make_plan` inspects the query and cache *shapes and format* (never values),
so the plan, and with it the compiled kernel, is the same at every decode
step: lengths only ever reach the kernel as scalar-prefetched arrays.

Anything the kernel cannot do raises `NotImplementedError` with the rule that
failed, before Mosaic sees the kernel; `kvjax.dispatch` then falls back to the
XLA reference (and warns when asked to). The rules (README "Fallback rules"):
  * one layer's cache (stacked caches: use ``cache.layer(i)`` or scan);
  * ``head_dim % 128 == 0`` (the TPU lane width);
  * no float16 anywhere (codes, scales, residual window): bf16 / f32 only;
  * keys and values both plain (bf16/f32/FP8/INT8) or both packed (INT4,
    KIVI): the two families read tokens in different orders;
  * a block size exists: ``capacity % block == 0`` with the (8, 128) tiling
    rules below, or the whole capacity fits one block (<= 4096 tokens);
  * KIVI: ``R % (32 * codes_per_byte) == 0``, ``G % 32 == 0`` and G a divisor
    or a multiple of the per-plane width (``R / n`` tokens for keys,
    ``H / n`` channels for values) -- true for every preset.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from kvjax.formats import FP8Spec, IntSpec, KIVISpec, Passthrough

__all__ = ["Plan", "make_plan", "choose_block"]

LANES = 128
MAX_SINGLE_BLOCK = 4096


@dataclasses.dataclass(frozen=True)
class Plan:
  """Static description of one kernel instance."""

  kind: str          # "plain" (bf16/f32/FP8/INT8, natural token order), "int4", "kivi"
  batch: int
  kv_heads: int
  rep: int           # query heads per KV head
  num_queries: int   # T
  head_dim: int      # H
  capacity: int      # S
  block: int         # tokens per grid step
  key_token_scale: bool    # per-token key scales (FP8 "token", INT8, INT4)
  value_token_scale: bool  # per-token value scales
  bits: int = 8            # sub-byte width (INT4: 4, KIVI: 2 or 4)
  group: int = 0           # KIVI G
  residual: int = 0        # KIVI R
  sm_scale: float = 1.0
  logit_softcap: float | None = None
  window: int | None = None

  @property
  def rows(self) -> int:
    """Query rows per KV head: the rep query heads x T tokens (GQA packing)."""
    return self.rep * self.num_queries

  @property
  def num_blocks(self) -> int:
    return self.capacity // self.block

  @property
  def per_word(self) -> int:
    """Codes per byte (n)."""
    return 8 // self.bits

  @property
  def planes(self) -> int:
    """Channel planes of the value codes (and of the INT4 key codes)."""
    return self.per_word if self.kind in ("int4", "kivi") else 1

  @property
  def key_planes(self) -> int:
    return 2 if self.kind == "int4" else 1

  @property
  def class_order(self) -> bool:
    """Tokens are visited as 4 classes (t % 4) because 4 byte rows share a 32-bit word."""
    return self.kind != "plain"


def _kind(spec) -> str:
  if isinstance(spec, KIVISpec):
    return "kivi"
  if isinstance(spec, IntSpec) and spec.bits == 4:
    return "int4"
  return "plain"


def _dtypes(fmt):
  for spec in (fmt.key, fmt.value):
    if isinstance(spec, Passthrough):
      yield spec.dtype
    else:
      yield spec.scale_dtype
  if fmt.is_kivi:
    yield fmt.residual_dtype


def _block_ok(plan_kind: str, s: int, bs: int, group: int, residual: int) -> bool:
  if s % bs or bs % 32:
    return False
  full = bs == s
  if plan_kind == "plain":
    return full or bs % LANES == 0
  # class-ordered per-token scales are [.., 4, S / 4]: bs / 4 lanes per block.
  if not (full or bs % (4 * LANES) == 0):
    return False
  if plan_kind == "kivi":
    return bs % residual == 0 and (full or (bs // group) % 8 == 0)
  return True


def choose_block(kind: str, capacity: int, group: int = 0, residual: int = 0,
                 requested: int | None = None) -> int:
  """Tokens per grid step: the first candidate that respects the (8, 128) tiling rules."""
  if requested is not None:
    if not _block_ok(kind, capacity, requested, group, residual):
      raise NotImplementedError(
          f"block_size={requested} does not tile capacity {capacity} for the {kind} kernel "
          "(see pallas_kernels/tpu/plan.py)")
    return requested
  cands = (512, 256, 128) if kind == "plain" else (512, 1024, 2048, 4096)
  for bs in cands:
    if _block_ok(kind, capacity, bs, group, residual):
      return bs
  if capacity <= MAX_SINGLE_BLOCK and _block_ok(kind, capacity, capacity, group, residual):
    return capacity
  raise NotImplementedError(
      f"capacity {capacity} has no TPU block size for the {kind} kernel (use a multiple of "
      f"{128 if kind == 'plain' else 512} tokens)")


def make_plan(q, cache, *, sm_scale=None, logit_softcap=None, window=None,
              block_size=None) -> Plan:
  """Validates the inputs for the TPU kernel; raises NotImplementedError with the reason."""
  if cache.num_layers is not None:
    raise NotImplementedError("pallas_tpu takes one layer's cache (stacked cache given)")
  if q.ndim != 4:
    raise NotImplementedError(f"q must be [B, N, T, H], got shape {q.shape}")
  b, n, t, h = q.shape
  fmt = cache.fmt
  if fmt.sink:
    raise NotImplementedError(f"pallas_tpu: full-precision sink tokens (sink={fmt.sink})")
  if cache.v.tile:
    raise NotImplementedError(f"pallas_tpu: value codes in tiles of {cache.v.tile} tokens (the GPU "
                              "layout); make the cache with value_tile=0 or kvjax.cache.with_value_tile")
  kh = cache.num_kv_heads
  if b != cache.batch or h != cache.head_dim or n % kh:
    raise NotImplementedError(f"q shape {q.shape} does not match the cache "
                              f"(B={cache.batch}, K={kh}, H={cache.head_dim})")
  if h % LANES:
    raise NotImplementedError(f"head_dim {h} is not a multiple of the TPU lane width {LANES}")
  if "float16" in tuple(_dtypes(fmt)) or q.dtype == jnp.float16:
    raise NotImplementedError("float16 codes/scales/residuals are not supported on TPU "
                              "(use bfloat16 or float32)")
  kk, vk = _kind(fmt.key), _kind(fmt.value)
  if kk != vk:
    raise NotImplementedError(f"mixed key/value families ({kk} keys, {vk} values) are not "
                              "supported by the TPU kernel")
  kind = kk
  bits, group, residual = 8, 0, 0
  if kind == "int4":
    bits = 4
  if kind == "kivi":
    bits, group, residual = fmt.key.bits, fmt.key.group_size, fmt.residual
    npw = 8 // bits
    if fmt.value.bits != bits or fmt.value.group_size != group:
      raise NotImplementedError("KIVI keys and values must share bits and group size on TPU")
    if residual % (32 * npw) or group % 32:
      raise NotImplementedError(
          f"KIVI on TPU needs R % {32 * npw} == 0 and G % 32 == 0 (got R={residual}, G={group})")
    for width, what in ((residual // npw, "R / n"), (h // npw, "H / n")):
      if group % width and width % group:
        raise NotImplementedError(f"KIVI group size {group} must divide or be a multiple of "
                                  f"{what} = {width}")
    if cache.k.block != residual or cache.v.block != h:
      raise NotImplementedError("unexpected KIVI packing blocks (keys: R, values: head_dim)")
  if kind == "int4" and cache.k.block != h or kind == "int4" and cache.v.block != h:
    raise NotImplementedError("INT4 codes must be packed in blocks of head_dim")
  bs = choose_block(kind, cache.capacity, group, residual, block_size)
  tok = lambda spec: (isinstance(spec, FP8Spec) and not spec.static) or isinstance(spec, IntSpec)
  return Plan(kind=kind, batch=b, kv_heads=kh, rep=n // kh, num_queries=t, head_dim=h,
              capacity=cache.capacity, block=bs, key_token_scale=tok(fmt.key),
              value_token_scale=tok(fmt.value), bits=bits, group=group, residual=residual,
              sm_scale=float(h ** -0.5 if sm_scale is None else sm_scale),
              logit_softcap=None if logit_softcap is None else float(logit_softcap),
              window=None if window is None else int(window))
