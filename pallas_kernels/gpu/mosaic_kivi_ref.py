"""The Mosaic GPU KIVI-2 kernel's code layouts (`pack_keys`, `pack_values`: the cache's "words" layout) and
its jnp reference (`reference_states`), beside `mosaic_kivi.kivi2_states` (which re-exports them).

Layouts (H = 128 or 256 channels):
  * keys  [B, K, S, H / 8] uint16: token rows; word 16 t + j holds channels 128 t + j + 16 m (m = 0..7) at
    bits 2m, so k-slab i (channels 16 i ..) is plane i % 8 of word tile i // 8;
  * values [B, K, S / 128, H, 16] uint16: per 128-token tile, channel rows; word j holds the tile's
    tokens j + 16 m at bits 2m (the tile transposed, as the FP8 / INT8 tiled value layout);
  * key scale / zero [B, K, S / 128, H] per channel and 128-token group; value scale / zero [B, K, S]
    per token (G = H = 128), [B, K, S, 2] at H = 256 (per token and 128 channels); at G=32 [B, K, S / 32, H]
    and [B, K, S, H / 32];
  * 4-bit codes: H / 4 words a key row, 32 a value row; word 16 t + j holds elements 64 t + j + 16 m
    (m = 0..3) at bits 4m (`kvjax.packing.pack_words(bits=4)`), so k-slab 4 t + m is plane m of tile t.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kvjax import packing

__all__ = ["TILE", "NEG", "pack_keys", "unpack_keys", "pack_values", "reference_states"]

TILE = 128    # tokens per value tile = the kernel's pipeline step
NEG = -1e30


def pack_keys(codes, bits: int = 2):
  """Key codes [B, K, S, H] (0..2^bits - 1) -> [B, K, S, H bits / 16] uint16 (2-bit: word 16 t + j holds
  channels 128 t + j + 16 m; 4-bit: 64 t + j + 16 m): `kvjax.packing.pack_words`, the cache's "words" key
  layout."""
  return packing.pack_words(codes, bits)


def unpack_keys(words, bits: int = 2):
  """Inverse of `pack_keys`: [..., H bits / 16] uint16 -> codes [..., H] uint8."""
  return packing.unpack_words(words, bits)


def pack_values(codes, bits: int = 2):
  """Value codes [B, K, S, H] -> [B, K, S / 128, H, 128 bits / 16] uint16 (word j: tile tokens j + 16 m, as
  `pack_keys` along the tile's tokens): the cache's "words" value layout (`kvjax.quant.words_layout`) viewed
  per tile."""
  b, k, s, h = codes.shape
  tiles = codes.reshape(b, k, s // TILE, TILE, h).swapaxes(-1, -2)  # [.., tile, H, 128 tokens]
  return packing.pack_words(tiles, bits)


@functools.partial(jax.jit, static_argnames="num_splits")
def reference_states(q_t, lengths, k_codes, ks, kz, v_codes, vs, vz, *, num_splits: int):
  """jnp reference of `kivi2_states` from the unpacked codes [B, K, S, H] (0..3), f32 throughout (G=128 or
  32, from the shape of ks)."""
  f32 = lambda x: x.astype(jnp.float32)
  b, kh, s, h = k_codes.shape
  group = s // ks.shape[2]
  g = jnp.arange(s) // group
  kf = f32(k_codes) * f32(ks)[:, :, g] + f32(kz)[:, :, g]  # [B, K, S, H]
  per_channel = (lambda x: jnp.repeat(f32(x), group, axis=-1)) if vs.ndim == 4 else (lambda x: f32(x)[..., None])
  vf = f32(v_codes) * per_channel(vs) + per_channel(vz)
  sc = jnp.einsum("bksh,bkhn->bksn", kf, f32(q_t))
  ok = (jnp.arange(s)[None, :] < lengths[:, None])[:, None, :, None]  # [B, 1, S, 1]
  sc = jnp.where(ok, sc, NEG).reshape(b, kh, num_splits, s // num_splits, -1)
  m = jnp.max(sc, axis=3)
  p = jnp.where(ok.reshape(b, 1, num_splits, -1, 1), jnp.exp2(sc - m[:, :, :, None]), 0.0)
  o = jnp.einsum("bkjsh,bkjsn->bkjhn", vf.reshape(b, kh, num_splits, s // num_splits, h), p)
  return o, m, jnp.sum(p, axis=3)
