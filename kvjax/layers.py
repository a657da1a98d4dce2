"""Small NNX layers shared by the attention module and the decoders: RMSNorm, gated MLP, embedder."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

__all__ = ["RMSNorm", "MLP", "Embedder", "softcap"]


def softcap(x: Array, cap: float | None) -> Array:
  """``cap * tanh(x / cap)`` (Gemma 2 logit soft-capping); identity when cap is None."""
  return x if cap is None else cap * jnp.tanh(x / cap)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis, computed in f32.

  ``style="gemma"``: ``x * (1 + scale)`` with `scale` initialised to 0 (Gemma,
  HF Gemma*RMSNorm); ``style="llama"``: ``x * scale`` initialised to 1.
  """

  def __init__(self, dim: int, *, style: Literal["gemma", "llama"] = "gemma", eps: float = 1e-6,
               param_dtype=jnp.float32):
    init = jnp.zeros if style == "gemma" else jnp.ones
    self.scale = nnx.Param(init((dim,), param_dtype))
    self.style = style
    self.eps = eps

  def __call__(self, x: Array) -> Array:
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    w = self.scale[...].astype(jnp.float32)
    return (y * (1.0 + w if self.style == "gemma" else w)).astype(x.dtype)


class MLP(nnx.Module):
  """Gated MLP: ``down(act(x @ gate) * (x @ up))``; weights are [in, out]."""

  def __init__(self, features: int, hidden: int, *, activation: str = "gelu_tanh",
               dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    init = nnx.initializers.lecun_normal()
    self.gate = nnx.Param(init(rngs.params(), (features, hidden), param_dtype))
    self.up = nnx.Param(init(rngs.params(), (features, hidden), param_dtype))
    self.down = nnx.Param(init(rngs.params(), (hidden, features), param_dtype))
    self.activation = activation
    self.dtype = dtype

  def __call__(self, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    x = x.astype(self.dtype)
    g = x @ self.gate[...].astype(self.dtype)
    g = jax.nn.gelu(g, approximate=True) if self.activation == "gelu_tanh" else jax.nn.silu(g)
    return (g * (x @ self.up[...].astype(self.dtype))) @ self.down[...].astype(self.dtype)


class Embedder(nnx.Module):
  """Token embedding table ``[V, D]``; `decode` gives tied logits."""

  def __init__(self, vocab_size: int, features: int, *, scale: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    # std D^-1/2: after Gemma's sqrt(D) scaling the residual stream has unit RMS, the same size
    # as each block's output, so a random-init model does not just echo its input token.
    self.embedding = nnx.Param(
        jax.random.normal(rngs.params(), (vocab_size, features), param_dtype) * features ** -0.5)
    self.scale = scale
    self.dtype = dtype

  def encode(self, tokens: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    x = jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)
    if self.scale:  # Gemma: sqrt(D) rounded to the activation dtype, as HF and gemma do
      x = x * jnp.asarray(x.shape[-1] ** 0.5, self.dtype)
    return x

  def decode(self, x: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    return x @ self.embedding[...].astype(x.dtype).T
