"""Next-token sampling: greedy, temperature, top-k, top-p (pure, jittable)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

__all__ = ["SamplingConfig", "sample", "filter_logits"]

_NEG = -1e30


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SamplingConfig:
  """How to pick the next token.

  Attributes:
    temperature: 0 is greedy (argmax); > 0 samples from ``softmax(logits / t)``.
    top_k: keep the k most likely tokens (None: all).
    top_p: keep the smallest set of most likely tokens whose probability
      reaches p (nucleus; None: all). Applied after top-k.
  """

  temperature: float = 0.0
  top_k: int | None = None
  top_p: float | None = None

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
    if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
      raise ValueError(f"top_k must be a positive int or None, got {self.top_k!r}")
    if self.top_p is not None and not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def filter_logits(logits: Float[Array, "B V"], top_k: int | None, top_p: float | None) -> Array:
  """Sets logits outside the top-k / top-p set to -inf-ish (ties at the k-th value are kept)."""
  if top_k is not None and top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, _NEG)
  if top_p is not None and top_p < 1:
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
    keep_sorted = before < top_p  # always keeps the first
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
    logits = jnp.where(keep, logits, _NEG)
  return logits


def sample(logits: Float[Array, "B V"], rng: Array, cfg: SamplingConfig) -> Int[Array, "B"]:
  """One token per row of `logits`."""
  logits = logits.astype(jnp.float32)
  if cfg.greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)
