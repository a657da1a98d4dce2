"""Calibration of static FP8 scales: a jitted reduction over K/V activations.

Pipeline (qwix style, each a pure function):
  1. `init_stats` / `update_stats` (jitted): per layer, per K/V, per KV head
     and channel, the running absmax and a log-spaced histogram of |x|;
     non-finite values are skipped.
  2. `compute_scales`: reduce to the format's granularity (tensor, head or
     channel) and choose the clip value: "absmax", "percentile" or "mse"
     (the clip that minimises the FP8 round-trip squared error over the
     histogram). ``scale = clip * margin / fp8_max``.
  3. `save_scales` / `load_scales`: safetensors, with the convention in the
     metadata. Our convention: ``x ~= code * scale``. Checkpoints that store
     the inverse or the absmax are converted at load time.
"""

from __future__ import annotations

import json
from typing import Iterable, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float

from kvjax.cache import static_scale_shape
from kvjax.formats import FP8_DTYPES, FP8Spec, KVFormat

__all__ = ["CalibStats", "KVScales", "init_stats", "update_stats", "calibrate", "compute_scales",
           "save_scales", "load_scales"]

# Histogram of |x|: BINS_PER_OCTAVE bins per power of two over [2^LO, 2^HI).
LO, HI, BINS_PER_OCTAVE = -24, 24, 8
NUM_BINS = (HI - LO) * BINS_PER_OCTAVE
EDGES = 2.0 ** (LO + np.arange(NUM_BINS + 1) / BINS_PER_OCTAVE)  # upper edge of bin i = EDGES[i+1]

Method = Literal["absmax", "percentile", "mse"]


@struct.dataclass
class CalibStats:
  """Running statistics. amax ``[L, 2, K, H]`` (axis 1: keys, values); hist ``[L, 2, K, H, NUM_BINS]``."""

  amax: Array
  hist: Array
  tokens: Array  # scalar int: tokens seen per sequence position summed over batches


@struct.dataclass
class KVScales:
  """Static scales for a stacked cache: ``k`` and ``v`` are ``[L, *static_scale_shape]``."""

  k: Array | None
  v: Array | None

  def as_tuple(self):
    return (self.k, self.v)


def init_stats(num_layers: int, num_kv_heads: int, head_dim: int) -> CalibStats:
  shape = (num_layers, 2, num_kv_heads, head_dim)
  return CalibStats(amax=jnp.zeros(shape, jnp.float32),
                    hist=jnp.zeros(shape + (NUM_BINS,), jnp.int32),
                    tokens=jnp.zeros((), jnp.int32))


def _bin_index(a: Array) -> Array:
  idx = jnp.floor((jnp.log2(jnp.maximum(a, 2.0 ** LO)) - LO) * BINS_PER_OCTAVE)
  return jnp.clip(idx, 0, NUM_BINS - 1).astype(jnp.int32)


@jax.jit
def update_stats(stats: CalibStats, k: Float[Array, "L B K T H"],
                 v: Float[Array, "L B K T H"]) -> CalibStats:
  """Folds one batch of per-layer keys and values into `stats` (non-finite values skipped)."""
  if k.shape != v.shape or k.ndim != 5:
    raise ValueError(f"k and v must both be [L, B, K, T, H], got {k.shape} and {v.shape}")
  if k.shape[0] != stats.amax.shape[0] or k.shape[2:3] + k.shape[4:] != stats.amax.shape[2:]:
    raise ValueError(f"activations {k.shape} do not match stats for [L, 2, K, H] = {stats.amax.shape}")
  x = jnp.stack([k, v], axis=1).astype(jnp.float32)  # [L, 2, B, K, T, H]
  finite = jnp.isfinite(x)
  a = jnp.where(finite, jnp.abs(x), 0.0)
  amax = jnp.maximum(stats.amax, jnp.max(a, axis=(2, 4)))
  # One-hot histogram, summed over batch and tokens: [L, 2, K, H, NUM_BINS].
  idx = jnp.moveaxis(_bin_index(a), (2, 4), (-2, -1))  # [L, 2, K, H, B, T]
  w = jnp.moveaxis(finite & (a > 0), (2, 4), (-2, -1)).astype(jnp.int32)
  idx = idx.reshape(idx.shape[:4] + (-1,))
  w = w.reshape(w.shape[:4] + (-1,))
  counts = jax.vmap(jax.vmap(jax.vmap(jax.vmap(
      lambda i, ww: jnp.zeros(NUM_BINS, jnp.int32).at[i].add(ww)))))(idx, w)
  return CalibStats(amax=amax, hist=stats.hist + counts,
                    tokens=stats.tokens + k.shape[1] * k.shape[3])


def calibrate(batches: Iterable[tuple[Array, Array]], num_layers: int, num_kv_heads: int,
              head_dim: int) -> CalibStats:
  """Reduces an iterable of ``(k, v)`` batches, each ``[L, B, K, T, H]``, to `CalibStats`."""
  stats = init_stats(num_layers, num_kv_heads, head_dim)
  for k, v in batches:
    stats = update_stats(stats, jnp.asarray(k), jnp.asarray(v))
  return stats


def _reduce_axes(granularity: str) -> tuple[int, ...]:
  # stats per layer are [K, H]; reduce to the granularity.
  return {"tensor": (0, 1), "head": (1,), "channel": ()}[granularity]


def _percentile_clip(hist: np.ndarray, amax: np.ndarray, q: float) -> np.ndarray:
  cdf = np.cumsum(hist, axis=-1)
  total = cdf[..., -1:]
  idx = np.argmax(cdf >= np.maximum(total * q / 100.0, 1), axis=-1)
  return np.minimum(EDGES[idx + 1], amax)


def _mse_clip(hist: np.ndarray, amax: np.ndarray, spec: FP8Spec, num_candidates: int = 48):
  """Clip in [amax / 8, amax] minimising the FP8 round-trip error over the histogram.

  Each bin is represented by its geometric centre, except that the maximum
  itself is counted exactly (it is the value clipping hurts most).
  """
  centers = np.sqrt(EDGES[:-1] * EDGES[1:])
  ratios = 2.0 ** (-3 * np.arange(num_candidates)[::-1] / (num_candidates - 1))  # 1/8 .. 1
  clips = amax[..., None] * ratios  # [..., C]
  top = np.asarray(_bin_index(jnp.asarray(amax)))
  hist = hist.astype(np.float32) - (np.arange(NUM_BINS) == top[..., None]) * (amax[..., None] > 0)
  scale = jnp.asarray(np.maximum(clips, 1e-30) / spec.max)[..., None]  # [..., C, 1]
  x = jnp.concatenate([jnp.broadcast_to(jnp.asarray(centers, jnp.float32), amax.shape + (NUM_BINS,)),
                       jnp.asarray(amax, jnp.float32)[..., None]], axis=-1)[..., None, :]
  weights = jnp.concatenate([jnp.asarray(np.maximum(hist, 0)), jnp.ones(amax.shape + (1,))], axis=-1)
  q = jnp.clip(x / scale, -spec.max, spec.max).astype(FP8_DTYPES[spec.dtype]).astype(jnp.float32)
  err = (q * scale - x) ** 2  # [..., C, NB + 1]
  total = jnp.einsum("...cn,...n->...c", err, weights)
  best = np.asarray(jnp.argmin(total[..., ::-1], axis=-1))  # ties: the larger clip
  return np.take_along_axis(clips[..., ::-1], best[..., None], axis=-1)[..., 0]


def compute_scales(stats: CalibStats, fmt: KVFormat, *, method: Method = "absmax",
                   percentile: float = 99.99, margin: float = 1.0) -> KVScales:
  """Static scales for `fmt` (``scale = clip * margin / fp8_max``) from `stats`."""
  if method not in ("absmax", "percentile", "mse"):
    raise ValueError(f"method must be 'absmax', 'percentile' or 'mse', got {method!r}")
  if not 0 < percentile <= 100:
    raise ValueError(f"percentile must be in (0, 100], got {percentile}")
  if margin <= 0:
    raise ValueError(f"margin must be > 0, got {margin}")
  amax_all = np.asarray(stats.amax)
  hist_all = np.asarray(stats.hist)
  num_layers, _, heads, head_dim = amax_all.shape
  out = []
  for role, spec in ((0, fmt.key), (1, fmt.value)):
    if not (isinstance(spec, FP8Spec) and spec.static):
      out.append(None)
      continue
    axes = _reduce_axes(spec.granularity)
    amax = amax_all[:, role].max(axis=tuple(a + 1 for a in axes), keepdims=True) if axes else amax_all[:, role]
    hist = hist_all[:, role].sum(axis=tuple(a + 1 for a in axes), keepdims=True) if axes else hist_all[:, role]
    if method == "absmax":
      clip = amax
    elif method == "percentile":
      clip = _percentile_clip(hist, amax, percentile)
    else:
      clip = _mse_clip(hist, amax, spec)
    clip = np.where(clip > 0, clip, 1.0)  # never-seen channels: unit clip, no zero scale
    scale = (clip * margin / spec.max).astype(np.float32)  # [L, K or 1, H or 1]
    shape = static_scale_shape(spec, heads, head_dim)
    out.append(jnp.asarray(scale.reshape((num_layers,) + shape)))
  return KVScales(k=out[0], v=out[1])


def save_scales(path: str, scales: KVScales, fmt: KVFormat) -> None:
  """Writes scales to a safetensors file (convention: x ~= code * scale)."""
  from safetensors.numpy import save_file
  tensors = {name: np.asarray(a, np.float32) for name, a in (("k_scale", scales.k), ("v_scale", scales.v))
             if a is not None}
  meta = {"format": fmt.name, "convention": "multiply", "granularity": json.dumps(
      [getattr(fmt.key, "granularity", None), getattr(fmt.value, "granularity", None)])}
  save_file(tensors, path, metadata=meta)


def load_scales(path: str, convention: Literal["multiply", "inverse", "absmax"] | None = None,
                fp8_max: float | None = None) -> KVScales:
  """Reads scales written by `save_scales` or a checkpoint with another convention.

  Args:
    path: safetensors file with ``k_scale`` and/or ``v_scale``.
    convention: how the file stores scales; default: its metadata, else "multiply".
      "inverse" files store ``1 / scale``; "absmax" files store the clip value
      and need `fp8_max`.
    fp8_max: the FP8 maximum, for "absmax" files.
  """
  from safetensors import safe_open
  with safe_open(path, framework="numpy") as f:
    meta = f.metadata() or {}
    arrays = {k: f.get_tensor(k) for k in f.keys()}
  convention = convention or meta.get("convention", "multiply")
  if convention not in ("multiply", "inverse", "absmax"):
    raise ValueError(f"convention must be 'multiply', 'inverse' or 'absmax', got {convention!r}")
  if convention == "absmax" and fp8_max is None:
    raise ValueError("convention='absmax' needs fp8_max (448 for e4m3, 57344 for e5m2)")

  def convert(a):
    if a is None:
      return None
    a = a.astype(np.float32)
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
      raise ValueError(f"scales in {path} must be finite and > 0")
    if convention == "inverse":
      a = 1.0 / a
    elif convention == "absmax":
      a = a / fp8_max
    return jnp.asarray(a)

  return KVScales(k=convert(arrays.get("k_scale")), v=convert(arrays.get("v_scale")))
