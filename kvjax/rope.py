"""Rotary position embeddings (RoPE), split-half convention.

The convention of Hugging Face's ``rotate_half`` and of the gemma library's
``apply_rope``: channel ``i < H/2`` pairs with ``i + H/2``. Linear position
scaling (``scale_factor``) divides positions, as Gemma 3's global layers and
HF's ``rope_type="linear"`` do. Inputs are head-major ``[B, N, T, H]`` so
queries and keys go from the projection straight into the cache layout.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

__all__ = ["apply_rope", "rope_frequencies"]


def rope_frequencies(head_dim: int, base: float) -> Float[Array, "H/2"]:
  """Inverse frequencies ``base ** (-2i / H)`` for ``i < H / 2``."""
  if head_dim % 2:
    raise ValueError(f"head_dim ({head_dim}) must be even for RoPE")
  return 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def apply_rope(x: Float[Array, "B N T H"], positions: Int[Array, "B T"], *, base: float = 10_000.0,
               scale_factor: float = 1.0) -> Float[Array, "B N T H"]:
  """Rotates `x` by its absolute `positions` (computed in f32, returned in x.dtype)."""
  if positions.shape != (x.shape[0], x.shape[2]):
    raise ValueError(f"positions must have shape [B={x.shape[0]}, T={x.shape[2]}], "
                     f"got {positions.shape}")
  if scale_factor < 1.0:
    raise ValueError(f"scale_factor must be >= 1, got {scale_factor}")
  inv = rope_frequencies(x.shape[-1], base)
  ang = (positions.astype(jnp.float32) / scale_factor)[:, None, :, None] * inv  # [B, 1, T, H/2]
  sin, cos = jnp.sin(ang), jnp.cos(ang)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
