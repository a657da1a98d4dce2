"""KIVI-2 (G=128) decode attention over a `kvjax` cache through the Mosaic GPU kernel
(`mosaic_kivi.kivi2_states`): the semantics of `kvjax.attention.decode_attention`, residual window
included. Experimental, not dispatched by `ops`.

The cache stores KIVI codes in the library's planar layout (`kvjax.packing`), not the kernel's, so
`repack` converts them: a pass over the whole cache per call, a bridge that checks the semantics end to
end until the cache stores the kernel's layout itself (`benchmarks/NOTES_gpu.md`, session 11).

Split of the work, with L = length, R = the residual length, Lq = L - L % R:
  * tokens [0, L - R): quantized keys and values: the kernel's splits;
  * the window [max(L - R, 0), L): values from the value ring (`v_res`), keys dequantized below Lq
    and from `k_res` from Lq on: one more split state computed here in XLA (R tokens);
and `decode.combine` merges all of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvjax import quant
from kvjax.formats import KIVISpec
from pallas_kernels.gpu import decode, mosaic_kivi as mk

__all__ = ["supports", "repack", "window_states", "decode_attention"]


def supports(cache) -> str | None:
  """None when the Mosaic path takes this cache, else why not."""
  fmt = cache.fmt
  if not fmt.is_kivi:
    return f"format {fmt} is not KIVI"
  k, v = fmt.key, fmt.value
  if not (isinstance(k, KIVISpec) and isinstance(v, KIVISpec) and k.bits == v.bits == 2):
    return "keys and values must both be KIVI-2"
  if k.group_size != mk.TILE or v.group_size != mk.TILE or fmt.residual != mk.TILE:
    return f"group sizes and residual must be {mk.TILE}, got {k.group_size}, {v.group_size}, {fmt.residual}"
  if cache.head_dim != 128:
    return f"head_dim must be 128, got {cache.head_dim}"
  if fmt.sink:
    return "sink tokens are not supported"
  if cache.num_layers is not None:
    return "one layer at a time (index the stacked cache)"
  return None


def repack(cache):
  """The cache's KIVI-2 arrays in the kernel's layout: (kc, ks, kz, vc, vs, vz) as `kivi2_states` takes."""
  kc = mk.pack_keys(quant.unpacked_codes(cache.k))
  vc = mk.pack_values(quant.unpacked_codes(cache.v))
  return kc, cache.k.scale, cache.k.zero, vc, cache.v.scale[..., 0], cache.v.zero[..., 0]


def _window_keys(kc, ks, kz, tok):
  """Dequantized keys [B, K, R, H] at token indices tok [B, R] from the kernel's key layout."""
  words = jnp.take_along_axis(kc, tok[:, None, :, None], axis=2)  # [B, K, R, 16]
  codes = mk.unpack_keys(words)
  g = (tok // mk.TILE)[:, None, :, None]
  s = jnp.take_along_axis(ks, g, axis=2).astype(jnp.float32)
  z = jnp.take_along_axis(kz, g, axis=2).astype(jnp.float32)
  return codes.astype(jnp.float32) * s + z


def window_states(q, cache, kc, ks, kz):
  """Split state of the residual window: q [B, K, rows, H] f32 (already x scale x log2 e)
  -> (o [B, K, 1, rows, H], m, l [B, K, 1, rows]), m in the log2 domain."""
  r = cache.fmt.residual
  lengths = cache.lengths
  start = jnp.maximum(lengths - r, 0)
  tok = start[:, None] + jnp.arange(r)[None, :]  # [B, R]
  visible = tok < lengths[:, None]
  tok = jnp.where(visible, tok, 0)
  lq = (lengths - lengths % r)[:, None]
  k_res = jnp.take_along_axis(cache.k_res.astype(jnp.float32),
                              jnp.clip(tok - lq, 0, r - 1)[:, None, :, None], axis=2)
  keys = jnp.where((tok < lq)[:, None, :, None], _window_keys(kc, ks, kz, tok), k_res)
  values = jnp.take_along_axis(cache.v_res.astype(jnp.float32), (tok % r)[:, None, :, None], axis=2)
  s = jnp.einsum("bknh,bkth->bknt", q, keys)
  s = jnp.where(visible[:, None, None, :], s, mk.NEG)
  m = jnp.max(s, axis=-1)
  p = jnp.where(visible[:, None, None, :], jnp.exp2(s - m[..., None]), 0.0)
  o = jnp.einsum("bknt,bkth->bknh", p, values)
  return o[:, :, None], m[:, :, None], jnp.sum(p, axis=-1)[:, :, None]


def decode_attention(q, cache, *, sm_scale: float | None = None, num_splits: int = 4,
                     variant: str | mk.Options = "folded_lazy", interpret: bool = False):
  """q [B, N, 1, H] -> [B, N, 1, H] attention over a KIVI-2 G=128 cache (one query token)."""
  if (why := supports(cache)) is not None:
    raise ValueError(f"cache: {why}")
  b, n, t, h = q.shape
  kh = cache.num_kv_heads
  if t != 1 or n % kh or n // kh > mk.ROWS:
    raise ValueError(f"q must be [B, N, 1, {h}] with N a multiple of the {kh} KV heads and at most "
                     f"{mk.ROWS} query heads per KV head, got {q.shape}")
  rep = n // kh
  scale = (h ** -0.5 if sm_scale is None else sm_scale) * decode.LOG2E
  qs = q.astype(jnp.float32).reshape(b, kh, rep, h) * scale  # [B, K, rep, H]
  kc, ks, kz, vc, vs, vz = repack(cache)
  q_t = jnp.pad(qs.swapaxes(-1, -2), ((0, 0), (0, 0), (0, 0), (0, mk.ROWS - rep)))
  o_t, m, l = mk.kivi2_states(q_t, jnp.maximum(cache.lengths - cache.fmt.residual, 0), kc, ks, kz, vc, vs, vz,
                              num_splits=num_splits, variant=variant, interpret=interpret)
  ow, mw, lw = window_states(qs, cache, kc, ks, kz)
  o = jnp.concatenate([o_t.swapaxes(-1, -2)[:, :, :, :rep], ow], axis=2)
  out = decode.combine(o, jnp.concatenate([m[..., :rep], mw], axis=2),
                       jnp.concatenate([l[..., :rep], lw], axis=2), rep)
  return out.reshape(b, n, 1, h).astype(q.dtype)
