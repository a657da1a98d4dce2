"""Byte accounting from the real cache arrays (codes, scales, residuals, lengths).

Every number here comes from `jax.eval_shape` of `init_cache`, so it counts
exactly what the cache allocates and never drifts from the implementation.
"""

from __future__ import annotations

import dataclasses

import jax

from kvjax import quant
from kvjax.cache import init_cache
from kvjax.formats import KVFormat

__all__ = ["ModelShape", "LLAMA3_8B", "bytes_per_sequence", "bytes_per_token",
           "marginal_bytes_per_token", "sequences_that_fit", "round_capacity"]

GIB = 1 << 30


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
  """The KV geometry of a model: layers, KV heads and head_dim."""

  num_layers: int
  num_kv_heads: int
  head_dim: int

  def __post_init__(self):
    for f in ("num_layers", "num_kv_heads", "head_dim"):
      if getattr(self, f) < 1:
        raise ValueError(f"ModelShape.{f} must be >= 1, got {getattr(self, f)}")


LLAMA3_8B = ModelShape(num_layers=32, num_kv_heads=8, head_dim=128)


def round_capacity(fmt: KVFormat, context: int) -> int:
  """Smallest valid capacity >= context (KIVI capacities are multiples of R)."""
  r = fmt.residual or 1
  return -(-context // r) * r


def bytes_per_sequence(fmt: KVFormat, context: int, shape: ModelShape = LLAMA3_8B) -> int:
  """Bytes one sequence of `context` tokens occupies over all layers, scales included.

  Static scales are shared by the batch; they are counted here per sequence
  (a few KB), which slightly overstates their cost.
  """
  cap = round_capacity(fmt, context)
  abstract = jax.eval_shape(lambda: init_cache(fmt, 1, shape.num_kv_heads, cap, shape.head_dim))
  return quant.nbytes(abstract) * shape.num_layers


def bytes_per_token(fmt: KVFormat, context: int = 32768, shape: ModelShape = LLAMA3_8B) -> float:
  """Average bytes per cached token at `context` (fixed residual windows amortized)."""
  return bytes_per_sequence(fmt, context, shape) / context


def marginal_bytes_per_token(fmt: KVFormat, shape: ModelShape = LLAMA3_8B) -> float:
  """Bytes each additional token costs (codes + its share of scales), all layers."""
  a = bytes_per_sequence(fmt, 8192, shape)
  b = bytes_per_sequence(fmt, 16384, shape)
  return (b - a) / 8192


def sequences_that_fit(fmt: KVFormat, budget_bytes: int, context: int,
                       shape: ModelShape = LLAMA3_8B) -> int:
  """How many sequences of `context` tokens fit in `budget_bytes` of cache."""
  if budget_bytes < 0:
    raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
  return int(budget_bytes // bytes_per_sequence(fmt, context, shape))
