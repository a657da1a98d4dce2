"""Per-layer bit widths chosen from calibration sensitivity.

`layer_sensitivity` measures, on calibration text, how much the held-out
loss rises when one layer alone stores its cache in the low-precision format
(the others stay in the base format). `assign_formats` then gives the
`num_high` most sensitive layers the higher-precision format. The result is a
per-layer format tuple that `Decoder.init_cache`, `generate` and
`evaluate.score_tail` accept.
"""

from __future__ import annotations

import numpy as np

from kvjax import formats as formats_lib
from kvjax.formats import KVFormat
from kvjax.quality.evaluate import score_tail

__all__ = ["layer_sensitivity", "assign_formats"]


def layer_sensitivity(model, tokens, split: int, low: KVFormat, base: KVFormat | None = None, *,
                      chunk: int = 1024) -> np.ndarray:
  """Mean NLL increase [L] when only layer i uses `low` (others `base`, default bf16)."""
  base = base or formats_lib.bf16()
  n = model.cfg.num_layers
  ref = score_tail(model, tokens, split, (base,) * n, chunk=chunk)[0].mean()
  out = np.zeros(n)
  for i in range(n):
    fmts = [base] * n
    fmts[i] = low
    out[i] = score_tail(model, tokens, split, tuple(fmts), chunk=chunk)[0].mean() - ref
  return out


def assign_formats(sensitivity: np.ndarray, high: KVFormat, low: KVFormat,
                   num_high: int) -> tuple[KVFormat, ...]:
  """`high` for the `num_high` most sensitive layers, `low` for the rest."""
  sensitivity = np.asarray(sensitivity)
  if not 0 <= num_high <= len(sensitivity):
    raise ValueError(f"num_high must be in [0, {len(sensitivity)}], got {num_high}")
  top = set(np.argsort(-sensitivity)[:num_high].tolist())
  return tuple(high if i in top else low for i in range(len(sensitivity)))
