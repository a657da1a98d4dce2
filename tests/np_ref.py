"""An independent, straightforward numpy implementation of DESIGN.md section 3.

Loops and plain numpy, written from the spec rather than from kvjax's code, to
check kvjax's codes, scales, dequantized values, cache contents and attention.
Conventions (documented in kvjax.formats): scale and min stored in bf16, the
min rounded down and the scale rounded up; constant groups get scale 1;
sub-byte codes packed planar.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
TINY_BF16 = 2.0 ** -126


def bf16_directed(x: np.ndarray, up: bool) -> np.ndarray:
  """Rounds f32 to bf16, never down (up=True) or never up (up=False); returns f32."""
  x = np.asarray(x, np.float32)
  r = x.astype(BF16)
  rf = r.astype(np.float32)
  bits = r.view(np.uint16).astype(np.int32)
  neg = (bits & 0x8000) != 0
  out = bits.copy()
  if up:
    fix = rf < x
    out = np.where(fix & ~neg, bits + 1, out)
    out = np.where(fix & neg & (bits != 0x8000), bits - 1, out)
    out = np.where(fix & (bits == 0x8000), 1, out)
  else:
    fix = rf > x
    out = np.where(fix & ~neg & (bits != 0), bits - 1, out)
    out = np.where(fix & ~neg & (bits == 0), 0x8001, out)
    out = np.where(fix & neg, bits + 1, out)
  return out.astype(np.uint16).view(BF16).astype(np.float32)


def kivi_group(x: np.ndarray, bits: int):
  """Quantizes one group (1-D): returns codes, scale, min (f32 values of the bf16 stored)."""
  qmax = 2 ** bits - 1
  mn = bf16_directed(np.float32(x.min()), up=False)
  span = np.float32(np.float32(x.max()) - mn)
  if span > 0:
    # the smallest bf16 s with s * qmax >= span
    scale = max(bf16_directed(np.float32(span / np.float32(qmax)), up=True), np.float32(TINY_BF16))
    while np.float32(scale) * qmax < span:
      scale = bf16_directed(np.nextafter(np.float32(scale), np.float32(np.inf)), up=True)
  else:
    scale = np.float32(1.0)
  codes = np.round(np.clip((x.astype(np.float32) - mn) / np.float32(scale), 0, qmax)).astype(np.uint8)
  return codes, np.float32(scale), np.float32(mn)


def kivi_keys(x: np.ndarray, bits: int, group: int):
  """Per-channel key quantization of x [T, H]: groups of `group` tokens per channel."""
  t, h = x.shape
  codes = np.zeros((t, h), np.uint8)
  scale = np.zeros((t // group, h), np.float32)
  mn = np.zeros((t // group, h), np.float32)
  for g in range(t // group):
    for c in range(h):
      sl = slice(g * group, (g + 1) * group)
      codes[sl, c], scale[g, c], mn[g, c] = kivi_group(x[sl, c], bits)
  return codes, scale, mn


def kivi_values(x: np.ndarray, bits: int, group: int):
  """Per-token value quantization of x [T, H]: groups of `group` channels per token."""
  t, h = x.shape
  codes = np.zeros((t, h), np.uint8)
  scale = np.zeros((t, h // group), np.float32)
  mn = np.zeros((t, h // group), np.float32)
  for i in range(t):
    for g in range(h // group):
      sl = slice(g * group, (g + 1) * group)
      codes[i, sl], scale[i, g], mn[i, g] = kivi_group(x[i, sl], bits)
  return codes, scale, mn


def pack_planar(codes: np.ndarray, bits: int, axis: int, block: int) -> np.ndarray:
  """Byte j of each block holds elements j + i * block/n at bits [i*bits, (i+1)*bits)."""
  n = 8 // bits
  codes = np.moveaxis(codes, axis, 0)
  length = codes.shape[0]
  out = np.zeros((length // n,) + codes.shape[1:], np.uint8)
  per = block // n
  for b0 in range(0, length, block):
    for j in range(per):
      byte = np.zeros(codes.shape[1:], np.uint8)
      for i in range(n):
        byte |= (codes[b0 + j + i * per].astype(np.uint8) << (i * bits)).astype(np.uint8)
      out[b0 // n + j] = byte
  return np.moveaxis(out, 0, axis)


def kivi_cache_view(k: np.ndarray, v: np.ndarray, length: int, bits: int, group: int,
                    residual: int):
  """What attention must see for one head after `length` tokens (k, v: [T, H] in bf16 values).

  Keys: the first length - length % R tokens quantized per channel; the rest
  full precision. Values: the last R tokens full precision, the rest quantized
  per token.
  """
  k, v = k[:length].astype(np.float32), v[:length].astype(np.float32)
  nq = length - length % residual
  kk = k.copy()
  if nq:
    c, s, m = kivi_keys(k[:nq], bits, group)
    kk[:nq] = c * np.repeat(s, group, axis=0) + np.repeat(m, group, axis=0)
  vv = v.copy()
  nv = max(length - residual, 0)
  if nv:
    c, s, m = kivi_values(v[:nv], bits, group)
    vv[:nv] = c * np.repeat(s, group, axis=1) + np.repeat(m, group, axis=1)
  return kk, vv


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sm_scale: float) -> np.ndarray:
  """Softmax attention of q [N, H] over k, v [L, H] in float64; zeros when L == 0."""
  if k.shape[0] == 0:
    return np.zeros_like(q, np.float64)
  logits = q.astype(np.float64) @ k.astype(np.float64).T * sm_scale
  p = np.exp(logits - logits.max(axis=-1, keepdims=True))
  p /= p.sum(axis=-1, keepdims=True)
  return p @ v.astype(np.float64)
