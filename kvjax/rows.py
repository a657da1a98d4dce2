"""Row writes: how an append's new rows reach the cache leaves.

`kvjax.cache.append` describes what to store as a list of writes and hands it
to a writer: `scatter_writes` (XLA scatters, the reference) or the GPU's
one-kernel `pallas_kernels.gpu.write.write_rows`. Three kinds:
  `RowWrite`   rows already in their stored form (codes, scales, rings, sinks)
               for one leaf, at token rows `pos` (token-major or tiled leaves);
  `QuantRows`  per-token FP8 / INT8 keys or values still to quantize
               (`lower_quants` is the reference: `quant.quantize`, then rows);
  `KeyFlush`   KIVI keys: residual + new tokens, quantized a full R-token block
               at a time (`flush_rows` / `lower_flushes`).
A writer may quantize `QuantRows` / `KeyFlush` itself (bit-identical) or lower
them to `RowWrite`s first.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array

from kvjax import packing, quant
from kvjax.formats import FP8Spec, IntSpec, KIVISpec
from kvjax.quant import QArray

if TYPE_CHECKING:
  from kvjax.cache import KVCache

__all__ = ["RowWrite", "QuantRows", "KeyFlush", "scatter_writes", "lower_quants", "lower_flushes",
           "flush_rows", "writer_quantizes", "per_token_writes", "get_leaf", "set_leaves"]


def _scatter_tokens(dst: Array, new: Array, pos: Array) -> Array:
  """dst [B, K, S', X] <- new [B, K, n, X] at per-sequence token rows pos [B, n]; out-of-range dropped."""
  def one(d, x, p):
    return d.at[:, p].set(x.astype(d.dtype), mode="drop")
  return jax.vmap(one)(dst, new, pos)


def _scatter_tiled(dst: Array, new: Array, pos: Array, tile: int) -> Array:
  """`_scatter_tokens` into dst [B, K, S', X] stored in tiles of `tile` tokens (`RowWrite.tile`)."""
  b, k, s, x = dst.shape
  def one(d, v, p):  # d [K, S'/T, X, T], v [K, n, X], p [n]; p >= S' -> block index out of range
    return d.at[:, p // tile, :, p % tile].set(jnp.swapaxes(v, 0, 1).astype(d.dtype), mode="drop")
  return jax.vmap(one)(dst.reshape(b, k, s // tile, x, tile), new, pos).reshape(dst.shape)


def _scatter_planes(dst: Array, new: Array, pos: Array, bits: int = 2) -> Array:
  """`bits`-bit codes new [B, K, n, H] of tokens pos [B, n] into a "words" value leaf dst [B, K, S, H bits / 16]
  (`QArray.layout`), viewed as rows of one channel's 128-token tile [B, K, S H / 128, 8 bits]: token p's code
  of channel h goes, with e = p % 128 and block = `packing.word_block`, to bits `bits` ((e % block) // 16) of
  word 16 (e // block) + e % 16 in row H (p // 128) + h; other bits are kept. Each token's field is replaced
  by adding (new - old) << shift modulo 2^16: exact, and order-free when tokens of one append share words."""
  w, block = quant.WORDS_TILE, packing.word_block(bits)
  h = new.shape[-1]
  view = dst.reshape(dst.shape[0], dst.shape[1], -1, 8 * bits)
  s = view.shape[2]  # S H / 128 rows
  def one(d, c, p):  # d [K, S H / 128, 8 bits], c [K, n, H], p [n]; p >= S: dropped (rows out of range)
    rows = (p // w * h)[:, None] + jnp.arange(h)[None, :]  # [n, H]
    e = p % w
    col = (16 * (e // block) + e % 16)[:, None]
    shift = (bits * ((e % block) // 16)).astype(jnp.uint16)[None, :, None]
    old = (d[:, jnp.clip(rows, 0, s - 1), col] >> shift) & jnp.uint16(2 ** bits - 1)  # [K, n, H]
    delta = (c.astype(jnp.uint16) - old) << shift
    return d.at[:, rows, col].add(delta, mode="drop")
  return jax.vmap(one)(view, new, pos).reshape(dst.shape)


@dataclasses.dataclass(frozen=True)
class RowWrite:
  """One append's store into a cache leaf: `new` ``[B, K, n, X...]`` at token rows `pos` ``[B, n]``
  of the leaf viewed as ``[B, K, S', X...]`` (`view`); rows outside ``[0, S')`` are dropped.

  `leaf` names the cache leaf ("k.codes", "v.scale", "k.zero", "v_res", "k_sink", ...).
  `tile` > 0: the leaf is stored in tiles of `tile` tokens (`QArray.tile`): token p's X elements
  go to column ``p % tile`` of tile ``p // tile``, viewed ``[B, K, S' / tile, X, tile]``.
  `planes`: 0, or the code width (2 or 4) of a leaf of "words" KIVI value codes (`QArray.layout`); `new`
  is then the tokens' codes ``[B, K, n, 128]``, each stored in its bit plane (`_scatter_planes`).
  """

  leaf: str
  view: tuple[int, ...]
  new: Array
  pos: Array
  tile: int = 0
  planes: int = 0


def get_leaf(cache: "KVCache", name: str) -> Array:
  obj = cache
  for part in name.split("."):
    obj = getattr(obj, part)
  return obj


def set_leaves(cache: "KVCache", values: dict[str, Array]) -> "KVCache":
  """`cache` with the named leaves replaced."""
  k_new = {n.split(".")[1]: a for n, a in values.items() if n.startswith("k.")}
  v_new = {n.split(".")[1]: a for n, a in values.items() if n.startswith("v.")}
  top = {n: a for n, a in values.items() if "." not in n}
  return cache.replace(k=cache.k.replace(**k_new), v=cache.v.replace(**v_new), **top)


def scatter_writes(cache: "KVCache", writes: Sequence["RowWrite | KeyFlush | QuantRows"]) -> "KVCache":
  """Applies `writes` with XLA scatters (in place under donation): the reference row writer.

  `QuantRows` and a `KeyFlush` are quantized here (`lower_quants`, `flush_rows`), then stored
  like the other rows.
  """
  cache, writes = lower_flushes(cache, lower_quants(cache, writes))
  out = {}
  for w in writes:
    leaf = out.get(w.leaf, get_leaf(cache, w.leaf))
    scatter = (functools.partial(_scatter_planes, bits=w.planes) if w.planes else
               functools.partial(_scatter_tiled, tile=w.tile) if w.tile else _scatter_tokens)
    out[w.leaf] = scatter(leaf.reshape(w.view), w.new, w.pos).reshape(leaf.shape)
  return set_leaves(cache, out)


def _write_per_token(old: QArray, new: QArray, pos: Array, role: str) -> list[RowWrite]:
  """Writes of the codes of `new` (and its per-token scales, if any) at token rows `pos`."""
  names = ["codes"]
  if not (old.scale is None or (isinstance(old.spec, FP8Spec) and old.spec.static)):
    names += ["scale"] + ([] if old.zero is None else ["zero"])
  if old.layout == "words":  # codes into their bit planes of the transposed tiles
    return [RowWrite(f"{role}.codes", old.codes.shape, quant.unpacked_codes(new), pos, planes=old.spec.bits)] + [
        RowWrite(f"{role}.{n}", getattr(old, n).shape, getattr(new, n), pos) for n in names[1:]]
  return [RowWrite(f"{role}.{n}", getattr(old, n).shape, getattr(new, n), pos,
                   tile=old.tile if n == "codes" else 0) for n in names]


@dataclasses.dataclass(frozen=True)
class QuantRows:
  """One append's keys or values (`role` "k" / "v"), left to the writer to quantize per token
  (`writer_quantizes`):
  raw rows `new` ``[B, K, n, H]`` at token rows `pos` ``[B, n]``. `lower_quants` is the reference
  (`quant.quantize`, then the codes and scales as `RowWrite`s); the GPU writer does it in-kernel."""

  role: str
  new: Array
  pos: Array


def writer_quantizes(q: QArray) -> bool:
  """Whether `append` hands `q`'s new rows to the writer unquantized (`QuantRows`): dynamic FP8 and
  INT8 with 16-bit per-token scales, and KIVI values (per token, G = H or G-channel groups) in the "words"
  layout, whose rounding (`quant.fp8_div`, `quant.div_round`) is exact."""
  spec = q.spec
  per_token = ((isinstance(spec, FP8Spec) and not spec.static) or (isinstance(spec, IntSpec) and spec.bits == 8)
               or (isinstance(spec, KIVISpec) and spec.axis == "channel" and q.layout == "words"
                   and quant.WORDS_TILE % spec.group_size == 0))  # a token's groups within its row
  return per_token and quant.exact_rounding(spec)


def lower_quants(cache: "KVCache", writes: Sequence) -> list:
  """`writes` with each `QuantRows` replaced by its quantized codes' and scales' `RowWrite`s."""
  out = []
  for w in writes:
    if isinstance(w, QuantRows):
      old = getattr(cache, w.role)
      out += _write_per_token(old, quant.quantize(w.new, old.spec), w.pos, w.role)
    else:
      out.append(w)
  return out


def per_token_writes(old: QArray, x: Array, pos: Array, role: str) -> list:
  """An append's writes of raw per-token rows x [B, K, n, H] into `old` (the cache's k or v): a
  `QuantRows` where the writer may quantize (`writer_quantizes`), else the quantized rows."""
  if writer_quantizes(old):
    return [QuantRows(role, x, pos)]
  return _write_per_token(old, quant.quantize(x, old.spec, scale=old.scale, block=old.block or None), pos, role)


def _without_sinks(blocks: Array, first: Array, sink: int) -> Array:
  """Key blocks [B, K, n, R, H] starting at token first[b] with the sink tokens (positions < sink,
  read from their bf16 copy) replaced by the first non-sink token of their block, so an outlier
  sink key does not widen its KIVI group's min/max for the tokens that are read quantized."""
  r_len = blocks.shape[3]
  start = first[:, None] + jnp.arange(blocks.shape[2])[None] * r_len  # [B, n] block starts
  pos = start[..., None] + jnp.arange(r_len)  # [B, n, R]
  src = jnp.clip(sink - start, 0, r_len - 1)  # row of the first non-sink token (or the last row)
  repl = jnp.take_along_axis(blocks, src[:, None, :, None, None], axis=3)  # [B, K, n, 1, H]
  return jnp.where((pos < sink)[:, None, :, :, None], repl, blocks)


@dataclasses.dataclass(frozen=True)
class KeyFlush:
  """One append's KIVI keys, left to the writer to quantize.

  The block buffer is the residual ``k_res`` (its first ``r = lengths % R``
  slots) followed by `new` ``[B, K, T, H]`` (the first `count` ``[B]`` of them),
  with `lengths` ``[B]`` the lengths before the append. Every full R-token
  block is quantized as `quant.quantize` does (groups of G tokens per channel)
  into "k.codes" / "k.scale" / "k.zero" at block ``lengths // R + i``; "k_res"
  gets the tokens past the last full block, other slots zero. `flush_rows` is
  the reference.
  """

  new: Array
  count: Array
  lengths: Array


def flush_rows(cache: KVCache, f: KeyFlush) -> tuple[list[RowWrite], Array]:
  """A `KeyFlush` as XLA computes it: the quantized blocks' `RowWrite`s and the new ``k_res``."""
  fmt, r_len = cache.fmt, cache.fmt.residual
  k_new, count, lengths = f.new, f.count, f.lengths
  b, h, n, d = k_new.shape
  r = lengths % r_len
  n_blocks = (r_len + n) // r_len  # most blocks one append can complete
  buf = jnp.zeros((b, h, (n_blocks + 1) * r_len, d), cache.k_res.dtype)
  buf = buf.at[:, :, :r_len].set(cache.k_res)
  j = jnp.arange(n)
  pos = jnp.where(j[None] < count[:, None], r[:, None] + j[None], buf.shape[2])
  buf = _scatter_tokens(buf, k_new, pos)
  m = r + count
  full = m // r_len
  blocks = buf[:, :, : n_blocks * r_len].reshape(b, h, n_blocks, r_len, d)
  if fmt.sink:
    blocks = _without_sinks(blocks, lengths - r, fmt.sink)
  qb = quant.quantize(blocks.astype(jnp.float32), fmt.key, block=r_len, layout=cache.k.layout)
  # Store block i at block index Lq / R + i when i < full; others dropped.
  n_stored = cache.capacity // r_len
  blk = jnp.arange(n_blocks)
  dest = jnp.where(blk[None] < full[:, None], (lengths - r)[:, None] // r_len + blk[None], n_stored)

  writes = [RowWrite(f"k.{n}", (b, h, n_stored, -1, getattr(qb, n).shape[-1]), getattr(qb, n), dest)
            for n in ("codes", "scale", "zero")]
  start = full * r_len
  res = jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, r_len, axis=1))(buf, start)
  keep = jnp.arange(r_len)[None, :] < (m - start)[:, None]
  res = jnp.where(keep[:, None, :, None], res, 0).astype(cache.k_res.dtype)
  return writes, res


def lower_flushes(cache: KVCache, writes: Sequence["RowWrite | KeyFlush"]) -> tuple[KVCache, list[RowWrite]]:
  """`writes` with each `KeyFlush` replaced by its `flush_rows`; the cache gets the new ``k_res``."""
  rows = []
  for w in writes:
    if isinstance(w, KeyFlush):
      flushed, k_res = flush_rows(cache, w)
      rows += flushed
      cache = cache.replace(k_res=k_res)
    else:
      rows.append(w)
  return cache, rows
