"""In-place append for decode: quantize the new token(s) and store them into the donated cache.

`kvjax.cache.append` is already a pure scatter of the new tokens' codes and
scales (plus, for KIVI, one R-block flush and the residual rings). Under
`jax.jit(..., donate_argnums=...)` XLA aliases every cache leaf to its
output, so each scatter writes into the existing buffers: the step touches
O(T) tokens (O(R) at a KIVI key flush), never the whole cache. `decode_step`
fuses append + attend in one jitted, donated call, the shape of a real
decode step.
"""

from __future__ import annotations

import functools

import jax

from kvjax import cache as cache_lib
from kvjax import dispatch

__all__ = ["append_inplace", "decode_step"]


@functools.partial(jax.jit, donate_argnums=(0,))
def append_inplace(cache, k, v, num_new=None):
  """`kvjax.cache.append` with the cache donated: codes/scales/residuals updated in place."""
  return cache_lib.append(cache, k, v, num_new)


@functools.partial(jax.jit, donate_argnums=(3,), static_argnames=("implementation",))
def decode_step(q, k, v, cache, implementation="pallas_gpu"):
  """Appends k, v [B, K, T, H] in place, then attends q [B, N, T, H]; returns (out, cache)."""
  cache = cache_lib.append(cache, k, v)
  out = dispatch.decode_attention(q, cache, implementation=implementation)
  return out, cache
