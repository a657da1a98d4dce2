"""Synthetic keys and values with the structure of real LLM activations.

Real keys (after RoPE) have a few outlier channels 10-50x larger than the
rest and per-channel offsets; values are closer to isotropic (KIVI, KVQuant).
These generators give the core benchmarks and tests inputs where per-token
and per-channel quantization behave as they do on real models.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = ["outlier_keys", "plain_values", "queries"]


def outlier_keys(key: Array, shape: tuple[int, ...], *, num_outliers: int = 4,
                 outlier_range: tuple[float, float] = (10.0, 50.0),
                 pattern_seed: int = 0) -> Float[Array, "... S H"]:
  """Keys ``[..., S, H]`` whose `num_outliers` channels are 10-50x the rest.

  Which channels are outliers, their magnitudes and the channel offsets are a
  property of the "model" (`pattern_seed`), not of the sample (`key`), so
  calibration on one draw transfers to another, as it does on a real model.
  """
  if len(shape) < 2:
    raise ValueError(f"shape must be [..., S, H], got {shape}")
  head_dim = shape[-1]
  if not 0 <= num_outliers <= head_dim:
    raise ValueError(f"num_outliers must be in [0, head_dim={head_dim}], got {num_outliers}")
  k_noise = key
  k_chan, k_mag, k_off = jax.random.split(jax.random.PRNGKey(pattern_seed), 3)
  x = jax.random.normal(k_noise, shape, jnp.float32)
  offset = 0.5 * jax.random.normal(k_off, shape[:-2] + (1, head_dim))
  mags = jnp.ones(shape[:-2] + (1, head_dim))
  chans = jax.random.permutation(k_chan, head_dim)[:num_outliers]
  big = jax.random.uniform(k_mag, (num_outliers,), minval=outlier_range[0], maxval=outlier_range[1])
  mags = mags.at[..., chans].set(big)
  return (x + offset) * mags


def plain_values(key: Array, shape: tuple[int, ...]) -> Float[Array, "... S H"]:
  """Values ``[..., S, H]``: Gaussian with a per-token magnitude spread."""
  k1, k2 = jax.random.split(key)
  per_token = jnp.exp(0.5 * jax.random.normal(k2, shape[:-1] + (1,)))
  return jax.random.normal(k1, shape, jnp.float32) * per_token


def queries(key: Array, shape: tuple[int, ...], keys: Array | None = None,
            logit_std: float = 3.0) -> Float[Array, "B N T H"]:
  """Queries ``[B, N, T, H]``.

  Without `keys`, plain Gaussian. With `keys` ``[B, K, S, H]``, each query is
  a random cached key of its KV head plus noise (attention peaks on it, as in
  retrieval), rescaled so its logits ``q.k / sqrt(H)`` over the cache have
  standard deviation `logit_std` (a few units, as in trained models).
  """
  kq, kpick = jax.random.split(key)
  q = jax.random.normal(kq, shape, jnp.float32)
  if keys is None:
    return q
  b, n, t, h = shape
  kh = keys.shape[1]
  idx = jax.random.randint(kpick, (b, n, t), 0, keys.shape[2])
  kv_head = jnp.arange(n) // (n // kh)
  picked = keys[jnp.arange(b)[:, None, None], kv_head[None, :, None], idx]  # [B, N, T, H]
  q = picked / jnp.linalg.norm(picked, axis=-1, keepdims=True) + q / jnp.sqrt(h)
  keys_per_q = jnp.repeat(keys, n // kh, axis=1)  # [B, N, S, H]
  logits = jnp.einsum("bnth,bnsh->bnts", q, keys_per_q) / jnp.sqrt(h)
  return q * (logit_std / jnp.maximum(jnp.std(logits, axis=-1, keepdims=True), 1e-6))
