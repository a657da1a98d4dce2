"""Sharding the quantized cache over a device mesh: batch and KV heads.

Every cache leaf is head-major with the batch first (``[B, K, ...]``; a
stacked cache adds a leading layer axis), so one rule covers codes, scales,
KIVI minima and residuals: the batch axis goes to `batch_axis`, the KV-head
axis to `head_axis`; broadcast axes (static FP8 scales ``[1, K|1, 1, H|1]``)
and `lengths` ``[B]`` follow the same rule where their size matches. Decode
needs no cross-device traffic for attention: each device owns whole KV heads
of whole sequences (GQA query heads of a KV head live with it).

  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  caches = kvjax.sharding.shard_caches(caches, mesh)
  step = jax.jit(decode_step, out_shardings=(logits_sh, kvjax.sharding.cache_shardings(caches, mesh)))
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kvjax.cache import KVCache

__all__ = ["cache_shardings", "shard_caches", "batch_sharding"]


def _spec(shape, offset: int, b: int, k: int, mesh: Mesh, batch_axis, head_axis) -> P:
  parts = [None] * len(shape)
  if batch_axis is not None and len(shape) > offset and shape[offset] == b and b % mesh.shape[batch_axis] == 0:
    parts[offset] = batch_axis
  if (head_axis is not None and len(shape) > offset + 1 and shape[offset + 1] == k
      and k % mesh.shape[head_axis] == 0):
    parts[offset + 1] = head_axis
  return P(*parts)


def cache_shardings(cache, mesh: Mesh, *, batch_axis: str | None = "data",
                    head_axis: str | None = "model"):
  """A pytree of `NamedSharding`s matching `cache` (a `KVCache` or a tuple/list/dict of them).

  Raises:
    ValueError: when the batch or KV-head count is not divisible by its mesh axis.
  """
  if not isinstance(cache, KVCache):
    return jax.tree_util.tree_map(lambda c: cache_shardings(c, mesh, batch_axis=batch_axis,
                                                            head_axis=head_axis),
                                  cache, is_leaf=lambda x: isinstance(x, KVCache))
  b, k = cache.batch, cache.num_kv_heads
  for name, n, axis in (("batch", b, batch_axis), ("num_kv_heads", k, head_axis)):
    if axis is not None and n % mesh.shape[axis]:
      raise ValueError(f"{name} ({n}) must be divisible by the size of mesh axis {axis!r} "
                       f"({mesh.shape[axis]})")
  off = 0 if cache.num_layers is None else 1

  def one(leaf):
    if leaf.ndim == off + 1:  # lengths [B] (or [L, B])
      return NamedSharding(mesh, _spec(leaf.shape, off, b, -1, mesh, batch_axis, None))
    return NamedSharding(mesh, _spec(leaf.shape, off, b, k, mesh, batch_axis, head_axis))

  return jax.tree_util.tree_map(one, cache)


def shard_caches(cache, mesh: Mesh, *, batch_axis: str | None = "data",
                 head_axis: str | None = "model"):
  """`jax.device_put`s `cache` (or a collection of caches) onto `mesh` per `cache_shardings`."""
  return jax.device_put(cache, cache_shardings(cache, mesh, batch_axis=batch_axis,
                                               head_axis=head_axis))


def batch_sharding(mesh: Mesh, ndim: int, *, batch_axis: str | None = "data") -> NamedSharding:
  """Sharding of a ``[B, ...]`` activation (tokens, logits) along the batch axis."""
  return NamedSharding(mesh, P(batch_axis, *([None] * (ndim - 1))))
